"""MetaQ's text protocol, sans-IO: ``TextParser`` turns bytes into events, ``serialize`` turns events into bytes.

Grammar (reference ``metaq-protocol.md`` §1): a frame is one header line split
on single spaces (two spaces give an empty token, trailing empty tokens are
dropped), ended by ``\\r\\n`` or a bare ``\\n``; ``put``, ``sync``, ``value``
and ``result`` are followed directly by a body of the announced length, with
nothing after it. The grammar is symmetric, so one parser reads requests
(broker side) and replies (client side).

Differences from MetaQ's decoder, all deliberate: the command word must match exactly (``verison`` is not
``version``); empty lines are ignored; ``get`` may carry ``maxWaitMs`` and then an ``expect`` (events.Get) before
the opaque; ``put_delayed`` (a put's 7 tokens with the delay level before the opaque; ``metaq.timers.levels``),
``offset_at`` (the first offset stored at or after a time), ``lookup`` (a key's messages;
``metaq.keys.wire``), ``get_tags`` (a get filtered by tags at the broker; ``metaq.protocol.tags``), ``get_sql`` (a
get filtered by a SQL92 expression at the broker, the expression as the body; ``metaq.filters.wire``),
``put_idem`` (the producer id and sequence before it; ``metaq.idempotence.wire``), ``request`` and ``reply``
(request-reply; ``metaq.reqreply.wire``), ``put_prio`` and ``get_prio`` (consumer priorities;
``metaq.priorities.wire``), the admin commands (``metaq.admin.wire``), ``group_settings``
(``metaq.groups.wire``) are ours; integers are strict
(``-?[0-9]+``) and range-checked; and a bad line raises ``RemoteProtocolError`` while the parser stays usable (the
line is consumed and its body, if its length is known, skipped) unless the error is ``fatal`` (body length unknown
or over the limit, line over the limit, EOF inside a frame): then every later ``next_event()`` raises the same
error again.
"""

import re

from metaq import errors, limits
from metaq.errors import ClientError, RemoteProtocolError
from metaq.protocol.events import (
    DEFAULT_OPAQUE,
    Auth,
    TX_TYPES,
    UNCHECKED,
    CommitOffset,
    DelayedPut,
    Get,
    GetTags,
    Offset,
    OffsetAt,
    Promote,
    QueryOffset,
    Put,
    Quit,
    Result,
    Stats,
    Sync,
    Transaction,
    Value,
    Version,
)
from metaq.protocol.burst import scan_puts
from metaq.protocol.commands import (
    NEEDS_ADMIN,
    NEEDS_GROUP_MEMBER,
    NEEDS_HANDLER,
    NEEDS_NOTHING,
    NEEDS_SUBSCRIBER,
    NEEDS_USER,
    TextCommand,
    by_event,
    by_word,
    depends,
    fast_lines,
    register,
    token,
)
from metaq.protocol.integers import INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, TokenError, is_integer, parse_int, show
from metaq.protocol.stream import StreamParser
from metaq.protocol.tags import PASSED_SUFFIX, parse_tag_expression

__all__ = ["TextParser", "serialize", "encode_result", "encode_value_header", "error_reply", "xa_error_body",
           "parse_xa_error"]


_CHECKSUM_START = frozenset("-0123456789")
_MAX_CODE = 999
_COPY_ONCE_FROM = 64 * 1024  # bodies this large are copied through a memoryview (one copy, not two)


def _tx_key(token):
    """A transaction key as MetaQ's TransactionId.valueOf accepts it."""
    if token == "null" or token.startswith(("TX:", "XID:")):
        return token
    raise TokenError("invalid transaction key %s: expected null, TX:... or XID:..." % show(token))


def _error_opaque(tokens):
    """The opaque to answer an unparseable line with: its last token if it is an int32, else 0."""
    if tokens and is_integer(tokens[-1]):
        value = int(tokens[-1])
        if INT32_MIN <= value <= INT32_MAX:
            return value
    return 0


