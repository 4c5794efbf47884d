"""MetaQ's text protocol, the writing half: ``serialize`` an event, ``encode_result`` and ``encode_value_header``.

Split from ``metaq.protocol.text`` (which re-exports these names); the grammar is described there.
"""

from metaq.protocol import adminwire
from metaq.protocol import priority, timerwire
from metaq.protocol import topicadmin
from metaq.protocol.tags import PASSED_SUFFIX
from metaq.protocol.events import (
    Auth,
    CommitOffset,
    DelayedPut,
    Get,
    GetTags,
    IdempotentPut,
    Offset,
    OffsetAt,
    Lookup,
    Promote,
    QueryOffset,
    Put,
    Quit,
    Reply,
    Request,
    Result,
    Stats,
    Sync,
    TopicCommand,
    Transaction,
    Value,
    Version,
)

__all__ = ["serialize", "encode_result", "encode_value_header"]


def _token(text):
    """``text`` if it can be sent as one token (no space, CR or LF), else ValueError."""
    if " " in text or "\n" in text or "\r" in text:
        raise ValueError("%r cannot be sent as a protocol token" % (text,))
    return text


def _serialize_put(e):
    if e.tx_key is None:
        head = "put %s %d %d %d %d %d\r\n" % (_token(e.topic), e.partition, len(e.body), e.flag, e.checksum, e.opaque)
    else:
        head = "put %s %d %d %d %d %s %d\r\n" % (
            _token(e.topic), e.partition, len(e.body), e.flag, e.checksum, _token(e.tx_key), e.opaque,
        )
    return b"".join((head.encode("utf-8"), e.body))


def _serialize_put_delayed(e):
    head = "put_delayed %s %d %d %d %d %d %d\r\n" % (
        _token(e.topic), e.partition, len(e.body), e.flag, e.checksum, e.level, e.opaque)
    return b"".join((head.encode("utf-8"), e.body))


def _serialize_put_idem(e):
    head = "put_idem %s %d %d %d %d %d %d %d\r\n" % (
        _token(e.topic), e.partition, len(e.body), e.flag, e.checksum, e.producer_id, e.sequence, e.opaque)
    return b"".join((head.encode("utf-8"), e.body))


def _serialize_request(e):
    head = "request %s %d %d %d %d %d %d\r\n" % (
        _token(e.topic), e.partition, len(e.body), e.flag, e.checksum, e.timeout_ms, e.opaque)
    return b"".join((head.encode("utf-8"), e.body))


def _serialize_reply(e):
    return b"".join((b"reply %d %d %d %d\r\n" % (len(e.body), e.flag, e.checksum, e.opaque), e.body))


def _wait_and_expect(e):
    """`` <maxWaitMs>[ <offset>:<msgId>]`` of a get (an ``expect`` needs a wait: 0 is none), or ``""``."""
    passed = PASSED_SUFFIX if getattr(e, "passed", False) else ""  # get_tags only (events.GetTags)
    if e.expect is not None or passed:
        expect = "" if e.expect is None else "%d:%d" % e.expect
        return " %d %s%s" % (e.max_wait_ms or 0, expect, passed)
    return "" if e.max_wait_ms is None else " %d" % e.max_wait_ms


def _serialize_get(e):
    wait = _wait_and_expect(e)
    return (
        "get %s %s %d %d %d%s %d\r\n"
        % (_token(e.topic), _token(e.group), e.partition, e.offset, e.max_size, wait, e.opaque)
    ).encode("utf-8")


def _serialize_get_tags(e):
    wait = _wait_and_expect(e)
    return ("get_tags %s %s %d %d %d %s%s %d\r\n" % (_token(e.topic), _token(e.group), e.partition, e.offset,
                                                      e.max_size, _token(e.tags), wait, e.opaque)).encode("utf-8")


def _serialize_offset(e):
    return (
        "offset %s %s %d %d %d\r\n" % (_token(e.topic), _token(e.group), e.partition, e.offset, e.opaque)
    ).encode("utf-8")


def _serialize_lookup(e):
    return ("lookup %s %s %d %d %d %s %d\r\n" % (_token(e.topic), _token(e.key), e.since_ms, e.until_ms, e.max_count,
                                                 _token(e.cursor or "-"), e.opaque)).encode("utf-8")


def _serialize_offset_at(e):
    return ("offset_at %s %d %d %d\r\n" % (_token(e.topic), e.partition, e.timestamp_ms, e.opaque)).encode("utf-8")


