"""Transactions: a producer's local transactions, and XA branches behind the DB-API two-phase-commit interface.

Local (MetaQ's, reference §7.4; made by ``Producer.transaction``)::

    with producer.transaction(timeout=30):
        producer.send(Message("orders", b"a"))
        producer.send(Message("orders", b"b"))
    # committed here: both messages become visible together, on one broker;
    # an exception in the block rolls back and propagates

XA branches (PEP 249's two-phase-commit interface) are in :mod:`metaq.client.xa` and share this
module's ids, errors and branch machinery.

Failures raise ``XaError`` with the XA code in ``xa_code`` (``metaq.transactions.wire``).
Codes for an outcome the client could not learn (no reply in time, connection
lost): XAER_RMFAIL for commit and rollback ("outcome unknown": ask again, or
resolve it through ``tpc_recover``), XA_RBTIMEOUT for begin, send and prepare
(MetaQ's client does the same; the branch is then rolled back or never prepared).
"""

import concurrent.futures
import itertools
import logging
import math
import re
import socket
import threading
import time
from typing import NamedTuple

from metaq.errors import ConnectionLost, MetaqError, RequestTimeout, TransactionError, Unavailable
from metaq.protocol import events as ev
from metaq.transactions import wire
from metaq.client.message import Partition, SendResult
from metaq.client.replies import reply_error

__all__ = ["Xid", "XaError", "LocalTransaction", "new_session_id", "default_unique_qualifier",
           # the branch machinery XAResource (metaq.client.xa) shares
           "Branch", "ROLLED_BACK", "UNSAFE_IN_IDS", "as_xa_error", "reply_failure", "rollback_code", "timeout_seconds"]

log = logging.getLogger(__name__)

#: Seconds to wait for the reply to a ``transaction`` command (MetaQ: 5 s; commits fsync the journal).
TX_REQUEST_TIMEOUT = 10.0
_SESSIONS = itertools.count(1)
#: Characters a unique qualifier may not hold (a transaction key is ':'-separated).
UNSAFE_IN_IDS = re.compile(r"[\s:]")
#: The XA codes that say "rolled back".
ROLLED_BACK = range(wire.XA_RBROLLBACK, wire.XA_RBTIMEOUT + 2)  # XA_RBBASE..XA_RBEND (100..107)
XA_RBCOMMFAIL = wire.XA_RBROLLBACK + 1  # rolled back: the connection to the broker failed


class XaError(TransactionError):
    """A transaction failed. ``xa_code`` is the XA code (``metaq.transactions.wire``), e.g. XAER_NOTA (-4, unknown
    branch), XAER_PROTO (-6, not allowed in this state), XA_RBTIMEOUT (106, rolled back by its timeout),
    XAER_RMFAIL (-7, the broker could not be reached: the outcome is unknown); ``msg`` says why."""

    @property
    def code_name(self):
        """The code's name, such as ``"XAER_NOTA"``."""
        return wire.XA_CODE_NAMES.get(self.xa_code, "XA code %d" % self.xa_code)

    def __str__(self):
        return "%s: %s" % (self.code_name, self.msg)


class _XidFields(NamedTuple):
    format_id: int
    gtrid: bytes
    bqual: bytes


class Xid(_XidFields):
    """An XA transaction branch id ``(format_id, gtrid, bqual)``; gtrid and bqual are stored as bytes
    (a str is encoded as UTF-8), at most 64 bytes each. On the wire:
    ``XID:<format_id>:<gtrid hex>:<bqual hex>:<uniqueQualifier>``."""

    __slots__ = ()

    def __new__(cls, format_id, gtrid, bqual=b""):
        if isinstance(format_id, bool) or not isinstance(format_id, int) or not -2**31 <= format_id < 2**31:
            raise TypeError("format_id must be a 32-bit int, got %r" % (format_id,))
        fields = []
        for name, value in (("gtrid", gtrid), ("bqual", bqual)):
            if isinstance(value, str):
                value = value.encode("utf-8")
            elif isinstance(value, (bytearray, memoryview)):
                value = bytes(value)
            elif not isinstance(value, bytes):
                raise TypeError("%s must be str or bytes, got %s" % (name, type(value).__name__))
            if len(value) > wire.MAX_BRANCH_BYTES:
                raise ValueError("%s is %d bytes: at most %d" % (name, len(value), wire.MAX_BRANCH_BYTES))
            fields.append(value)
        return super().__new__(cls, format_id, *fields)

    @classmethod
    def from_key(cls, key):
        """The Xid of a wire key ``XID:...`` (its uniqueQualifier is dropped); XaError(XAER_INVAL) otherwise."""
        try:
            parsed = wire.parse_tx_key(key)
        except TransactionError as exc:
            raise XaError(exc.xa_code, exc.msg) from None
        if not isinstance(parsed, wire.XaTxId):
            raise XaError(wire.XAER_INVAL, "%r is not an XA transaction id" % (key,))
        return cls(parsed.format_id, parsed.gtrid, parsed.bqual)

    def key(self, unique_qualifier):
        """The wire key of this branch for the resource named ``unique_qualifier``."""
        return wire.XaTxId(self.format_id, self.gtrid, self.bqual, unique_qualifier).key