# Command handlers. Each gets the tokens (count already checked) and returns an
# event, or, for commands with a body, a function that builds the event from it.


#: The common 7-token put (`put topic partition len flag checksum opaque`), all ASCII:
#: matched in one step. Anything it does not match goes through the general path,
#: which accepts exactly the same lines with the same result.
_FAST_PUT = re.compile(rb"put ([!-~]+) (-1|[0-9]{1,10}) ([0-9]{1,10}) (-?[0-9]{1,10}) (-1|[0-9]{1,10}) (-?[0-9]{1,11})")


def _fast_put(raw):
    """(build, length) for a plain 7-token put line, or None to use the general path."""
    m = _FAST_PUT.fullmatch(raw)
    if m is None:
        return None
    topic, partition, length, flag, checksum, opaque = m.groups()
    partition, flag, checksum, opaque = int(partition), int(flag), int(checksum), int(opaque)
    if partition > INT32_MAX or checksum > INT32_MAX or not (INT32_MIN <= flag <= INT32_MAX
                                                             and INT32_MIN <= opaque <= INT32_MAX):
        return None
    topic = topic.decode("ascii")
    return (lambda body: Put(topic, partition, flag, body, opaque, checksum, None)), int(length)


def _parse_put(t):
    topic = t[1]
    partition = parse_int(t[2], "partition", -1, INT32_MAX)
    flag = parse_int(t[4], "flag", INT32_MIN, INT32_MAX)
    checksum, tx_key = UNCHECKED, None
    if len(t) == 7:
        if t[5][:1] in _CHECKSUM_START:
            checksum = parse_int(t[5], "checksum", UNCHECKED, INT32_MAX)
        else:
            tx_key = _tx_key(t[5])
    elif len(t) == 8:
        checksum = parse_int(t[5], "checksum", UNCHECKED, INT32_MAX)
        tx_key = _tx_key(t[6])
    opaque = parse_int(t[-1], "opaque", INT32_MIN, INT32_MAX)
    return lambda body: Put(topic, partition, flag, body, opaque, checksum, tx_key)


def _parse_put_delayed(t):
    topic = t[1]
    partition = parse_int(t[2], "partition", -1, INT32_MAX)
    flag = parse_int(t[4], "flag", INT32_MIN, INT32_MAX)
    checksum = parse_int(t[5], "checksum", UNCHECKED, INT32_MAX)
    level = parse_int(t[6], "delay level", INT32_MIN, INT32_MAX)  # the broker answers a negative level
    opaque = parse_int(t[7], "opaque", INT32_MIN, INT32_MAX)
    return lambda body: DelayedPut(topic, partition, flag, body, opaque, checksum, level)






def _parse_get(t):
    partition = parse_int(t[3], "partition", -1, INT32_MAX)
    offset = parse_int(t[4], "offset", INT64_MIN, INT64_MAX)
    max_size = parse_int(t[5], "maxSize", INT32_MIN, INT32_MAX)  # <= 0 is answered by the broker, as in MetaQ
    max_wait_ms = parse_int(t[6], "maxWaitMs", 0, INT32_MAX) if len(t) >= 8 else None
    expect = parse_expect(t[7]) if len(t) == 9 else None
    return Get(t[1], t[2], partition, offset, max_size, parse_int(t[-1], "opaque", INT32_MIN, INT32_MAX), max_wait_ms,
               expect)


def parse_expect(token):
    """``<offset>:<msgId>`` of a get's ``expect`` (events.Get): the record the client last read, and its id."""
    offset, sep, msg_id = token.partition(":")
    if not sep:
        raise TokenError("invalid expect %s: <offset>:<msgId> of the record last read" % show(token))
    return parse_int(offset, "expect offset", 0, INT64_MAX), parse_int(msg_id, "expect msgId", INT64_MIN, INT64_MAX)


