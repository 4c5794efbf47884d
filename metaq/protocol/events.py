"""Events of MetaQ's text protocol (requests and replies), as immutable named tuples.

Named tuples, not dataclasses: the broker builds one per request and reply, and a
frozen dataclass costs several times as much to construct (bench/README.md, "Events as named tuples").

Every event knows how to serialize itself (see ``metaq.protocol.text.serialize``).
``opaque`` is a signed 32-bit int echoed from request to reply.
"""

from typing import NamedTuple, Optional

#: opaque used by MetaQ when ``version``/``stats`` carry none.
DEFAULT_OPAQUE = 2147483647

UNCHECKED = -1  # checksum value meaning "do not verify"

TX_TYPES = (
    "BEGIN",
    "END",
    "PREPARE",
    "COMMIT_ONE_PHASE",
    "COMMIT_TWO_PHASE",
    "ROLLBACK",
    "FORGET",
    "RECOVER",
    # ours (metaq-admin): an operator's decision on a prepared XA branch
    "HEURISTIC_COMMIT",
    "HEURISTIC_ROLLBACK",
)


class Put(NamedTuple):
    """``put topic partition len flag [checksum] [txKey] opaque\\r\\n<body>``; checksum -1 = unchecked."""

    topic: str
    partition: int
    flag: int
    body: bytes
    opaque: int
    checksum: int = UNCHECKED
    tx_key: Optional[str] = None


class DelayedPut(NamedTuple):
    """``put_delayed topic partition len flag checksum level opaque\\r\\n<body>`` (our extension).

    Like a 7-token put plus a delay level (``metaq.timers.levels``): 0 = no delay, above the
    last level = the last level. Reply ``msgId partition -1`` (the offset is known only at
    delivery), or ``msgId partition offset`` for level 0.
    """

    topic: str
    partition: int
    flag: int
    body: bytes
    opaque: int
    checksum: int
    level: int


class Request(NamedTuple):
    """``request topic partition len flag checksum timeoutMs opaque\r\n<body>`` (our extension; docs/messaging.md
    "Request-reply", ``metaq.reqreply.records``): a put whose answer is its reply.

    The broker stores the message with ``CORRELATION_ID``, ``REPLY_TO_CLIENT``, ``TTL`` and ``CLUSTER`` added to
    its properties, then answers ``value <len> <opaque>`` with the reply as one record (msgId 0) once a
    ``reply`` (or a RocketMQ SEND_REPLY_MESSAGE) names its correlation id, or ``result 504`` after
    ``timeout_ms`` (1..2^31-1; the broker cuts it to ``limits.max_request_timeout_ms``).
    """

    topic: str
    partition: int
    flag: int
    body: bytes
    opaque: int
    checksum: int
    timeout_ms: int


class Reply(NamedTuple):
    """``reply len flag checksum opaque\r\n<body>`` (our extension): a reply message, its properties naming
    the request's ``CORRELATION_ID`` and ``REPLY_TO_CLIENT``. Answered ``result 200`` once handed to the
    requester, ``result 404`` when no requester waits for it (timed out, or its connection closed)."""

    flag: int
    body: bytes
    opaque: int
    checksum: int


class Get(NamedTuple):
    """``get topic group partition offset maxSize [maxWaitMs [expect]] opaque``; max_wait_ms None = no long poll.

    ``expect`` (our extension, docs/replication.md): ``(offset, msg_id)``, written ``<offset>:<msgId>``, the
    record the client last read (normally ``offset - 1``) and its id. A broker whose record at that offset has
    another id answers ``result 412`` (``errors.Diverged``) instead of reading: its log is not the one the
    client read before (a failover cut or rewrote it there). An offset outside the partition is not checked.
    """

    topic: str
    group: str
    partition: int
    offset: int
    max_size: int
    opaque: int
    max_wait_ms: Optional[int] = None
    expect: Optional[tuple] = None


class GetTags(NamedTuple):
    """``get_tags topic group partition offset maxSize tags [maxWaitMs [expect]] opaque`` (our extension;
    docs/messaging.md "Tag filtering"): a get of the records whose tags (the attribute before ``\\x02``) are among
    ``tags`` (``A||B``: ``filters.wire``), found by the broker from its index units without reading the others.

    Reply ``value <len> opaque`` with body ``<next offset: int64>`` then, per record, ``<its offset: int64>`` and
    its MetaQ form: the client asks for ``next offset`` next, past the records it passed over. A body of the
    8 bytes alone says that nothing wanted lay between ``offset`` and ``next offset``. 404 as a get's when
    nothing is past ``offset`` (after ``maxWaitMs``). ``filter`` is the parsed ``tags`` (a ``TagFilter``).

    ``passed`` (the expect written ``<offset>:<msgId>:passed``, or ``:passed`` alone): the body's next offset is
    followed by the id of the record just before it (``<int64>``; -1 when none is held), so that a client that
    passed over records names the last of them in its next expect: a failover that rewrote them is found
    (client/divergence.py).
    """

    topic: str
    group: str
    partition: int
    offset: int
    max_size: int
    tags: str
    opaque: int
    max_wait_ms: Optional[int] = None
    filter: object = None
    expect: Optional[tuple] = None  # as a Get's: ``get_tags ... <tags> <maxWaitMs> <offset>:<msgId> <opaque>``
    passed: bool = False  # ``[<offset>:<msgId>]:passed``: the reply names the id of the record before next offset


