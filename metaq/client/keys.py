"""Find messages by key with the broker's key index (docs/messaging.md "Key index"): ``lookup``.

A message's keys are the ``KEYS`` words (the metaq ``Message(key=...)`` is sent as ``KEYS``; RocketMQ producers
set them) and its ``UNIQ_KEY``. Each broker indexes what it stores, so ``lookup`` asks one broker (a
``BrokerConnection``, e.g. ``consumer.connection(broker_id, read=True)``) and goes through every page of the
broker's text ``lookup`` (``limits.MAX_KEY_QUERY_RESULTS`` messages a page), newest first. The broker indexes a
message once it is flushed: one just sent may need a flush interval to show.
"""

from metaq import errors
from metaq.keys import limits as keys_limits
from metaq.client.message import Message
from metaq.client.replay import to_timestamp_ms
from metaq.client.replies import reply_error
from metaq.protocol import events as ev
from metaq.keys.wire import decode_lookup_body
from metaq.protocol.message import Record

__all__ = ["lookup"]

#: Pages one ``lookup`` reads at most (10 million messages of one key at 64 a page is past it: narrow the window).
MAX_PAGES = 200_000


def lookup(conn, topic, key, since=None, until=None, timeout=10.0):
    """Yield every ``Message`` of ``topic`` whose keys hold ``key`` stored within ``[since, until]`` (datetimes or
    ms since the Unix epoch; None: no bound) on the broker of ``conn``, newest first; a message's ``partition`` is
    the partition's number on that broker."""
    lo = 0 if since is None else to_timestamp_ms(since)
    hi = 2**63 - 1 if until is None else to_timestamp_ms(until)
    cursor = ""
    for _ in range(MAX_PAGES):
        reply = conn.call(ev.Lookup(topic, key, lo, hi, keys_limits.MAX_KEY_QUERY_RESULTS, cursor, 0), timeout=timeout)
        if not isinstance(reply, ev.Result) or reply.code != 200:
            raise reply_error(reply, "lookup %s %s" % (topic, key))
        page = decode_lookup_body(reply.body)
        for it in page.items:
            yield Message.from_record(topic, it.partition, it.offset, Record(it.msg_id, it.flag, it.data, it.checksum))
        if page.cursor is None:
            return
        cursor = page.cursor
    raise errors.ClientError("lookup %s %s: more than %d pages" % (topic, key, MAX_PAGES))