def _parse_get_tags(t):
    partition = parse_int(t[3], "partition", -1, INT32_MAX)
    offset = parse_int(t[4], "offset", INT64_MIN, INT64_MAX)
    max_size = parse_int(t[5], "maxSize", INT32_MIN, INT32_MAX)
    try:
        filt = parse_tag_expression(t[6])
    except ClientError as exc:
        raise TokenError("invalid tags %s: %s" % (show(t[6]), exc)) from None
    if filt is None:
        raise TokenError("invalid tags %s: name at least one tag (get reads every message)" % show(t[6]))
    max_wait_ms = parse_int(t[7], "maxWaitMs", 0, INT32_MAX) if len(t) >= 9 else None
    token = t[8] if len(t) == 10 else ""
    passed = token.endswith(PASSED_SUFFIX)  # the reply names the id of the record before its next offset
    token = token[:-len(PASSED_SUFFIX)] if passed else token
    expect = parse_expect(token) if token else None  # ":passed" alone: no record read yet
    return GetTags(t[1], t[2], partition, offset, max_size, t[6], parse_int(t[-1], "opaque", INT32_MIN, INT32_MAX),
                   max_wait_ms, filt, expect, passed)


def _parse_offset(t):
    partition = parse_int(t[3], "partition", -1, INT32_MAX)
    offset = parse_int(t[4], "offset", INT64_MIN, INT64_MAX)
    return Offset(t[1], t[2], partition, offset, parse_int(t[5], "opaque", INT32_MIN, INT32_MAX))


def _parse_commit_offset(t):
    partition = parse_int(t[3], "partition", 0, INT32_MAX)
    offset = parse_int(t[4], "offset", 0, INT64_MAX)
    return CommitOffset(t[1], t[2], partition, offset, parse_int(t[5], "opaque", INT32_MIN, INT32_MAX))


def _parse_query_offset(t):
    partition = parse_int(t[3], "partition", 0, INT32_MAX)
    return QueryOffset(t[1], t[2], partition, parse_int(t[4], "opaque", INT32_MIN, INT32_MAX))


def _parse_offset_at(t):
    partition = parse_int(t[2], "partition", 0, INT32_MAX)
    timestamp_ms = parse_int(t[3], "timestamp", 0, INT64_MAX)
    return OffsetAt(t[1], partition, timestamp_ms, parse_int(t[4], "opaque", INT32_MIN, INT32_MAX))




def _parse_stats(t):
    if len(t) == 1:
        return Stats(None, DEFAULT_OPAQUE)
    if len(t) == 2:
        return Stats(t[1], DEFAULT_OPAQUE)
    return Stats(t[1], parse_int(t[2], "opaque", INT32_MIN, INT32_MAX))


def _parse_version(t):
    return Version(parse_int(t[1], "opaque", INT32_MIN, INT32_MAX)) if len(t) == 2 else Version(DEFAULT_OPAQUE)


def _parse_quit(t):
    return Quit()


def _parse_transaction(t):
    tx_key = _tx_key(t[1])
    if t[3] not in TX_TYPES:
        raise TokenError("invalid transaction type %s: expected one of %s" % (show(t[3]), " ".join(TX_TYPES)))
    timeout, qualifier = 0, None
    if len(t) == 6:
        if t[4].isascii() and t[4].isdigit():
            timeout = parse_int(t[4], "timeout", 0, INT32_MAX)
        else:
            qualifier = t[4]
    elif len(t) == 7:
        timeout = parse_int(t[4], "timeout", 0, INT32_MAX)
        qualifier = t[5]
    return Transaction(tx_key, t[2], t[3], parse_int(t[-1], "opaque", INT32_MIN, INT32_MAX), timeout, qualifier)


def _parse_sync(t):
    topic = t[1]
    partition = parse_int(t[2], "partition", -1, INT32_MAX)
    flag = parse_int(t[4], "flag", INT32_MIN, INT32_MAX)
    msg_id = parse_int(t[5], "msgId", INT64_MIN, INT64_MAX)
    checksum = parse_int(t[6], "checksum", UNCHECKED, INT32_MAX) if len(t) == 8 else UNCHECKED
    opaque = parse_int(t[-1], "opaque", INT32_MIN, INT32_MAX)
    return lambda body: Sync(topic, partition, flag, msg_id, body, opaque, checksum)


