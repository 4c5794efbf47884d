"""``get_tags`` (events.GetTags): one request's filtered reads, from the index units first (README "Tag filtering").

A read looks at the partition's index units from the request's offset (at most ``limits.MAX_FILTER_SCAN_UNITS``,
their cold pages brought in off the loop: ``coldpages.bring_in``) and reads only the records whose unit's tag
hash is wanted (``MessageStore.read_tagged``). Its reply's body starts with the offset to ask for next, past the
units it passed over; then, per record, its offset and its MetaQ form. When a read passes over units and finds
nothing wanted, the request's offset moves past them: with more units after them the reply is that next offset
alone (the client asks again from there at once); at the partition's end a long poll waits from there, and its
timeout answers that offset alone too (a 404 only when the request's offset never moved). A request whose expect
asks for it (``:passed``, events.GetTags) gets after that offset the id of the record just before it: the client
names that record in its next expect, so a failover that rewrote the records it passed over is found (412).
"""

from metaq.protocol.tags import OFFSET_FIELD
from metaq.protocol.text import encode_result, encode_value_header
from metaq.server.coldpages import bring_in
from metaq.server.text.expect import check_expected


class TagScan:
    """The reads of one ``get_tags``: ``read`` (the reply buffers, or None: nothing yet) and ``miss``."""

    def __init__(self, dispatcher, e, max_size):
        self.store = dispatcher.store
        self.stats = dispatcher.stats
        self.e = e
        self.max_size = max_size
        self.offset = e.offset  # moves past the units a read passed over

    def read(self):
        e, store = self.e, self.store
        check_expected(store, e)
        bring_in(store.tagged_index_ranges(e.topic, e.partition, self.offset))
        r = store.read_tagged(e.topic, e.partition, self.offset, e.filter, self.max_size, self.max_size)
        self.stats.filter_skipped_units += r.skipped
        if r.hits:
            self.stats.on_get(e.topic, False)
            body, nbytes = r.joined()
            head = self.head(r.next_offset)
            return [encode_value_header(len(head) + nbytes, e.opaque), head, body]
        moved = r.next_offset > self.offset
        self.offset = r.next_offset
        if moved and r.next_offset < store.max_offset(e.topic, e.partition):
            return [self.skipped_reply()]  # nothing wanted in a full scan, more units after it: go on from there
        return None

    def head(self, next_offset):
        """The body's start: ``next_offset``, and the id of the record before it when the request asked."""
        e = self.e
        if not e.passed:
            return OFFSET_FIELD.pack(next_offset)
        held = self.store.msg_id_at(e.topic, e.partition, next_offset - 1) if next_offset > 0 else None
        return OFFSET_FIELD.pack(next_offset) + OFFSET_FIELD.pack(-1 if held is None else held)

    def skipped_reply(self):
        """``value 8 <opaque>`` (16 with ``passed``) and the offset to ask for next: nothing wanted before it."""
        head = self.head(self.offset)
        return encode_value_header(len(head), self.e.opaque) + head

    def miss(self):
        """The reply when nothing wanted came: the offset moved past passed-over units, or a get's 404."""
        if self.offset > self.e.offset:
            return self.skipped_reply()
        return encode_result(404, b"Could not find message at position %d" % self.e.offset, self.e.opaque)
