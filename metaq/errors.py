"""One exception tree for the whole project; each class says whose fault it is.

Every error carries the MetaQ status ``code`` that the single wire-mapping place
(``metaq.server.text.dispatch``) answers with, so no other module decides codes.

    MetaqError                     base; code 500
    ├── ClientError                the peer sent something wrong; code 400
    │   ├── RemoteProtocolError    a frame we cannot parse (raised by protocol parsers)
    │   ├── ChecksumMismatch       the put body does not match its checksum
    │   ├── BadCompressedBody      a compressed body that does not decompress, or past the body limit
    │   ├── BadFilterExpression    a SQL92 filter that does not parse or passes a limit; names the position
    │   ├── UnknownTopic           topic matches no configured name or pattern
    │   ├── InvalidTopic           topic name is not legal (characters, length, '.' / '..')
    │   ├── InvalidPartition       partition out of range for the topic
    │   ├── Unauthenticated        the request needs an authenticated user, or the proof was wrong (401)
    │   └── Forbidden              the user may not do this (403)
    ├── NotFound                   nothing at that place (404)
    ├── Moved                      the requested offset is outside [min, max]; carries the right one (301)
    ├── Unavailable                transient refusal, try again later (503)
    │   ├── NotMaster              this broker is not the master a request must reach; names it when known
    │   ├── DiskFull               disk above the danger mark or ENOSPC; writes refused until space returns (507)
    │   ├── ConnectionLost         (client) the connection to a broker closed or could not be made
    │   └── RequestTimeout         (client) no reply within the request's timeout
    │       └── NoReply            a request-reply ``request`` got no reply within its timeout (504)
    ├── ReplyError                 (client) the replier's handler raised; the reply says what
    ├── TransactionError           an XA failure (500, body XAException:code=<xa_code>,msg=...)
    ├── BrokerError                our fault (500)
    │   └── StoreError             the store failed
    │       ├── CorruptLog         corruption followed by valid records; refuse to start unless forced
    │       └── CorruptRecord      a stored record fails its CRC check on a read; never served (512)
    └── ConfigError                the operator's configuration is invalid (startup)
"""

import re


class MetaqError(Exception):
    """Base of every metaq error."""

    code = 500


class ClientError(MetaqError):
    """The peer sent something we will not accept."""

    code = 400


class RemoteProtocolError(ClientError):
    """A frame could not be parsed.

    ``opaque`` is the request's opaque when it could be read (else 0), so the
    reply can still be matched. ``fatal`` is True when the stream cannot be
    resynchronised (a body of unknown or over-limit length was announced): the
    server replies and closes the connection.
    """

    def __init__(self, reason, opaque=0, fatal=False):
        super().__init__(reason)
        self.reason = reason
        self.opaque = opaque
        self.fatal = fatal


class ChecksumMismatch(ClientError):
    """The put body's CRC-32 does not equal the announced checksum."""


class BadCompressedBody(ClientError):
    """A body marked compressed (RocketMQ's sysFlag, or ``@SYSFLAG`` in a put's attribute) that does not
    decompress with its codec, names an unknown codec, or decompresses past the body limit. Nothing is stored."""


class BadFilterExpression(ClientError):
    """A SQL92 filter expression that does not compile (``filters.sql``): ``position`` is the character index
    (0-based) where it went wrong, ``expected`` what the grammar wanted there."""

    def __init__(self, reason, position, expected):
        super().__init__(reason)
        self.position = position
        self.expected = expected


class UnknownTopic(ClientError):
    """The topic matches none of the configured topic names or patterns."""


class TopicLimit(UnknownTopic):
    """The topic (or partition) would be created past ``limits.max_topics`` / ``limits.max_partitions``."""


class QuotaExceeded(ClientError):
    """One more would pass the user's quota (``metaq.auth.quotas``: docs/security.md "Quotas"); the message
    names the quota, its value and the user. Nothing was done."""

    def __init__(self, quota, user, limit, message):
        super().__init__(message)
        self.quota, self.user, self.limit = quota, user, limit


class InvalidTopic(ClientError):
    """The topic name is not legal."""