def _parse_promote(t):
    force = parse_int(t[1], "force", 0, 1)
    return Promote(bool(force), parse_int(t[2], "opaque", INT32_MIN, INT32_MAX))


_HEX = frozenset("0123456789abcdef")


def _hextoken(token, what):
    if not 16 <= len(token) <= 128 or not set(token) <= _HEX:
        raise TokenError("invalid %s %s: expected 16 to 128 lowercase hex digits" % (what, show(token)))
    return token


def _parse_auth(t):
    opaque = parse_int(t[-1], "opaque", INT32_MIN, INT32_MAX)
    if len(t) == 3:
        return Auth(t[1], None, None, opaque)
    return Auth(t[1], _hextoken(t[2], "client nonce"), _hextoken(t[3], "proof"), opaque)


def _parse_value(t):
    opaque = parse_int(t[2], "opaque", INT32_MIN, INT32_MAX)
    return lambda body: Value(body, opaque)


def _parse_result(t):
    code = parse_int(t[1], "code", 0, _MAX_CODE)
    opaque = parse_int(t[3], "opaque", INT32_MIN, INT32_MAX)
    return lambda body: Result(code, body, opaque)



#: ``stats`` items only an admin may ask for: ``reset`` changes the counters, ``transactions`` lists every
#: user's transaction ids (a user sees its own in-doubt branches with ``transaction ... RECOVER``).
ADMIN_STATS_ITEMS = ("reset", "transactions")


def _stats_need(e):
    return NEEDS_ADMIN if (e.item or "").strip() in ADMIN_STATS_ITEMS else NEEDS_USER



def _serialize_put(e):
    if e.tx_key is None:
        head = "put %s %d %d %d %d %d\r\n" % (token(e.topic), e.partition, len(e.body), e.flag, e.checksum, e.opaque)
    else:
        head = "put %s %d %d %d %d %s %d\r\n" % (
            token(e.topic), e.partition, len(e.body), e.flag, e.checksum, token(e.tx_key), e.opaque,
        )
    return b"".join((head.encode("utf-8"), e.body))


def _serialize_put_delayed(e):
    head = "put_delayed %s %d %d %d %d %d %d\r\n" % (
        token(e.topic), e.partition, len(e.body), e.flag, e.checksum, e.level, e.opaque)
    return b"".join((head.encode("utf-8"), e.body))






def wait_and_expect(e):
    """`` <maxWaitMs>[ <offset>:<msgId>]`` of a get (an ``expect`` needs a wait: 0 is none), or ``""``."""
    passed = PASSED_SUFFIX if getattr(e, "passed", False) else ""  # get_tags only (events.GetTags)
    if e.expect is not None or passed:
        expect = "" if e.expect is None else "%d:%d" % e.expect
        return " %d %s%s" % (e.max_wait_ms or 0, expect, passed)
    return "" if e.max_wait_ms is None else " %d" % e.max_wait_ms


def _serialize_get(e):
    wait = wait_and_expect(e)
    return (
        "get %s %s %d %d %d%s %d\r\n"
        % (token(e.topic), token(e.group), e.partition, e.offset, e.max_size, wait, e.opaque)
    ).encode("utf-8")


def _serialize_get_tags(e):
    wait = wait_and_expect(e)
    return ("get_tags %s %s %d %d %d %s%s %d\r\n" % (token(e.topic), token(e.group), e.partition, e.offset,
                                                      e.max_size, token(e.tags), wait, e.opaque)).encode("utf-8")


def _serialize_offset(e):
    return (
        "offset %s %s %d %d %d\r\n" % (token(e.topic), token(e.group), e.partition, e.offset, e.opaque)
    ).encode("utf-8")




def _serialize_offset_at(e):
    return ("offset_at %s %d %d %d\r\n" % (token(e.topic), e.partition, e.timestamp_ms, e.opaque)).encode("utf-8")


