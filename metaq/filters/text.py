"""``get_tags`` (events.GetTags): one request's filtered reads, from the index units first (docs/messaging.md "Tag
filtering").

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

from metaq.filters.wire import OFFSET_FIELD
from metaq.protocol.text import encode_result, encode_value_header
from metaq.loop.coldpages import bring_in, bring_in_record_head
from metaq.loop.expect import check_expected


class TagScan:
    """The reads of one ``get_tags``: ``read`` (the reply buffers, or None: nothing yet) and ``miss``."""

    def __init__(self, store, stats, e, max_size):
        self.store = store
        self.stats = stats
        self.e = e
        self.max_size = max_size
        self.offset = e.offset  # moves past the units a read passed over
        self.before = None  # once it moved: the id of the record before it then (-1: none held), checked again

    def read(self):
        """The reply buffers, or None. The index pages it scans and the record before its offset are brought in
        before its checks (cold ones in the pool: other greenlets run; the records it sends are read where they
        are, as a get's), nothing after: what is checked is what is read, a slave's cut happening only between
        yields. When such a cut changed the record before the offset an earlier read of this request moved to,
        what that read passed over is scanned again (the client never saw it). The record before the next offset
        was passed over, so its page may be cold: then it is brought in and the read done again (once)."""
        e, store = self.e, self.store
        redo = True
        while True:  # at most three times: one scan again after a cut, one read again after a cold page
            bring_in(store.tagged_index_ranges(e.topic, e.partition, self.offset))
            if self.before is not None:
                self.bring_in_before(self.offset)
            check_expected(store, e)
            if self.before is not None and self.held_before(self.offset) != self.before:
                self.offset, self.before = e.offset, None  # cut since it was passed over: scan it again
                continue
            r = store.read_tagged(e.topic, e.partition, self.offset, e.filter, self.max_size, self.max_size)
            need_before = r.next_offset > self.offset and (e.passed or not r.hits)
            if need_before and redo and self.bring_in_before(r.next_offset):
                redo = False
                continue  # a page was cold, and other greenlets ran meanwhile: read again, that page resident
            break
        self.stats.filter_skipped_units += r.skipped
        if r.hits:
            self.stats.on_get(e.topic, False)
            body, nbytes = r.joined()
            head = self.head(r.next_offset, self.held_before(r.next_offset) if e.passed else None)
            return [encode_value_header(len(head) + nbytes, e.opaque), head, body]
        moved = r.next_offset > self.offset
        self.offset = r.next_offset
        if moved:  # read now, with the scan: a reply after a wait names this record, and each read checks it
            self.before = self.held_before(self.offset)
        if moved and r.next_offset < store.max_offset(e.topic, e.partition):
            return [self.skipped_reply()]  # nothing wanted in a full scan, more units after it: go on from there
        return None

    def bring_in_before(self, offset):
        """The pages ``held_before(offset)`` reads, brought in off the loop when cold: the record's index unit, and
        then, named once that is resident, its header (``store.msg_id_at(..., ranges=True)``). True when one was
        cold (other greenlets ran meanwhile)."""
        if offset <= 0:
            return False
        return bring_in_record_head(self.store, self.e.topic, self.e.partition, offset - 1)

    def held_before(self, offset):
        """The id of the record before ``offset`` (-1 when none is held); read where it is (``read`` brought its
        page in)."""
        if offset <= 0:
            return -1
        held = self.store.msg_id_at(self.e.topic, self.e.partition, offset - 1)
        return -1 if held is None else held

    def head(self, next_offset, before):
        """The body's start: ``next_offset``, and ``before`` (the id of the record before it) when asked."""
        if not self.e.passed:
            return OFFSET_FIELD.pack(next_offset)
        return OFFSET_FIELD.pack(next_offset) + OFFSET_FIELD.pack(before)

    def skipped_reply(self):
        """``value 8 <opaque>`` (16 with ``passed``) and the offset to ask for next: nothing wanted before it."""
        head = self.head(self.offset, self.before)
        return encode_value_header(len(head), self.e.opaque) + head

    def miss(self):
        """The reply when nothing wanted came: the offset moved past passed-over units, or a get's 404 (also
        when a cut changed the record before that offset since it was passed over: the client asks again)."""
        e = self.e
        if self.offset > e.offset:
            self.bring_in_before(self.offset)
            if self.held_before(self.offset) == self.before:
                return self.skipped_reply()
            self.offset, self.before = e.offset, None
        return encode_result(404, b"Could not find message at position %d" % e.offset, e.opaque)