def _local_ip():
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def new_session_id():
    """``<ip>-<startMillis>-<n>``: the address's '.' and ':' become '-' (a transaction key may not hold ':')."""
    return "%s-%d-%d" % (re.sub(r"[^0-9A-Za-z]", "-", _local_ip()), int(time.time() * 1000), next(_SESSIONS))


def default_unique_qualifier():
    """``XAMessageProducer-<hostname>`` (MetaQ's default) with whitespace and ':' replaced by '-'."""
    return "XAMessageProducer-" + (UNSAFE_IN_IDS.sub("-", socket.gethostname()) or "localhost")


def timeout_seconds(timeout):
    """BEGIN's whole seconds (0: the broker's default)."""
    if timeout is None:
        return 0
    if timeout < 0:
        raise ValueError("transaction timeout must be >= 0 seconds, got %r" % (timeout,))
    return int(math.ceil(timeout))


def _ignore(reply, error):
    pass


def reply_failure(reply, what):
    """The XaError a non-200 reply stands for: the broker's XA code, else XAER_RMERR."""
    code = getattr(reply, "code", None)
    body = bytes(getattr(reply, "body", b""))
    parsed = wire.parse_xa_error(body) if code == 500 else None
    if parsed is not None:
        return XaError(parsed[0], "%s: %s" % (what, parsed[1]))
    return XaError(wire.XAER_RMERR, "%s: the broker answered %s %s" % (
        what, code if code is not None else type(reply).__name__, body[:200].decode("utf-8", "replace")))


def as_xa_error(error, what, unknown=wire.XAER_RMFAIL):
    """``error`` as an XaError: ``unknown`` for a timeout, XAER_RMFAIL when the connection was lost."""
    if isinstance(error, XaError):
        return error
    if isinstance(error, RequestTimeout):
        code = unknown
    elif isinstance(error, (ConnectionLost, Unavailable)):
        code = wire.XAER_RMFAIL
    else:
        code = wire.XAER_RMERR
    if code == wire.XAER_RMFAIL:
        what += ": outcome unknown"
    exc = XaError(code, "%s: %s" % (what, error))
    exc.__cause__ = error
    return exc


def rollback_code(failure):
    """The XA code a rollback-only transaction's commit raises: the failure's own XA_RB* code, else XA_RBROLLBACK."""
    code = getattr(failure, "xa_code", None)
    return code if code in ROLLED_BACK else wire.XA_RBROLLBACK