def _serialize_commit_offset(e):
    return ("commit_offset %s %s %d %d %d\r\n" % (
        token(e.group), token(e.topic), e.partition, e.offset, e.opaque)).encode("utf-8")


def _serialize_query_offset(e):
    return ("query_offset %s %s %d %d\r\n" % (token(e.group), token(e.topic), e.partition, e.opaque)).encode("utf-8")


def _serialize_stats(e):
    # Like MetaQ's encoder, a blank item is written as an empty token: "stats  <opaque>".
    return ("stats %s %d\r\n" % (token(e.item or ""), e.opaque)).encode("utf-8")


def _serialize_version(e):
    return b"version %d\r\n" % e.opaque


def _serialize_quit(e):
    return b"quit\r\n"


def _serialize_transaction(e):
    parts = ["transaction", token(e.tx_key), token(e.session_id), token(e.tx_type)]
    if e.timeout > 0:
        parts.append(str(e.timeout))
    if e.unique_qualifier:
        parts.append(token(e.unique_qualifier))
    parts.append(str(e.opaque))
    return (" ".join(parts) + "\r\n").encode("utf-8")


def _serialize_sync(e):
    head = "sync %s %d %d %d %d %d %d\r\n" % (
        token(e.topic), e.partition, len(e.body), e.flag, e.msg_id, e.checksum, e.opaque,
    )
    return b"".join((head.encode("utf-8"), e.body))


def _serialize_promote(e):
    return b"promote %d %d\r\n" % (1 if e.force else 0, e.opaque)


def _serialize_auth(e):
    if e.client_nonce is None:
        return ("auth %s %d\r\n" % (token(e.user), e.opaque)).encode("utf-8")
    return ("auth %s %s %s %d\r\n" % (token(e.user), token(e.client_nonce), token(e.proof), e.opaque)).encode()


def _serialize_value(e):
    return b"".join((encode_value_header(len(e.body), e.opaque), e.body))


def _serialize_result(e):
    return encode_result(e.code, e.body, e.opaque)




# -- the declarations: MetaQ's commands and our core extensions (the features' own: admin.wire, filters.wire,
# priorities.wire, timers.wire, topics.wire, idempotence.wire, keys.wire, reqreply.wire, each in its module). The
# usage text is what a wrong token count is answered with.