class InvalidPartition(ClientError):
    """The partition is outside ``[0, partitions)`` for its topic."""


class Unauthenticated(ClientError):
    """The request needs an authenticated user (``auth`` first, a signed request), or the proof offered was
    wrong: MetaQ's reserved 401. (RocketMQ's remoting port answers its own way: remoting/acl.py.)"""

    code = 401


class Forbidden(ClientError):
    """The authenticated user may not do this: the topic, group or admin operation is not theirs (403)."""

    code = 403


class TopicForbidden(Forbidden):
    """The topic's permission (the topic table's ``perm``: topics/table.py) refuses this put or read: 403 on the
    text port, NO_PERMISSION (16) on the remoting port, as RocketMQ's broker answers a topic without the permission."""


class ConsumptionDisabled(Forbidden):
    """The group's settings (``consumption_enabled`` false, or ``broadcast_allowed`` false for a broadcasting
    consumer: groups/table.py) refuse this read: 403 on the text port, NO_PERMISSION (16) on the remoting port, as
    RocketMQ's broker answers a group whose consumption is disabled; FORBIDDEN on the gRPC port."""


class NotFound(MetaqError):
    """Nothing there (unknown topic/partition, or no message at that offset yet)."""

    code = 404


class Moved(MetaqError):
    """The requested offset is outside the partition's ``[min, max]``.

    ``offset`` is where the client should go instead.
    """

    code = 301

    def __init__(self, offset, reason=""):
        super().__init__(reason or str(offset))
        self.offset = offset


class Unavailable(MetaqError):
    """A transient refusal: the request may succeed later."""

    code = 503


class NotMaster(Unavailable):
    """This broker is not the master a request must reach (a slave, a member waiting for an election, a master
    whose lease ran out): nothing was done. ``master`` is the master's ``meta://`` URL when this broker knows it
    (``ha: auto``: the elected master's leader node), else None; the client sends the request there. 503, as every
    refusal of a slave; its text (``not_master_text``) carries the master so the client can read it back
    (``parse_not_master``)."""

    def __init__(self, reason, master=None):
        super().__init__(reason)
        self.master = master


class DiskFull(Unavailable):
    """Writes are refused because the disk is (nearly) full.

    A transient refusal like any ``Unavailable``, but with its own code: HTTP's 507
    "Insufficient Storage", so a client tells a full disk from other refusals by the
    code, not by the reply's text. (The RocketMQ remoting port still answers
    SERVICE_NOT_AVAILABLE, as RocketMQ does.)
    """

    code = 507


class ConnectionLost(Unavailable):
    """Client side: the broker could not be reached, or the connection closed before the reply."""


class RequestTimeout(Unavailable):
    """Client side: no reply arrived within the request's timeout (the request may still have been served)."""


class NoReply(RequestTimeout):
    """A request-reply ``request`` got no reply within its timeout (the broker's ``result 504``; docs/messaging.md
    "Request-reply"). The request itself was stored: a consumer may still handle it later."""

    code = 504


class ClientNoAnswer(RequestTimeout):
    """A connected client asked a question by an admin (a gRPC client's thread stacks, a message it consumes
    directly: docs/rocketmq5.md) gave no answer within the question's timeout (``result 504``)."""

    code = 504


class ReplyError(MetaqError):
    """Client side: the reply to a request says its replier's handler raised (``METAQ_REPLY_ERROR``); the text
    is what it raised. The replier's fault, not the broker's."""

    code = 500


class TransactionError(MetaqError):
    """A transaction request failed; ``xa_code`` is the XA code (XAER_NOTA, XAER_PROTO, XA_RBTIMEOUT, ...)."""

    code = 500

    def __init__(self, xa_code, msg):
        super().__init__(msg)
        self.xa_code = xa_code
        self.msg = msg


class BrokerError(MetaqError):
    """Something failed on our side."""

    code = 500


class StoreError(BrokerError):
    """The store could not do what was asked."""


class CorruptLog(StoreError):
    """Corrupt bytes followed by valid records: recovery refuses to cut them unless forced."""

    def __init__(self, reason, path=None, position=None):
        super().__init__(reason)
        self.path = path
        self.position = position