def _serialize_commit_offset(e):
    return ("commit_offset %s %s %d %d %d\r\n" % (
        _token(e.group), _token(e.topic), e.partition, e.offset, e.opaque)).encode("utf-8")


def _serialize_query_offset(e):
    return ("query_offset %s %s %d %d\r\n" % (_token(e.group), _token(e.topic), e.partition, e.opaque)).encode("utf-8")


def _serialize_stats(e):
    # Like MetaQ's encoder, a blank item is written as an empty token: "stats  <opaque>".
    return ("stats %s %d\r\n" % (_token(e.item or ""), e.opaque)).encode("utf-8")


def _serialize_version(e):
    return b"version %d\r\n" % e.opaque


def _serialize_quit(e):
    return b"quit\r\n"


def _serialize_transaction(e):
    parts = ["transaction", _token(e.tx_key), _token(e.session_id), _token(e.tx_type)]
    if e.timeout > 0:
        parts.append(str(e.timeout))
    if e.unique_qualifier:
        parts.append(_token(e.unique_qualifier))
    parts.append(str(e.opaque))
    return (" ".join(parts) + "\r\n").encode("utf-8")


def _serialize_sync(e):
    head = "sync %s %d %d %d %d %d %d\r\n" % (
        _token(e.topic), e.partition, len(e.body), e.flag, e.msg_id, e.checksum, e.opaque,
    )
    return b"".join((head.encode("utf-8"), e.body))


def _serialize_promote(e):
    return b"promote %d %d\r\n" % (1 if e.force else 0, e.opaque)


def _serialize_auth(e):
    if e.client_nonce is None:
        return ("auth %s %d\r\n" % (_token(e.user), e.opaque)).encode("utf-8")
    return ("auth %s %s %s %d\r\n" % (_token(e.user), _token(e.client_nonce), _token(e.proof), e.opaque)).encode()


def _serialize_value(e):
    return b"".join((encode_value_header(len(e.body), e.opaque), e.body))


def _serialize_result(e):
    return encode_result(e.code, e.body, e.opaque)


_SERIALIZERS = {
    Put: _serialize_put,
    DelayedPut: _serialize_put_delayed,
    IdempotentPut: _serialize_put_idem,
    Request: _serialize_request,
    Reply: _serialize_reply,
    Get: _serialize_get,
    GetTags: _serialize_get_tags,
    Offset: _serialize_offset,
    OffsetAt: _serialize_offset_at,
    Lookup: _serialize_lookup,
    CommitOffset: _serialize_commit_offset,
    QueryOffset: _serialize_query_offset,
    Stats: _serialize_stats,
    Version: _serialize_version,
    Quit: _serialize_quit,
    Transaction: _serialize_transaction,
    Sync: _serialize_sync,
    Promote: _serialize_promote,
    TopicCommand: topicadmin.serialize,
    Auth: _serialize_auth,
    Value: _serialize_value,
    Result: _serialize_result,
}
_SERIALIZERS.update(adminwire.SERIALIZERS)  # the admin extensions (group_info, reset_offset, dlq_list, dlq_resend)
_SERIALIZERS.update(priority.SERIALIZERS)  # put_prio, get_prio
_SERIALIZERS.update(timerwire.SERIALIZERS)  # put_at, cancel, timers


def serialize(event):
    """The canonical wire bytes of ``event``.

    Put: 7 tokens (checksum always written), 8 with a tx_key. Get: 7 tokens, 8
    with max_wait_ms. Stats: ``stats <item> <opaque>``, a blank item (None or
    "") as ``stats  <opaque>``. Transaction: timeout only when > 0, qualifier
    only when not empty. Sync: 8 tokens. Raises ValueError when a text field
    holds a space, CR or LF, TypeError for a non-event.
    """
    try:
        serializer = _SERIALIZERS[type(event)]
    except KeyError:
        raise TypeError("not a text-protocol event: %r" % (event,)) from None
    return serializer(event)


def encode_result(code, body, opaque):
    """``result <code> <len> <opaque>\\r\\n<body>`` (body: bytes-like)."""
    return b"".join((b"result %d %d %d\r\n" % (code, len(body), opaque), body))


def encode_value_header(length, opaque):
    """``value <length> <opaque>\\r\\n``; the caller sends ``length`` bytes of records after it."""
    return b"value %d %d\r\n" % (length, opaque)