_REQUESTS = (
    ("put", Put, (6, 7, 8), "6, 7 or 8 tokens", _parse_put, _serialize_put, NEEDS_HANDLER, 3, _fast_put, scan_puts,
     (b"put t 0 5 0 1\r\nhello", b"put t -1 2 1 -1 7\r\nhi", b"put t 1 2 0 123 TX:1:2 9\r\nhi",
      b"put t 1 2 0 TX:1:2 9\r\nhi", b"put t 0 9 1 -1 3\r\n\x00\x00\x00\x01ahello")),
    ("put_delayed", DelayedPut, (8,), "8 tokens", _parse_put_delayed, _serialize_put_delayed, NEEDS_HANDLER, 3, None,
     None, (b"put_delayed t 0 2 0 -1 3 5\r\nhi",)),
    ("get", Get, (7, 8, 9), "7, 8 or 9 tokens (get <topic> <group> <partition> <offset> <maxSize> "
     "[<maxWaitMs> [<offset>:<msgId>]] <opaque>)", _parse_get, _serialize_get, NEEDS_HANDLER, None, None, None,
     (b"get t g 0 0 1024 1\r\n", b"get t g 0 5 1024 100 2\r\n", b"get t g 0 5 1024 0 4:77 3\r\n")),
    ("get_tags", GetTags, (8, 9, 10), "8, 9 or 10 tokens (get_tags <topic> <group> <partition> <offset> "
     "<maxSize> <tags> [<maxWaitMs> [<offset>:<msgId>]] <opaque>)", _parse_get_tags, _serialize_get_tags,
     NEEDS_HANDLER, None, None, None,
     (b"get_tags t g 0 0 1024 a||b 1\r\n", b"get_tags t g 0 3 1024 a 10 2:9:passed 2\r\n")),
    ("offset", Offset, (6,), "6 tokens", _parse_offset, _serialize_offset, NEEDS_SUBSCRIBER, None, None, None,
     (b"offset t g 0 5 1\r\n",)),
    ("commit_offset", CommitOffset, (6,), "6 tokens", _parse_commit_offset, _serialize_commit_offset,
     NEEDS_GROUP_MEMBER, None, None, None, (b"commit_offset g t 0 5 1\r\n",)),
    ("query_offset", QueryOffset, (5,), "5 tokens", _parse_query_offset, _serialize_query_offset, NEEDS_GROUP_MEMBER,
     None, None, None, (b"query_offset g t 0 1\r\n",)),
    ("offset_at", OffsetAt, (5,), "5 tokens (offset_at <topic> <partition> <timestampMs> <opaque>)",
     _parse_offset_at, _serialize_offset_at, NEEDS_SUBSCRIBER, None, None, None,
     (b"offset_at t 0 1700000000000 1\r\n",)),
    ("stats", Stats, (1, 2, 3), "1, 2 or 3 tokens", _parse_stats, _serialize_stats, depends(_stats_need), None,
     None, None, (b"stats  1\r\n", b"stats topics 2\r\n", b"stats reset 3\r\n")),
    ("version", Version, (1, 2), "1 or 2 tokens", _parse_version, _serialize_version, NEEDS_NOTHING, None, None,
     None, (b"version 1\r\n",)),
    ("quit", Quit, (1,), "1 token", _parse_quit, _serialize_quit, NEEDS_NOTHING, None, None, None, (b"quit\r\n",)),
    ("transaction", Transaction, (5, 6, 7), "5, 6 or 7 tokens", _parse_transaction, _serialize_transaction,
     NEEDS_USER, None, None, None,
     (b"transaction TX:1:2 s BEGIN 1\r\n", b"transaction TX:1:2 s BEGIN 30 1\r\n",
      b"transaction XID:a:b:1 s PREPARE 30 q 1\r\n")),
    ("sync", Sync, (7, 8), "7 or 8 tokens", _parse_sync, _serialize_sync, NEEDS_ADMIN, 3, None, None,
     (b"sync t 0 2 0 12345 -1 5\r\nhi",)),
    ("promote", Promote, (3,), "3 tokens (promote <force 0|1> <opaque>)", _parse_promote, _serialize_promote,
     NEEDS_ADMIN, None, None, None, (b"promote 0 1\r\n",)),
    ("auth", Auth, (3, 5), "3 or 5 tokens (auth <user> <opaque>, auth <user> <client nonce> <proof> <opaque>)",
     _parse_auth, _serialize_auth, NEEDS_NOTHING, None, None, None,
     (b"auth alice 1\r\n", b"auth alice 0123456789abcdef 0123456789abcdef0123 2\r\n")),
)

for (_word, _event, _counts, _usage, _parse, _serialize, _need, _body, _fast, _burst, _examples) in _REQUESTS:
    register(TextCommand(_word, _event, _counts, _usage, _parse, _serialize, _need, _body, fast_line=_fast,
                         burst=_burst, examples=_examples))
register(TextCommand("value", Value, (3,), "3 tokens", _parse_value, _serialize_value, NEEDS_NOTHING, 1, reply=True,
                     examples=(b"value 2 1\r\nhi",)))
register(TextCommand("result", Result, (4,), "4 tokens", _parse_result, _serialize_result, NEEDS_NOTHING, 2,
                     reply=True, examples=(b"result 200 2 1\r\nok", b"result 404 0 -1\r\n")))