class GetSql(NamedTuple):
    """``get_sql topic group partition offset maxSize exprBytes [maxWaitMs [expect]] opaque`` then the SQL92
    expression (``exprBytes`` of UTF-8) as the frame's body (our extension; docs/messaging.md "SQL92 filters"): a
    get of the records whose properties the expression matches, evaluated by the broker (``filters.sql``).
    Replied as a ``get_tags`` (the next offset, then each record after its offset; ``passed`` and ``expect``
    as its). ``filter`` is the compiled expression (a ``SqlFilter``)."""

    topic: str
    group: str
    partition: int
    offset: int
    max_size: int
    expression: str
    opaque: int
    max_wait_ms: Optional[int] = None
    filter: object = None
    expect: Optional[tuple] = None
    passed: bool = False


class Offset(NamedTuple):
    """``offset topic group partition offset opaque``: ask for the nearest valid offset."""

    topic: str
    group: str
    partition: int
    offset: int
    opaque: int


class Stats(NamedTuple):
    """``stats [item] [opaque]``; item None = blank item."""

    item: Optional[str] = None
    opaque: int = DEFAULT_OPAQUE


class Version(NamedTuple):
    """``version [opaque]`` (also the heartbeat)."""

    opaque: int = DEFAULT_OPAQUE


class Quit(NamedTuple):
    """``quit``: the server closes the connection without a reply."""


class Transaction(NamedTuple):
    """``transaction txKey sessionId TYPE [timeout] [uniqueQualifier] opaque``.

    tx_key is the raw key text (``TX:...``, ``XID:...`` or ``null``); timeout 0 = none.
    """

    tx_key: str
    session_id: str
    tx_type: str
    opaque: int
    timeout: int = 0
    unique_qualifier: Optional[str] = None


class Sync(NamedTuple):
    """``sync topic partition len flag msgId [checksum] opaque\\r\\n<body>`` (replication)."""

    topic: str
    partition: int
    flag: int
    msg_id: int
    body: bytes
    opaque: int
    checksum: int = UNCHECKED


class CommitOffset(NamedTuple):
    """``commit_offset group topic partition offset opaque`` (our extension): store a group's offset in the broker.

    ``offset`` is the next offset the group will read. Reply ``result 200 0 opaque``.
    """

    group: str
    topic: str
    partition: int
    offset: int
    opaque: int


class QueryOffset(NamedTuple):
    """``query_offset group topic partition opaque`` (our extension): the group's offset stored in the broker.

    Reply ``result 200 <len> opaque`` with body ``<offset>``, or 404 when the group never committed one.
    """

    group: str
    topic: str
    partition: int
    opaque: int


class OffsetAt(NamedTuple):
    """``offset_at topic partition timestampMs opaque`` (our extension): replay from a time.

    Reply ``result 200 <len> opaque`` with body ``<offset>``: the first offset of the partition whose message
    was stored at or after ``timestamp_ms`` (ms since the Unix epoch, the broker's clock when it stored the
    message). A time after the last message answers the partition's end (where the next message will go), a
    time before the first kept message the first kept offset. 404 for a partition the topic does not have,
    as ``offset`` answers; 503 while the broker refuses reads (as ``get``).
    """

    topic: str
    partition: int
    timestamp_ms: int
    opaque: int


class Lookup(NamedTuple):
    """``lookup topic key sinceMs untilMs max cursor opaque`` (our extension; docs/messaging.md "Key index"): one page
    of the messages of ``topic`` with ``key`` (a ``KEYS`` word, a ``UNIQ_KEY``, the metaq client's key) stored within
    ``[sinceMs, untilMs]``, newest first, at most ``max`` (cut to ``limits.MAX_KEY_QUERY_RESULTS``); ``cursor`` is
    ``-`` for the first page, then what the previous page returned.

    Reply ``result 200 <len> opaque`` with a ``keys.wire`` body (the next cursor, how far the index
    reaches, the messages with their partition, offset and position); 400 for a bad key or cursor; 503 while the
    broker refuses reads.
    """

    topic: str
    key: str
    since_ms: int
    until_ms: int
    max_count: int
    cursor: str
    opaque: int


class Promote(NamedTuple):
    """``promote <force 0|1> <opaque>`` (our extension; ``metaq-admin promote``): make a replication slave the master.

    Reply ``result 200 <len> opaque`` with a text saying the new epoch (and, when forced while behind, how
    far behind); 400 when the broker is not a slave; 503 with the reason when the slave refuses (its master
    is still connected, or it is not caught up and ``force`` is 0).
    """

    force: bool
    opaque: int


class Auth(NamedTuple):
    """``auth <user> <opaque>`` then ``auth <user> <client nonce> <proof> <opaque>`` (our extension; docs/security.md):
    the challenge/response that proves a user's secret without sending it.

    Step one (``client_nonce`` None) is answered ``result 200`` with the server nonce as body; step two
    ``result 200`` with the server's proof (hex HMAC-SHA256, ``metaq.auth.proofs.text_proof``), or
    ``result 401 <reason>`` and the connection is closed.
    """

    user: str
    client_nonce: Optional[str]
    proof: Optional[str]
    opaque: int


class Value(NamedTuple):
    """``value len opaque\\r\\n<body>``: data reply to get (concatenated MetaQ records)."""

    body: bytes
    opaque: int


class Result(NamedTuple):
    """``result code len opaque\\r\\n[body]``: every other reply."""

    code: int
    body: bytes
    opaque: int