class Branch:
    """One transaction on one broker connection: its key, its ``transaction`` commands and its puts."""

    def __init__(self, conn, broker_id, tx_key, session_id, request_timeout):
        self.conn = conn
        self.broker_id = broker_id
        self.tx_key = tx_key
        self.session_id = session_id
        self.request_timeout = request_timeout
        self.failure = None  # the first failed put: the transaction is rollback-only
        self.connects = None  # the connection's connect_count when the transaction began
        self.aborted = False  # a best-effort ROLLBACK was sent after a failure
        self._lock = threading.Lock()
        self._pending = set()

    def command(self, tx_type, *, timeout=0, qualifier=None, unknown=wire.XAER_RMFAIL):
        """Send ``transaction <key> <session> <tx_type> ...`` and wait: the reply's body, or XaError."""
        what = "%s %s" % (tx_type, self.tx_key)
        event = ev.Transaction(self.tx_key, self.session_id, tx_type, 0, timeout, qualifier)
        try:
            reply = self.conn.call(event, self.request_timeout)
        except (ConnectionLost, RequestTimeout) as exc:
            raise as_xa_error(exc, what, unknown) from exc
        if isinstance(reply, ev.Result) and reply.code == 200:
            return bytes(reply.body)
        raise reply_failure(reply, what)

    def begin(self, timeout, qualifier=None):
        """BEGIN; remembers the connection it went on."""
        self.command("BEGIN", timeout=timeout, qualifier=qualifier, unknown=wire.XA_RBTIMEOUT)
        self.connects = self.conn.connect_count

    def same_connection(self):
        """True while the connection BEGIN went on is still open (a local transaction dies with it)."""
        return self.conn.connected and self.conn.connect_count == self.connects

    def end(self):
        """END: the broker does not answer it (fire and forget, as MetaQ's client)."""
        event = ev.Transaction(self.tx_key, self.session_id, "END", 0)
        self.conn.request_callback(event, _ignore, timeout=self.request_timeout)

    def quiet(self, tx_type):
        """A best-effort command (a rollback after a failure): errors are only logged."""
        try:
            self.command(tx_type)
        except XaError as exc:
            log.info("%s", exc)

    def put(self, put, partition, timeout, future, message=None):
        """Send ``put`` to ``partition`` inside the transaction; ``future`` gets its SendResult."""
        if type(put) is not ev.Put:
            raise ValueError("a delayed message (delay_level > 0, deliver_at or delay) cannot be sent inside a "
                             "transaction")
        with self._lock:
            self._pending.add(future)
        event = ev.Put(put.topic, partition.partition, put.flag, put.body, 0, put.checksum, self.tx_key)
        self.conn.request_callback(event, lambda reply, error: self._on_put(future, partition, message, reply, error),
                                   timeout=timeout)

    def _on_put(self, future, partition, message, reply, error):
        if error is None and isinstance(reply, ev.Result) and reply.code == 200:
            try:
                part = int(bytes(reply.body).split()[1])
                result = SendResult(True, Partition(self.broker_id, part), -1, -1)
            except (ValueError, IndexError):
                error = reply_failure(reply, "transactional put")
        elif error is None:
            error = _put_error(reply)
        if error is not None:
            result = SendResult(False, partition, error=error)
            if self.failure is None:
                self.failure = error
        elif message is not None:
            message.partition, message.id, message.offset = result.partition, None, None
        with self._lock:
            self._pending.discard(future)
        future.set_result(result)

    def wait_puts(self, timeout):
        """Wait for the replies of the puts in flight; one without a reply makes the transaction rollback-only."""
        with self._lock:
            pending = list(self._pending)
        _done, late = concurrent.futures.wait(pending, timeout)
        if late and self.failure is None:
            self.failure = RequestTimeout("%d transactional puts got no reply" % len(late))


def _put_error(reply):
    """The error of a failed transactional put: the broker's XA code, or what a plain put's failure means."""
    if getattr(reply, "code", None) == 500 and wire.parse_xa_error(getattr(reply, "body", b"")) is not None:
        return reply_failure(reply, "transactional put")
    return reply_error(reply)