class TextParser(StreamParser):
    """Incremental parser of MetaQ text frames (requests and replies alike).

    Feed bytes with ``receive_data`` (``b""`` = end of stream), then call
    ``next_event`` until it returns ``NEED_DATA`` (or ``CLOSED`` after a clean
    end of stream). It never does IO, never logs and raises nothing but
    ``RemoteProtocolError``. It reads the whole command table: made before
    ``metaq.textcommands`` is imported, it raises RuntimeError.
    """

    def __init__(self, max_line=limits.MAX_LINE_BYTES, max_body=limits.MAX_BODY_BYTES):
        super().__init__()
        self._fast_lines = fast_lines()  # the registry's, taken once: the hot path reads it per line
        self.max_line = max_line
        self.max_body = max_body
        self._scan = 0  # bytes before this were already searched for a line end
        self._skip = 0  # bytes of a rejected frame's body still to drop
        self._pending = None  # (build(body) -> event, body length) once a header is parsed

    @property
    def in_frame(self):
        """True while part of a frame (line, body or a body being skipped) is buffered."""
        return self._pending is not None or self._skip > 0 or self._pos < len(self._buf)

    def burst_window(self):
        """``(buffer, start, end)`` of the buffered bytes when they start at a frame boundary, else None.

        For a caller that takes whole frames straight from the buffer (the
        broker's put bursts, ``metaq.protocol.burst``) and then says how far
        with ``consume_to``. The buffer must not be kept or resized.
        """
        if self._pending is not None or self._skip or self._fatal is not None or self._pos == len(self._buf):
            return None
        return self._buf, self._pos, len(self._buf)

    def consume_to(self, pos):
        """The bytes before ``pos`` (whole frames from ``burst_window``) were handled by the caller."""
        self._pos = pos
        self._completed += 1
        if self._scan < pos:
            self._scan = pos

    def _compact(self):
        self._scan = max(0, self._scan - self._pos)
        super()._compact()

    def _accept(self, data):
        if self._skip and not self._buf:  # drop the rest of a rejected frame's body without buffering it
            dropped = min(self._skip, len(data))
            self._skip -= dropped
            data = memoryview(data)[dropped:]
        self._buf += data

    def _next_event(self):
        while True:
            if self._skip and not self._skip_body():
                return self._need_data()
            if self._pending is not None:
                return self._finish_body()
            line = self._take_line()
            if line is None:
                return self._need_data()
            if line:
                for prefix, fast_line in self._fast_lines:  # the hot path: most frames are puts
                    if line.startswith(prefix):
                        fast = fast_line(line)
                        if fast is not None and fast[1] <= self.max_body:
                            self._pending = fast
                            return self._finish_body()
                        break
                event = self._parse_line(line)
                if event is not None:
                    return event
                if self._pending is not None:
                    return self._finish_body()

    def _skip_body(self):
        """Drop buffered bytes of a rejected frame's body; True once all are gone."""
        dropped = min(self._skip, len(self._buf) - self._pos)
        self._pos += dropped
        self._skip -= dropped
        return not self._skip

    def _finish_body(self):
        build, length = self._pending
        start = self._pos
        end = start + length
        if len(self._buf) < end:
            return self._need_data()
        if length < _COPY_ONCE_FROM:
            body = bytes(self._buf[start:end])
        else:
            with memoryview(self._buf) as view:
                body = bytes(view[start:end])
        self._pos = end
        self._pending = None
        return build(body)

    def _take_line(self):
        """Consume and return the next line without its line end, or None if it is incomplete."""
        buf = self._buf
        pos = self._pos
        start = self._scan if self._scan > pos else pos
        newline = buf.find(b"\n", start, pos + self.max_line + 2)
        if newline < 0:
            waiting = len(buf) - pos
            if waiting > self.max_line + 1 or (waiting == self.max_line + 1 and buf[-1] != 13):
                raise self._line_too_long()
            self._scan = len(buf)
            return None
        end = newline - 1 if newline > pos and buf[newline - 1] == 13 else newline
        if end - pos > self.max_line:
            raise self._line_too_long()
        self._pos = self._scan = newline + 1
        return buf[pos:end]

    def _line_too_long(self):
        return RemoteProtocolError("line longer than %d bytes" % self.max_line, 0, True)

    def _parse_line(self, raw):
        """Parse one non-empty line: return an event, or None (blank line, or body pending)."""
        try:
            text = raw.decode("utf-8")
            problem = None
        except UnicodeDecodeError:
            text = raw.decode("utf-8", "replace")
            problem = "line is not valid UTF-8"
        tokens = text.split(" ")
        if not tokens[-1]:
            while tokens and not tokens[-1]:
                tokens.pop()
            if not tokens:
                return None
        command = by_word(tokens[0])
        if command is None:
            raise RemoteProtocolError(problem or "unknown command %s" % show(tokens[0]), _error_opaque(tokens))
        length_index = command.body
        if problem is None and len(tokens) not in command.counts:
            problem = "%s needs %s, got %d" % (tokens[0], command.usage, len(tokens))
        length = 0 if length_index is None else self._body_length(tokens, length_index, problem)
        if problem is None:
            try:
                result = command.parse(tokens)
            except ValueError as exc:  # TokenError, or a feature parser's reason
                problem = str(exc)
        if problem is not None:
            self._skip = length
            raise RemoteProtocolError(problem, _error_opaque(tokens))
        if length_index is None:
            return result
        self._pending = (result, length)
        return None

    def _body_length(self, tokens, index, problem):
        """The announced body length; a fatal error if it is missing, invalid or over the limit."""
        token = tokens[index] if index < len(tokens) else None
        if token is not None and token.isdigit() and token.isascii():
            length = int(token)
            if length <= self.max_body:
                return length
            reason = "body length %d exceeds the limit of %d bytes" % (length, self.max_body)
        elif token is None:
            reason = "no body length"
        elif is_integer(token):
            reason = "invalid body length %s: negative" % token
        else:
            reason = "invalid body length %s: not an integer" % show(token)
        if problem is not None:
            reason = "%s; %s" % (problem, reason)
        raise RemoteProtocolError(reason, _error_opaque(tokens), True)


