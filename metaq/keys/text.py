"""``lookup`` on the text port (our extension, ``events.Lookup``; docs/messaging.md "Key index"): one page of a key's
messages.

The page comes from the store's key index (``keys/index.py``), its cold pages brought in off the event loop
(``coldpages.walk``), as ``offset_at`` does; the body is ``keys/wire.py``'s. A slave that may not serve reads
answers 503 with the reason.
"""

from metaq import limits
from metaq.keys.wire import encode_lookup_body
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.text import encode_result
from metaq.loop.coldpages import walk

NO_WAIT = 0


class TextKeys:
    """The ``lookup`` handler over the store and the replication roles (``read_refusal``: why reads are refused)."""

    def __init__(self, store, roles):
        self.store = store
        self.roles = roles

    def lookup(self, e, conn):
        if self.roles.read_refusal is not None:
            return encode_result(503, self.roles.read_refusal.encode(), e.opaque), NO_WAIT
        limits.validate_topic(e.topic)
        page = walk(self.store.key_search(e.topic, e.key, e.since_ms, e.until_ms, e.max_count, e.cursor)).page()
        body = encode_lookup_body(page.cursor, page.indexed_to, [
            (r.partition, r.queue_offset, r.position, r.store_ts_ms, r.msg_id, r.flag, r.data, metaq_checksum(r.data))
            for r in page.records])
        conn.pace("fetch", sum(len(r.data) for r in page.records))  # the user's fetch rate: the reply waits
        return encode_result(200, body, e.opaque), NO_WAIT