class CorruptRecord(StoreError):
    """A record asked for fails its structure or CRC check: it is never served (docs/operating.md "Corrupt records").

    Carries what a consumer needs to decide, and to skip it: ``topic``, ``partition``, ``offset``
    (the record's), ``next_offset`` (where the partition goes on) and ``position`` (its place in the
    commit log, or None). Its code, 512, is one no MetaQ reply uses (HttpStatus.java defines 200,
    301, 400, 401, 403, 404, 500, 503 and 504; 507 is our full disk), so a client tells it from
    every other failure by the code alone.
    """

    code = 512

    def __init__(self, topic, partition, offset, next_offset=None, position=None, reason=None):
        self.topic, self.partition, self.offset = topic, partition, offset
        self.next_offset = offset + 1 if next_offset is None else next_offset
        self.position = position
        super().__init__(reason or corrupt_record_text(topic, partition, offset, self.next_offset, position))


#: The text of a ``CorruptRecord`` (and of a ``result 512`` body), which ``parse_corrupt_record`` reads back.
CORRUPT_RECORD_FORMAT = ("corrupt record: topic %s partition %d offset %d fails its CRC check and is not served; "
                         "next offset %d")


_CORRUPT_RE = re.compile(r"corrupt record: topic (\S+) partition (-?\d+) offset (-?\d+) .*?; next offset (-?\d+)"
                         r"(?: \(commit-log position (\d+)\))?")


#: The text of a ``NotMaster`` (and of its ``result 503`` body), which ``parse_not_master`` reads back.
NOT_MASTER_FORMAT = "NOT_MASTER: this broker is not the master: %s; %s"

_NOT_MASTER_RE = re.compile(r"NOT_MASTER: .*; (?:the master is (meta://[^\s;]+)|the master is not known here)$",
                            re.DOTALL)


def not_master(reason, master=None):
    """The ``NotMaster`` error for ``reason`` (why this broker may not take the request), naming ``master`` (its
    ``meta://`` URL) when known."""
    where = "the master is %s" % master if master else "the master is not known here"
    return NotMaster(NOT_MASTER_FORMAT % (reason, where), master or None)


def parse_not_master(text):
    """The ``NotMaster`` a ``not_master`` text stands for (its ``master`` read back), or None when ``text`` is not
    one."""
    m = _NOT_MASTER_RE.match(text)
    if m is None:
        return None
    return NotMaster(text, m.group(1))


def os_reason(exc):
    """An exception in words for a message: an OS error as its lower-case reason (``connection refused``,
    ``no route to host``), anything else as its text (``timed out``)."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[:1].lower() + exc.strerror[1:]
    return str(exc)


def corrupt_record_text(topic, partition, offset, next_offset, position=None):
    text = CORRUPT_RECORD_FORMAT % (topic, partition, offset, next_offset)
    return text if position is None else "%s (commit-log position %d)" % (text, position)


def parse_corrupt_record(text):
    """The ``CorruptRecord`` a ``corrupt_record_text`` stands for, or None when ``text`` is not one."""
    m = _CORRUPT_RE.match(text)
    if m is None:
        return None
    topic, partition, offset, next_offset, position = m.groups()
    return CorruptRecord(topic, int(partition), int(offset), int(next_offset),
                         int(position) if position is not None else None, reason=text)


class ConfigError(MetaqError):
    """The configuration is invalid; raised at startup with a message naming the setting."""


class GroupActive(ClientError):
    """An admin change of a consumer group's offsets refused while the group has live members (they would
    overwrite it with their own position): stop them, or force it (docs/operating.md "Admin commands")."""

    code = 409


class Diverged(ClientError):
    """A get's ``expect`` (events.Get) failed: this broker's record at that offset is not the one the client read
    before. Its log and the one the client read diverge there (a failover: the new master never had the old one's
    tail, or a slave's tail was cut and rewritten). The client looks for the last record both hold and reads on
    from there (client/divergence.py): the messages written since in this log are read, none skipped."""

    code = 412
