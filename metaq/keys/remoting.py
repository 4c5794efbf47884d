"""QUERY_MESSAGE (12): a key's messages, and RocketMQ's view by unique id (docs/messaging.md "Key index").

The store's key index (keys/index.py) answers one page, newest first: at most ``maxNum`` messages, cut to
``limits.MAX_KEY_QUERY_RESULTS`` (and ``limits.MAX_KEY_QUERY_BYTES``), stored within ``[beginTimestamp,
endTimestamp]``; its cold pages brought in off the loop (``coldpages.walk``). A RocketMQ client views a message
by its unique id (``UNIQ_KEY``) with the same request and ``_UNIQUE_KEY_QUERY`` = true: ``maxNum`` is then ours
(RocketMQ sets its ``defaultQueryMaxNum``). The body is the stored messages one after another, as a pull's; the
header names how far the index reaches (``indexLastUpdatePhyoffset``, ``indexLastUpdateTimestamp``). Nothing
found is QUERY_NOT_FOUND, as RocketMQ answers.
"""

from metaq import limits
from metaq.keys import limits as keys_limits
from metaq.protocol.rocketmq.headers import UNIQUE_KEY_QUERY, QueryMessageHeader, decode_header
from metaq.protocol.rocketmq.mapping import message_of_record, stored_message_bytes
from metaq.protocol.rocketmq.remoting import ResponseCode, response_for
from metaq.loop.coldpages import walk


def query_message(store, cmd, host):
    """The reply to a QUERY_MESSAGE request; raises ClientError (a bad key) as the store does."""
    h = decode_header(QueryMessageHeader, cmd)
    max_num = h.max_num
    if (cmd.ext_fields or {}).get(UNIQUE_KEY_QUERY) == "true":
        max_num = keys_limits.MAX_KEY_QUERY_RESULTS
    limits.validate_topic(h.topic)
    page = walk(store.key_search(h.topic, h.key, h.begin_timestamp, h.end_timestamp, max(1, max_num))).page()
    fields = {"indexLastUpdateTimestamp": page.updated_ms, "indexLastUpdatePhyoffset": page.indexed_to}
    if not page.records:
        return response_for(cmd, ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct",
                            fields)
    body = b"".join(stored_message_bytes(message_of_record(r, host)) for r in page.records)
    return response_for(cmd, ResponseCode.SUCCESS, None, fields, body)