class LocalTransaction:
    """A local transaction of a ``Producer``, made by ``producer.transaction()`` for the calling thread.

    Nothing is sent until the thread's first send: it picks a broker (the
    producer's selector, as usual) and sends ``BEGIN`` there. Every later
    send of that thread, until the transaction ends, is a transactional put to
    a partition of the same broker (the selector chooses among them); the
    transaction lives on the producer's connection to that broker. Sends
    return ``SendResult(True, partition, -1, -1)``: ids and offsets are given
    at commit. A failed send makes the transaction rollback-only (it is never
    retried or moved to another broker): ``commit`` then rolls back and
    raises. Sends of other threads are not part of it.

    ``commit()`` raises XaError: XA_RB* when the transaction was rolled back
    instead (a send failed, its timeout expired, the connection was lost
    before the commit), XAER_RMFAIL when the outcome is unknown (the reply to
    COMMIT was lost), or the broker's code.
    """

    def __init__(self, producer, timeout=None, request_timeout=None):
        self.producer = producer
        self.timeout = timeout_seconds(timeout)
        self.request_timeout = TX_REQUEST_TIMEOUT if request_timeout is None else request_timeout
        self.state = "open"  # then "committed", "rolled back" or "failed" (commit raised XAER_RMFAIL or the like)
        self._branch = None
        self._failure = None  # a failure before any put went out (no broker, BEGIN failed)
        self._lock = threading.RLock()

    @classmethod
    def open(cls, producer, timeout=None, request_timeout=None):
        """A new transaction for the calling thread (XaError XAER_PROTO if the thread already has one)."""
        if producer.current_transaction() is not None:
            raise XaError(wire.XAER_PROTO, "this thread already has an open transaction on this producer")
        tx = cls(producer, timeout, request_timeout)
        producer.bind_transaction(tx)
        return tx

    @property
    def is_open(self):
        """True until the transaction is committed or rolled back."""
        return self.state == "open"

    @property
    def tx_key(self):
        """``TX:<session>:<n>`` once the first send began the transaction, else None."""
        return self._branch.tx_key if self._branch is not None else None

    @property
    def broker_id(self):
        """The broker the transaction is on (None before the first send)."""
        return self._branch.broker_id if self._branch is not None else None

    @property
    def rollback_only(self):
        """True once a send failed: the transaction can only roll back."""
        return self._failed() is not None

    def _failed(self):
        return self._failure or (self._branch.failure if self._branch is not None else None)

    def send(self, message, timeout=None):
        """Send ``message`` inside the transaction and wait: a ``SendResult`` (never raises for broker trouble)."""
        limit = self.request_timeout + (self.producer.send_timeout if timeout is None else timeout) + 5.0
        return self.send_async(message, timeout=timeout).result(limit)

    def send_async(self, message, callback=None, timeout=None):
        """Start sending ``message`` inside the transaction; a Future of its ``SendResult``.

        The first send waits for BEGIN's reply. ``timeout`` bounds the put's reply (default ``send_timeout``).
        """
        put = self.producer.make_put(message)
        if self.producer.closed:
            raise RuntimeError("producer is closed")
        future = self.producer.new_future(callback)
        with self._lock:
            self._check_open("send")
            failure = self._failed()
            if failure is not None:
                failure = XaError(rollback_code(failure), "transaction is rollback-only: a send failed: %s" % failure)
                partition = None
            elif self._branch is None:
                partition = self._begin(message)
                failure = self._failed()  # BEGIN's own error
            else:
                partition = self._pick(message)
        if failure is not None:
            future.set_result(SendResult(False, partition, error=failure))
            return future
        put_timeout = self.producer.send_timeout if timeout is None else min(timeout, self.producer.send_timeout)
        self._branch.put(put, partition, put_timeout, future, message)
        return future

    def _begin(self, message):
        """Pick the broker with the first message and send BEGIN; the partition for that message."""
        producer = self.producer
        first = producer.choose_partition(message)
        conn = producer.broker_connection(first.broker_id) if first is not None else None
        if conn is None:
            self._failure = Unavailable("no broker is available for topic %s" % message.topic)
            return None
        key, session = producer.local_tx_key()
        branch = self._branch = Branch(conn, first.broker_id, key, session, self.request_timeout)
        try:
            branch.begin(self.timeout)
        except XaError as exc:
            branch.failure = exc
            if exc.xa_code == wire.XAER_RMFAIL:
                producer.mark_suspect(first.broker_id)
        return first

    def _pick(self, message):
        """A partition of the transaction's broker for ``message`` (the producer's selector chooses)."""
        return self.producer.choose_partition_on(self._branch.broker_id, message)

    def _check_open(self, action):
        if self.state != "open":
            raise XaError(wire.XAER_PROTO, "cannot %s: the transaction is %s" % (action, self.state))

    def commit(self):
        """Make every message sent in the transaction visible (COMMIT_ONE_PHASE); raises XaError (see the class)."""
        with self._lock:
            self._check_open("commit")
            branch = self._branch
            if branch is not None:
                branch.wait_puts(self.request_timeout + self.producer.send_timeout + 5.0)
            failure = self._failed()
            if failure is not None:
                self._finish_rollback()
                raise XaError(rollback_code(failure), "transaction %s rolled back: a send in it failed: %s"
                              % (self.tx_key, failure))
            if branch is None:
                self.state = "committed"
                return
            if not branch.same_connection():
                self.state = "rolled back"
                raise XaError(XA_RBCOMMFAIL, "transaction %s rolled back: the connection to broker %d was lost"
                              % (branch.tx_key, branch.broker_id))
            try:
                branch.command("COMMIT_ONE_PHASE")
            except XaError as exc:
                self.state = "rolled back" if exc.xa_code in ROLLED_BACK else "failed"
                raise
            self.state = "committed"

    def rollback(self):
        """Discard every message sent in the transaction (ROLLBACK; nothing to send when nothing was sent).

        A transaction the broker no longer knows (its timeout expired, its
        connection closed) counts as rolled back. XaError XAER_RMFAIL when the
        broker did not answer.
        """
        with self._lock:
            self._check_open("roll back")
            self._finish_rollback(quiet=False)

    def _finish_rollback(self, quiet=True):
        branch = self._branch
        self.state = "rolled back"
        if branch is None or (branch.connects is not None and not branch.same_connection()):
            return  # nothing began, or the broker rolled it back when the connection closed
        try:
            branch.command("ROLLBACK")
        except XaError as exc:
            gone = (exc.xa_code in ROLLED_BACK or exc.xa_code == wire.XAER_NOTA
                    or not branch.same_connection())  # a closed connection rolled it back
            if gone or (quiet and exc.xa_code == wire.XAER_RMFAIL):
                log.info("rollback of %s: %s", branch.tx_key, exc)
                return
            self.state = "failed"
            raise

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if self.state != "open":
            return False
        if exc_type is None:
            self.commit()
            return False
        try:
            self._finish_rollback()
        except MetaqError as rollback_error:
            log.warning("rollback of %s after %r failed: %s", self.tx_key, exc, rollback_error)
        return False

    def __repr__(self):
        return "<LocalTransaction %s %s on broker %s>" % (self.tx_key, self.state, self.broker_id)