def serialize(event):
    """The canonical wire bytes of ``event``.

    Put: 7 tokens (checksum always written), 8 with a tx_key. Get: 7 tokens, 8
    with max_wait_ms. Stats: ``stats <item> <opaque>``, a blank item (None or
    "") as ``stats  <opaque>``. Transaction: timeout only when > 0, qualifier
    only when not empty. Sync: 8 tokens. Raises ValueError when a text field
    holds a space, CR or LF, TypeError for a non-event.
    """
    command = by_event(type(event))
    if command is None:
        raise TypeError("not a text-protocol event: %r" % (event,))
    return command.serialize(event)


def encode_result(code, body, opaque):
    """``result <code> <len> <opaque>\\r\\n<body>`` (body: bytes-like)."""
    return b"".join((b"result %d %d %d\r\n" % (code, len(body), opaque), body))


def encode_value_header(length, opaque):
    """``value <length> <opaque>\\r\\n``; the caller sends ``length`` bytes of records after it."""
    return b"value %d %d\r\n" % (length, opaque)


def error_reply(exc, opaque):
    """The wire reply for a MetaqError (the only error→reply mapping)."""
    if isinstance(exc, errors.Moved):
        return encode_result(301, str(exc.offset).encode(), opaque)
    if isinstance(exc, errors.TransactionError):
        return encode_result(500, xa_error_body(exc.xa_code, exc.msg), opaque)
    return encode_result(exc.code, str(exc).encode("utf-8", "replace"), opaque)


#: A failed ``transaction`` reply's body (a TransactionError's XA code and message).
_XA_ERROR = re.compile(r"XAException:code=(-?\d+),msg=(.*)", re.S)


def xa_error_body(code, msg):
    """The body of a failed ``transaction`` reply."""
    return ("XAException:code=%d,msg=%s" % (code, msg)).encode("utf-8")


def parse_xa_error(body):
    """``(code, msg)`` from a failure body, or None when the body is not an XAException."""
    m = _XA_ERROR.fullmatch(bytes(body).decode("utf-8", "replace"))
    if m is None:
        return None
    return int(m.group(1)), m.group(2)
