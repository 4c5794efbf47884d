"""The producer: pick a partition, ``put`` the message, retry elsewhere on failure.

    with Producer(zk_connect="127.0.0.1:2181") as producer:      # brokers found in ZooKeeper
        result = producer.send(Message("orders", b"hello"))
        if not result.success:
            print("not sent:", result.error)

    producer = Producer(brokers=["meta://127.0.0.1:8123"])     # or a direct broker list

Every send is pipelined: ``send_async`` returns a future at once and many puts
are in flight on each broker connection. A send that fails for a transient
reason (connection lost, timeout, 503, 507) is retried on another partition,
preferably on another broker, until ``retry_deadline``; the failing broker is
avoided for ``suspect_time`` seconds. With an ordered selector (``KeySelector``)
the message is retried on its own partition only, so per-key order holds.

Delivery is at least once by default: a put whose reply was lost may have
been stored, and its retry stores it again. With ``idempotent=True`` it is
exactly once into the broker: every send goes as ``put_idem`` with the
producer's id and a sequence number of its partition
(``metaq.idempotence.records``), its retries go to the same partition with
the same sequence, and the broker answers a resend of a stored message with
the original's id and offset (``SendResult.duplicate``) instead of storing it
again — across broker restarts, kill -9 and failover to a slave. At most
``limits.IDEMPOTENCE_WINDOW`` sends of one partition are unanswered at a time
(``send_async`` waits for room, so never call it from a send callback), so every
resend falls in the broker's window. With ``batch_bytes`` too, its sends go in its
partitions' batches as ``putb_idem`` frames, a sequence per message given when the
batch first goes (``reserve_sequences``), as Kafka's idempotent producer batches.

    producer = Producer(brokers=["meta://127.0.0.1:8123"], idempotent=True)
    result = producer.send(Message("orders", b"hello"))   # result.duplicate: stored by an earlier attempt
"""

import heapq
import itertools
import logging
import random
import threading
import time
import zlib
from concurrent.futures import Future

from metaq import limits
from metaq.idempotence import limits as idempotence_limits
from metaq.errors import BrokerError, ConnectionLost, RequestTimeout, Unauthenticated, Unavailable
from metaq.protocol import events as ev
from metaq.idempotence.wire import IdempotentPut
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.compression import sys_flag_of
from metaq.idempotence.records import MAX_PID
from metaq.idempotence.wire import DUPLICATE_MARK
from metaq.transactions import wire
from metaq.client.batching import Batcher, ManySend, SendFuture
from metaq.client.connection import ConnectionPool
from metaq.client.discovery import open_discovery
from metaq.client.message import Message, Partition, SendResult
from metaq.client.replies import reply_error
from metaq.client.reqreply import request as send_request
from metaq.client.idempotence import Sequences as _Sequences
from metaq.client.selectors import as_selector
from metaq.client.transactions import LocalTransaction, new_session_id
from metaq.client.timers import cancel as cancel_timer

__all__ = ["Producer"]

log = logging.getLogger(__name__)

_RETRYABLE = (ConnectionLost, RequestTimeout, Unavailable)
_MAX_BACKOFF_S = 1.0


class _Send:
    """One message on its way: where it went, what failed, until when it may be retried."""

    __slots__ = ("message", "put", "future", "deadline", "partition", "failed", "error", "attempts", "seq",
                 "sequences", "new_topic")

    def __init__(self, message, put, future, deadline):
        self.message = message
        self.put = put
        self.future = future
        self.deadline = deadline
        self.partition = None
        self.failed = set()  # broker ids that failed this send
        self.error = None
        self.attempts = 0
        self.seq = None  # idempotent: the sequence of (topic, partition) given when the partition was chosen
        self.sequences = None  # idempotent: that (topic, partition)'s _Sequences
        self.new_topic = False  # idempotent: sent to partition 0 of a topic the broker did not have yet


class Producer:
    """Sends messages to MetaQ brokers found in ZooKeeper (``zk_connect``) or listed directly (``brokers``).

    Give exactly one of ``zk_connect`` (e.g. ``"127.0.0.1:2181"``, brokers
    under ``zk_root``) and ``brokers`` (``["meta://host:port", ...]``).
    ``selector`` picks the partition (default ``RoundRobinSelector``; also
    ``RandomSelector``, ``KeySelector`` or any ``fn(topic, partitions, message)``).
    ``send_timeout`` bounds one attempt, ``retry_deadline`` the whole send with
    its retries. ``security``: credentials and TLS (``metaq.client.security``; None: from the environment);
    brokers that refuse them fail sends at once with ``errors.Unauthenticated`` (never retried).
    ``idempotent=True``: exactly once into the broker (see the module docstring): ``producer_id`` (1..2^63-1)
    names this producer's sequences; None picks a random one. A producer that restarts (a retried Spark task)
    and must not store again what its previous run stored reuses its id *and* sends the same messages in the
    same order per partition. Delayed messages, transactions and ``send_oneway`` are refused with it.
    ``compress_over`` (bytes, None: never): longer bodies are sent compressed with ``compression`` (``zlib``,
    ``zstd``, ``lz4``); the broker stores them decompressed, so every reader gets the original bytes.
    ``batch_bytes`` (bytes, None: off): plain sends of a partition go together as one ``putb`` of at most that
    many bytes (at most the broker's ``limits.max_body_bytes``), closed when full or ``linger_ms`` after its first
    message (a lone message waits its linger, as Kafka's: ``linger_ms=0`` sends it at once); at most
    ``max_in_flight`` batches on the wire per broker, one per partition (retries keep a partition's order), at most
    ``buffer_bytes`` waiting (``send_async`` then waits). See ``metaq.client.batching``. An idempotent producer's
    batches are ``putb_idem``: every ``send_async`` goes through its partition's lane (``reserve_sequences``).
    Thread-safe; close it (or use ``with``) when done.
    """

    def __init__(self, zk_connect=None, brokers=None, *, zk_root="/meta", selector=None, send_timeout=3.0,
                 retry_deadline=10.0, connect_timeout=3.0, heartbeat_interval=10.0, suspect_time=3.0,
                 zk_session_timeout=10.0, refresh_interval=30.0, max_body_bytes=limits.MAX_BODY_BYTES, security=None,
                 idempotent=False, producer_id=None, compress_over=None, compression="zlib", batch_bytes=None,
                 linger_ms=5, max_in_flight=5, buffer_bytes=32 << 20):
        if (zk_connect is None) == (brokers is None):
            raise ValueError("give exactly one of zk_connect and brokers")  # before any connection is made
        sys_flag_of(compression)  # ValueError for an unknown codec, before any connection is made
        if compress_over is not None and (isinstance(compress_over, bool) or not isinstance(compress_over, int)
                                          or compress_over < 0):
            raise ValueError("compress_over must be an int >= 0 (bytes) or None, got %r" % (compress_over,))
        self.compress_over, self.compression = compress_over, compression
        if producer_id is not None:
            if not idempotent:
                raise ValueError("producer_id is for an idempotent producer: give idempotent=True too")
            if isinstance(producer_id, bool) or not isinstance(producer_id, int) or not 1 <= producer_id <= MAX_PID:
                raise ValueError("producer_id must be an int in 1..%d, got %r" % (MAX_PID, producer_id))
        self.idempotent = bool(idempotent)
        self.producer_id = (producer_id or random.SystemRandom().randint(1, MAX_PID)) if idempotent else None
        self._sequences = {}  # (topic, Partition) -> _Sequences (idempotent)
        #: the sequences of a batch that failed for good are given again (sequences_answered, rebase_sequences):
        #: only under an id of the producer's own, which no later producer resends under
        self.reuses_sequences = self.idempotent and producer_id is None
        self._window_lock = threading.Lock()  # taken directly on the hot path (a Condition's enter is Python code)
        self._window_cond = threading.Condition(self._window_lock)
        self.send_timeout = send_timeout
        self.retry_deadline = retry_deadline
        self.suspect_time = suspect_time
        self.max_body_bytes = max_body_bytes
        self.selector = as_selector(selector)
        self._ordered = bool(getattr(self.selector, "ordered", False))
        self._pool = ConnectionPool(connect_timeout=connect_timeout, request_timeout=send_timeout,
                                    heartbeat_interval=heartbeat_interval, security=security)
        self.discovery = open_discovery(zk_connect, brokers, pool=self._pool, zk_root=zk_root,
                                        zk_session_timeout=zk_session_timeout, timeout=send_timeout,
                                        refresh_interval=refresh_interval, retry_interval=suspect_time)
        self._topics_ok = set()
        self._batched_sizes = {}  # topic -> the largest body send_async puts in a batch as it is
        self._suspect = {}  # broker id -> monotonic time until which it is avoided
        self._cond = threading.Condition()
        self._retries = []  # heap of (due, seq, _Send)
        self._seq = itertools.count()
        self._count_lock = threading.Lock()
        self._started = 0  # sends begun / finished: their difference is in progress
        self._finished = 0
        self._closed = False
        self._random = random.Random()
        self._tx_local = threading.local()  # this thread's LocalTransaction (metaq.client.transactions)
        self._tx_bound = False  # some thread bound a transaction once: send_async must look for its own
        self._tx_session = None  # the session id of its transaction keys, made on first use
        self._tx_numbers = itertools.count(1)
        self._worker = threading.Thread(target=self._retry_loop, name="metaq-producer-retry", daemon=True)
        self._batcher = None
        self._many_options = (max_in_flight, buffer_bytes)
        self._many_rr = itertools.count()
        self._many = None  # send_many's batcher when batching is off
        self._new_topics = set()  # idempotent batches sent to partition 0 of a topic not created yet
        if batch_bytes is not None:
            self._batcher = Batcher(self, batch_bytes, linger_ms, max_in_flight, buffer_bytes)
        self._worker.start()

    # -- public API -----------------------------------------------------------------------

    def send(self, message, timeout=None):
        """Send ``message`` and wait for the outcome: a ``SendResult`` (never raises for broker or network trouble).

        ``timeout`` replaces ``retry_deadline`` for this message. Raises
        ValueError / TypeError / ``errors.InvalidTopic`` for a message that
        cannot be sent at all. On success ``message.id``, ``.partition`` and
        ``.offset`` are filled in. Inside this thread's ``transaction()`` the
        message is part of the transaction (see ``transaction``).
        """
        future = self.send_async(message, timeout=timeout)
        if self._batcher is not None:
            self._batcher.flush_now()  # the caller waits for this one: no lingering for company
        limit = (self.retry_deadline if timeout is None else timeout) + self.send_timeout + 5.0
        try:
            return future.result(limit)
        except TimeoutError:
            return SendResult(False, error=RequestTimeout("send did not finish in %.1f s" % limit))

    def send_async(self, message, callback=None, timeout=None):
        """Start sending ``message``; return a ``Future`` of its ``SendResult`` at once (pipelined).

        ``callback(result)`` is called once when the send is over, on a client
        thread: it must return quickly. Bad messages raise as in ``send``.
        """
        if self._plainly_batched(message):
            future = self._send_batched(message, callback, timeout)
            if future is not None:
                return future
        tx = self.current_transaction()
        if (self.idempotent or tx is not None) and message.priority is not None:
            raise ValueError("a message with a priority cannot be sent idempotently or in a transaction")
        if tx is not None:
            return tx.send_async(message, callback, timeout)
        put = self.make_put(message)
        if self._closed:
            raise RuntimeError("producer is closed")
        if self.idempotent and (message.delay_level or message.when):
            raise ValueError("an idempotent producer cannot send delayed messages (delay_level %d, when %s): the "
                             "broker re-stores the message when it is due" % (message.delay_level, message.when))
        future = self.new_future(callback)
        deadline = time.monotonic() + (self.retry_deadline if timeout is None else timeout)
        send = _Send(message, put, future, deadline)
        first, refused = self._first_partition(send)
        with self._count_lock:
            self._started += 1
        self._first_attempt(send, first, refused)
        return future

    def _plainly_batched(self, message):
        """Whether ``message`` goes the batcher's plain way (``_send_batched``): a batching producer outside a
        transaction, and a plain ``Message`` with nothing but a topic and a body."""
        return (self._batcher is not None and type(message) is Message and message.attribute is None
                and message.key is None and not message.properties and message.priority is None
                and message.when is None and not message.delay_level and not self._tx_bound)

    def _first_partition(self, send):
        """``(partition, refusal)`` of a send's first attempt: the selector's choice (its error, say no key, is
        raised here), sequenced at once for an idempotent producer that does not batch; no partition and the
        refusal when every broker refused our credentials or the sequence did not come in time."""
        try:
            first = self.choose_partition(send.message)
        except Unauthenticated as exc:  # every broker refused our credentials: no partition to try
            return None, exc
        if first is not None and self.idempotent and self._batcher is None:
            try:  # with batches, its sequence is given in its lane (_add_idempotent)
                first = self._sequenced(send, first, wait=True)
            except RequestTimeout as exc:
                return None, exc
        return first, None

    def _first_attempt(self, send, first, refused):
        """A counted send's first step: finished refused, retried later without a partition, added to its batch
        lane or batch, or attempted now."""
        message, put, future, deadline = send.message, send.put, send.future, send.deadline
        if refused is not None:
            self._finish(send, SendResult(False, error=refused))
        elif first is None:
            self._retry_later(send, self._no_partition(message.topic))
        elif self._batcher is not None and self.idempotent:
            self._add_idempotent(send, first)
        elif self._batcher is not None and first.partition >= 0 and self._batchable(put, message):
            try:
                self._batcher.add(message, future, first, put.flag, put.body, deadline)
            except RequestTimeout as exc:  # no room in the batches' buffer before the deadline
                self._finish(send, SendResult(False, first, error=exc))
        else:
            self._attempt(send, first)

    def _add_idempotent(self, send, partition):
        """An idempotent batching producer's send into its partition's lane (a topic not created yet: partition 0,
        which every topic has), whatever the message: one that cannot share a ``putb_idem`` (compressed, too large)
        goes alone in its turn, so every sequence of the partition is given in lane order by one rule
        (``reserve_sequences``, at a batch's first attempt: see ``send_many``)."""
        put, message = send.put, send.message
        if partition.partition < 0:
            partition = Partition(partition.broker_id, 0)
            self._new_topics.add(put.topic)
        try:
            self._batcher.add(message, send.future, partition, put.flag, put.body, send.deadline,
                              alone=not self._batchable(put, message))
        except RequestTimeout as exc:  # no room in the batches' buffer before the deadline
            self._finish(send, SendResult(False, partition, error=exc))

    def _send_batched(self, message, callback, timeout):
        """``send_async`` of a plain message (a body, nothing else: sent as it is, flag 0) into its partition's
        batch, without building its put (the batch is encoded whole when it closes); None, having done nothing,
        when it must go the general way (no partition known yet, too large for a batch, to be compressed)."""
        topic = message.topic
        largest = self._batched_sizes.get(topic)
        if largest is None:
            limits.validate_topic(topic)
            largest = self._batcher.largest(topic)
            if self.compress_over is not None:
                largest = min(largest, self.compress_over)
            self._batched_sizes[topic] = largest = min(largest, self.max_body_bytes)
        body = message.body
        if len(body) > largest:
            return None
        if self._closed:
            raise RuntimeError("producer is closed")
        try:
            partitions = self.discovery.partitions(topic)
            if not partitions:
                return None
            if self._suspect and not self._ordered:
                now = time.monotonic()
                partitions = [p for p in partitions if self._suspect.get(p.broker_id, 0) <= now] or partitions
            first = self.selector.select(topic, partitions, message)
        except Unauthenticated:
            return None
        if first.partition < 0:
            return None  # (an idempotent producer's goes to partition 0 by the general way: _add_idempotent)
        future = SendFuture()
        if callback is not None:
            future.add_done_callback(lambda f: self._run_callback(callback, f))
        with self._count_lock:
            self._started += 1
        try:
            self._batcher.add(message, future, first, 0, body,
                              time.monotonic() + (self.retry_deadline if timeout is None else timeout))
        except RequestTimeout as exc:  # no room in the batches' buffer before the deadline
            self.finish_failed([future], SendResult(False, first, error=exc))
        return future

    def send_many(self, topic, payloads, partition=None, key=None, timeout=None):
        """Send ``payloads`` (a list of bytes: bodies without attributes) to one partition of ``topic``; return ONE
        ``Future`` of a ``ManyResult`` at once, never a Python object per message.

        The partition: ``partition`` (a ``Partition`` of ``partitions(topic)``, or an index into that list), else
        the one ``key`` hashes to (as ``KeySelector`` picks for a message with that key), else the next in turn.
        The payloads are encoded by the C helper into ``putb`` frames of at most ``batch_bytes`` (256 KiB when
        batching is off) and 10,000 messages, stored in payload order, each frame whole or not at all. They go
        through the partition's batch lane: behind its earlier batches, several partitions' frames in flight at
        once, a frame retried on transient faults before the next of its partition goes. A refused frame fails the
        result with the broker's words (``ManyResult.error``). Not in a transaction.

        An idempotent producer sends ``putb_idem`` frames (docs/text-protocol.md "putb_idem") of at most
        ``limits.MAX_IDEMPOTENT_BATCH_MESSAGES``: each payload gets the partition's next sequence, in payload
        order, when its frame first goes (every earlier frame of the partition answered), and a retry resends
        the same frame, so the same sequences: a frame stored before a lost reply is answered as duplicates
        (``ManyResult.duplicates``) and nothing is stored twice. After a frame that fails for good, a producer
        under an id of its own (no ``producer_id``) stores the partition's next frames, in order (its sequences
        are given again: ``sequences_answered``, ``rebase_sequences``); with a ``producer_id`` given it keeps its
        sequences, so the partition's next frames are refused as a gap (unless it was stored after all) and a
        rerun under that id resends them in place. Without ``batch_bytes``, do not mix
        it with ``send_async`` to the same partition while either has sends unanswered (a single send that
        fails after a frame behind it took the next sequences leaves that frame a gap); with it, both go through
        the partition's lane and take its sequences by the one rule.
        """
        if self._closed:
            raise RuntimeError("producer is closed")
        if self.current_transaction() is not None:
            raise ValueError("send_many is not for a transaction: use send_async")
        if topic not in self._topics_ok:
            limits.validate_topic(topic)
            self._topics_ok.add(topic)
        if not isinstance(payloads, list):
            payloads = list(payloads)
        if not payloads:
            raise ValueError("send_many needs at least one payload")
        if set(map(type, payloads)) != {bytes}:  # before anything is queued: a call is taken whole or refused
            k = next(k for k, data in enumerate(payloads) if type(data) is not bytes)
            raise TypeError("payload %d is %s, not bytes" % (k, type(payloads[k]).__name__))
        longest = max(map(len, payloads))
        if longest > self.max_body_bytes:
            raise ValueError("a payload for topic %s is %d bytes: over the limit of %d bytes"
                             % (topic, longest, self.max_body_bytes))
        batcher = self._batcher or self._many_batcher()
        future = Future()
        future.set_running_or_notify_cancel()
        deadline = time.monotonic() + (self.retry_deadline if timeout is None else timeout)
        found = self.discovery.partitions(topic)
        parts = found
        if parts and all(p.partition < 0 for p in parts):  # a topic not created yet: a put creates partition 0
            parts = [Partition(p.broker_id, 0) for p in parts]
        parts = [p for p in parts if p.partition >= 0]
        if partition is not None:
            if isinstance(partition, int) and not -len(parts) <= partition < len(parts):
                raise ValueError("partition %d: topic %s has %d partitions here" % (partition, topic, len(parts)))
            target = parts[partition] if isinstance(partition, int) else partition
            # a broker with no such topic yet, while another has it: the put creates its partition 0
            created_by_put = target.partition == 0 and Partition(target.broker_id, -1) in found
            if target not in parts and not created_by_put:
                raise ValueError("partition %s is not one of topic %s's: %s" % (target, topic, parts))
        elif not parts:
            target = None
        elif key is not None:
            kb = key.encode("utf-8") if isinstance(key, str) else bytes(key)
            target = parts[zlib.crc32(kb) % len(parts)]
        else:
            target = parts[next(self._many_rr) % len(parts)]
        with self._count_lock:
            self._started += 1
        many = ManySend(future, target, len(payloads), self._one_finished)
        if target is None:
            many.expect(1)
            many.chunk_done(0, len(payloads), None, self._no_partition(topic))
        else:
            batcher.add_many(topic, target, payloads, deadline, many, self.idempotent)
        return future

    def _many_batcher(self):
        """The batcher of ``send_many`` when batching is off (else the producer's own): made on first use."""
        if self._many is None:
            with self._cond:
                if self._many is None:
                    max_in_flight, buffer_bytes = self._many_options
                    self._many = Batcher(self, min(256 * 1024, buffer_bytes, self.max_body_bytes), 0,
                                         max_in_flight, buffer_bytes)
        return self._many

    def _one_finished(self):
        with self._count_lock:
            self._finished += 1
            idle = self._finished == self._started
        if idle:
            with self._cond:
                self._cond.notify_all()

    def _batchable(self, put, message):
        """A plain put, not compressed, that fits in a batch (the rest is sent alone, as without batching)."""
        return (type(put) is ev.Put and (self.compress_over is None or len(message.body) <= self.compress_over)
                and self._batcher.fits(put.topic, len(put.body)))

    def send_oneway(self, message):
        """Write ``message`` without waiting for the broker's answer; True once written to some broker.

        A broker that cannot be reached is skipped for another; nothing is retried after the write.
        Inside this thread's ``transaction()`` it is a transactional send (waits for the put's reply).
        """
        tx = self.current_transaction()
        if tx is not None:
            return tx.send(message).success
        if self.idempotent:
            raise ValueError("send_oneway cannot be idempotent (nothing is retried, no reply is read): "
                             "use send or send_async")
        put = self.make_put(message)
        if self._closed:
            raise RuntimeError("producer is closed")
        partitions = self.partitions(message.topic)
        tried = set()
        target = self.choose_partition(message)
        while target is not None:
            tried.add(target.broker_id)
            url = self.discovery.url(target.broker_id)
            try:
                if url is None:
                    raise ConnectionLost("broker %d is not registered" % target.broker_id)
                self._pool.get(url).send_oneway(put._replace(partition=target.partition))
                return True
            except ConnectionLost as exc:
                self.mark_suspect(target.broker_id)
                log.info("one-way send to broker %d failed: %s", target.broker_id, exc)
            others = [p for p in partitions if p.broker_id not in tried]
            target = self._random.choice(others) if others and not self._ordered else None
        log.warning("one-way message for topic %s dropped: no broker could be reached", message.topic)
        return False

    def transaction(self, timeout=None, request_timeout=None):
        """Open a local transaction for the calling thread (MetaQ's, reference §7.4); a ``LocalTransaction``:

            with producer.transaction(timeout=30):
                producer.send(Message("orders", b"a"))
                producer.send(Message("orders", b"b"))

        Nothing is sent yet: the thread's first send picks a broker as usual and begins the transaction there
        (``timeout`` seconds, None: the broker's default), later sends go to partitions of that broker and are
        never retried elsewhere. Leaving the block commits (all messages become visible at once), an exception
        rolls back; ``tx.commit()`` and ``tx.rollback()`` work too. ``request_timeout`` bounds each
        ``transaction`` command. Sends of other threads are not part of it.
        """
        if self.idempotent:
            raise ValueError("an idempotent producer cannot open transactions: use one without idempotent=True")
        return LocalTransaction.open(self, timeout, request_timeout)

    def cancel(self, msg_id, timeout=3.0):
        """Cancel a message sent with ``deliver_at`` or ``delay`` before it is due (docs/messaging.md "Cancel"):
        ``"cancelled"``; ``"delivered"`` or ``"cancelled"`` (before): too late; ``"unknown"``. Raises MetaqError
        (client/timers.py)."""
        return cancel_timer(self, msg_id, timeout)

    def request(self, message, timeout=3.0):
        """Send ``message`` as a request and wait up to ``timeout`` s for its reply (a Message): ``reqreply.client``."""
        return send_request(self, message, timeout)

    def partitions(self, topic):
        """The partitions ``topic`` is sent to now, sorted by (broker_id, partition).

        ``Partition(b, -1)`` stands for a broker where the topic is not created
        yet (direct mode: ``stats <topic>`` says 0 partitions; ZooKeeper: no
        broker registered the topic): the first put creates it, on a partition
        the broker picks, and the real partitions are read again.
        """
        limits.validate_topic(topic)
        return list(self.discovery.partitions(topic))

    def flush(self, timeout=None):
        """Wait until every message sent so far has its result; False if ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._batcher is not None:
            self._batcher.flush_now()
        with self._cond:
            while self._started != self._finished:
                left = 1.0 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 1.0))
        return True

    def close(self, timeout=10.0):
        """Wait up to ``timeout`` seconds for sends in progress, then close connections (and ZooKeeper).

        Sends still unfinished get ``success=False`` with ``ConnectionLost``.
        """
        if self._closed:
            return
        self.flush(timeout)
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._worker.join(5)
        for batcher in (self._batcher, self._many):
            if batcher is not None:
                batcher.close()
        self._pool.close()
        self.discovery.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- routing, for transactions (metaq.client.transactions) and XAResource (metaq.client.xa) ----

    @property
    def closed(self):
        """True once ``close`` began: nothing more may be sent."""
        return self._closed

    def make_put(self, message):
        """Validate ``message`` and build its ``put`` event (partition -1: each attempt fills in its own).

        Raises TypeError for a non-Message, ``errors.InvalidTopic`` and ValueError (over
        ``max_body_bytes``) for a message that cannot be sent at all.
        """
        if not isinstance(message, Message):
            raise TypeError("expected a metaq.client.Message, got %s" % type(message).__name__)
        if message.topic not in self._topics_ok:
            limits.validate_topic(message.topic)
            self._topics_ok.add(message.topic)
        if len(message.body) > self.max_body_bytes:  # compressed or not, it is stored whole
            raise ValueError("message for topic %s has a body of %d bytes: over the limit of %d bytes"
                             % (message.topic, len(message.body), self.max_body_bytes))
        flag, data = message.encode(self.compress_over, self.compression)
        if len(data) > self.max_body_bytes:
            raise ValueError("message for topic %s is %d bytes (body and attribute): over the limit of %d bytes"
                             % (message.topic, len(data), self.max_body_bytes))
        return message.put_event(flag, data, metaq_checksum(data))

    def choose_partition(self, message):
        """The partition the selector picks for ``message`` (among brokers not suspect, unless the selector is
        ordered or all are), or None when the topic has no partition anywhere. A selector's error is raised."""
        partitions = self.discovery.partitions(message.topic)
        if not partitions:
            return None
        if not self._ordered and self._suspect:
            now = time.monotonic()
            healthy = [p for p in partitions if self._suspect.get(p.broker_id, 0) <= now]
            partitions = healthy or partitions
        return self.selector.select(message.topic, partitions, message)

    def _no_partition(self, topic):
        """The error of a send that found no partition of ``topic``, saying why when discovery knows
        (``... for topic t: meta://127.0.0.1:8123: cannot connect to ...: connection refused``)."""
        why = self.discovery.why_none(topic)
        return Unavailable("no partition is available for topic %s%s" % (topic, ": " + why if why else ""))

    def choose_partition_on(self, broker_id, message):
        """The partition the selector picks for ``message`` among ``broker_id``'s partitions of its topic
        (``Partition(broker_id, -1)`` when it has none yet): where a transaction on that broker sends."""
        parts = [p for p in self.partitions(message.topic) if p.broker_id == broker_id]
        return self.selector.select(message.topic, parts or [Partition(broker_id, -1)], message)

    def broker_connection(self, broker_id):
        """The producer's connection to ``broker_id`` (its master), or None when the broker is not known."""
        url = self.discovery.url(broker_id)
        return self._pool.get(url) if url is not None else None

    def connection(self, url):
        """The producer's (pooled, shared) connection to the broker at ``url``."""
        return self._pool.get(url)

    def mark_suspect(self, broker_id):
        """Avoid ``broker_id`` for ``suspect_time`` seconds (it failed a request)."""
        self._suspect[broker_id] = time.monotonic() + self.suspect_time

    def new_future(self, callback=None):
        """A running Future for a ``SendResult``; ``callback(result)`` runs when it is set (errors are logged)."""
        future = SendFuture()
        if callback is not None:
            future.add_done_callback(lambda f: self._run_callback(callback, f))
        return future

    def current_transaction(self):
        """The calling thread's open local transaction, or None."""
        tx = getattr(self._tx_local, "tx", None)
        return tx if tx is not None and tx.is_open else None

    def bind_transaction(self, tx):
        """Make ``tx`` the calling thread's transaction: its sends go through ``tx.send_async`` until it ends."""
        self._tx_bound = True
        self._tx_local.tx = tx

    def local_tx_key(self):
        """``(key, session_id)`` of a new local transaction: ``TX:<session>:<n>``, one session per producer."""
        with self._count_lock:
            if self._tx_session is None:
                self._tx_session = new_session_id()
            session = self._tx_session
        return wire.LocalTxId(session, next(self._tx_numbers)).key, session

    # -- one send -------------------------------------------------------------------------

    def _attempt(self, send, partition):
        """Send one put to ``partition``; the reply arrives in ``_on_reply``."""
        send.attempts += 1
        send.partition = partition
        remaining = send.deadline - time.monotonic()
        url = self.discovery.url(partition.broker_id)
        if url is None:
            self._retry_later(send, ConnectionLost("broker %d is not registered" % partition.broker_id))
            return
        try:
            conn = self._pool.get(url)
        except ConnectionLost as exc:  # the producer is closing
            self._finish(send, SendResult(False, partition, error=exc))
            return
        p = send.put
        if send.seq is not None:
            put = IdempotentPut(p.topic, partition.partition, p.flag, p.body, 0, p.checksum, self.producer_id,
                                   send.seq)
        elif type(p) is ev.Put:
            put = ev.Put(p.topic, partition.partition, p.flag, p.body, 0, p.checksum)
        else:  # a DelayedPut or a PriorityPut
            put = p._replace(partition=partition.partition)
        conn.request_callback(put, lambda reply, error: self._on_reply(send, partition, reply, error),
                              timeout=max(0.001, min(self.send_timeout, remaining)))

    def _on_reply(self, send, partition, reply, error):
        """Runs on a connection's reader thread (or where the request failed): never blocks."""
        if error is None:
            if isinstance(reply, ev.Result) and reply.code == 200:
                self._succeeded(send, partition, reply)
                return
            error = reply_error(reply)
            if (error.code == 400 and partition.partition == -1
                    and len({p.broker_id for p in self.discovery.cached(send.put.topic)}) > 1):
                self.discovery.refuse(send.put.topic, partition.broker_id)  # the broker does not take this topic
                send.failed.add(partition.broker_id)
                self._retry_later(send, error)
                return
        if isinstance(error, _RETRYABLE):
            self.mark_suspect(partition.broker_id)
            send.failed.add(partition.broker_id)
            self._retry_later(send, error)
        else:
            self._finish(send, SendResult(False, partition, error=error))

    def _succeeded(self, send, partition, reply):
        tokens = reply.body.split()
        duplicate = len(tokens) == 4 and send.seq is not None and tokens[3] == DUPLICATE_MARK
        try:
            msg_id, part, offset = (int(x) for x in (tokens[:3] if duplicate else tokens))
        except ValueError:
            self._finish(send, SendResult(False, partition, error=BrokerError("bad put reply %r" % reply.body)))
            return
        stored = Partition(partition.broker_id, part)
        if partition.partition == -1 or send.new_topic:
            self.discovery.invalidate(send.put.topic)  # the topic exists now: learn its partitions
        message = send.message
        if offset < 0:  # a delayed message: its offset is known only when it is delivered
            offset = None
        message.id, message.partition, message.offset = msg_id, stored, offset
        self._finish(send, SendResult(True, stored, offset, msg_id, duplicate=duplicate))

    def _sequenced(self, send, partition, wait):
        """Give an idempotent send its partition for good (-1, a topic not created yet: 0, which every topic
        has) and that partition's next sequence, once fewer than ``IDEMPOTENCE_WINDOW`` are unanswered there
        (``wait``: for room until the send's deadline, then RequestTimeout; else None at once without room)."""
        if partition.partition == -1:
            partition = Partition(partition.broker_id, 0)
            send.new_topic = True
        key = (send.put.topic, partition)
        with self._window_lock:
            seqs = self._sequences.get(key)
            if seqs is None:
                seqs = self._sequences[key] = _Sequences()
            if seqs.next - seqs.low >= idempotence_limits.IDEMPOTENCE_WINDOW:
                if not wait:
                    return None
                # wait until half the window is free, not for one slot: the sends then go out in bursts
                while seqs.next - seqs.low > idempotence_limits.IDEMPOTENCE_WINDOW // 2:
                    left = send.deadline - time.monotonic()
                    if left <= 0 or self._closed:
                        raise RequestTimeout("%d sends to %s of %s are unanswered (limits.IDEMPOTENCE_WINDOW): no "
                                             "room for another before the deadline"
                                             % (seqs.next - seqs.low, partition, send.put.topic))
                    seqs.waiting = True
                    self._window_cond.wait(min(left, 1.0))
            send.seq = seqs.next
            send.sequences = seqs
            seqs.next += 1
        send.partition = partition
        return partition

    def reserve_sequences(self, key, count):
        """The first of ``count`` sequences of ``key`` (``(topic, Partition)``) for an idempotent batch now going
        out for the first time (``batching.Batcher._attempt``: a ``send_many`` frame, or a batch of
        ``send_async`` messages): the partition's next ones, in the batch's message order.

        The one rule for when a batched message gets its sequence: when its batch is first sent, not when it is
        sent by the caller. A partition has one batch on the wire and the next goes once it is answered, so
        each batch's sequences follow the previous batch's with no gap (the broker refuses a ``putb_idem`` that
        starts past the next sequence it expects); a message still waiting in the buffer, or failing there
        (no room before its deadline), holds none; only the batch on the wire holds unanswered sequences (at
        most ``MAX_IDEMPOTENT_BATCH_MESSAGES``, the window), so ``send_async`` never waits for the window; and
        a retry resends the frame encoded at the first attempt, so the same sequences."""
        with self._window_lock:
            seqs = self._sequences.get(key)
            if seqs is None:
                seqs = self._sequences[key] = _Sequences()
            first = seqs.next
            seqs.next += count
        return first

    def rebase_sequences(self, key, first, count, expected):
        """An idempotent batch holding sequences ``first .. first + count - 1`` of ``key`` was refused whole, no
        attempt of it of unknown outcome: as a gap, the broker expecting ``expected`` next (the batches before it
        that failed for good were never stored), or (``expected`` None) because the broker holds other messages
        under its sequences. The batch's new first sequence (it is sent again under it, so the partition's later
        messages are still stored, in order, after a failed batch: ``Sequences.rebase``, ``Sequences.skip``), or
        None when it must fail as refused: ``producer_id`` was given (a producer made again with that id resends
        from sequence 0 and relies on each message keeping its sequence: the broker's refusals keep the later
        ones for it), or the move is not sound."""
        if not self.reuses_sequences:
            return None
        with self._window_lock:
            seqs = self._sequences[key]
            return seqs.skip(first, count) if expected is None else seqs.rebase(first, count, expected)

    def sequences_answered(self, key, first, count, unstored=False):
        """An idempotent batch's sequences are answered (stored, duplicates, or failed for good). ``unstored``: it
        failed for good and nothing of it is or will be stored (``idempotence.client.frees_sequences``): the
        partition's next batch takes its sequences again (``Sequences.release``), so the broker, which expects
        the first of them next, stores it and the later ones, in order. Not when ``producer_id`` was given (see
        ``rebase_sequences``): the later batches are then refused as a gap."""
        with self._window_lock:
            seqs = self._sequences[key]
            if unstored and self.reuses_sequences:
                seqs.release(first, count)
            else:
                seqs.finished_run(first, count)
            if seqs.waiting and seqs.next - seqs.low <= idempotence_limits.IDEMPOTENCE_WINDOW // 2:
                seqs.waiting = False
                self._window_cond.notify_all()

    def finish_failed(self, futures, result):
        """A batch's ``futures`` (none done yet) failed with ``result`` (one ``SendResult`` for all), counted once."""
        for future in futures:
            future.settle(result)
        self._count_finished(len(futures))

    def finish_stored(self, messages, futures, runs):
        """A batch's ``messages`` (their futures not done) were stored as ``runs``: ``(first_id, Partition,
        first_offset, count)`` in order, an idempotent batch's with a fifth field, True for a run of duplicates
        (the originals' ids and offsets; offset -1, one older than the broker's window: None, as a single send's).
        Each message's fields and future are set (its own id and offset), counted once."""
        k = 0
        new = tuple.__new__
        if runs and len(runs[0]) == 5:
            if self._new_topics and messages[0].topic in self._new_topics:
                self._new_topics.discard(messages[0].topic)
                self.discovery.invalidate(messages[0].topic)  # the topic exists now: learn its partitions
            for first_id, stored, offset, count, dup in runs:
                for j in range(count):
                    message = messages[k + j]
                    at = offset + j if offset >= 0 else None
                    message.id, message.partition, message.offset = first_id + j, stored, at
                    futures[k + j].settle(new(SendResult, (True, stored, at, first_id + j, None, dup)))
                k += count
            self._count_finished(len(messages))
            return
        for first_id, stored, offset, count in runs:
            for j in range(count):
                message = messages[k + j]
                message.id, message.partition, message.offset = first_id + j, stored, offset + j
                futures[k + j].settle(new(SendResult, (True, stored, offset + j, first_id + j, None, False)))
            k += count
        self._count_finished(len(messages))

    def _count_finished(self, n):
        with self._count_lock:
            self._finished += n
            idle = self._finished == self._started
        if idle:
            with self._cond:
                self._cond.notify_all()

    def _finish(self, send, result):
        if send.future.done():
            return
        if send.seq is not None:
            seqs = send.sequences
            with self._window_lock:
                seqs.finished(send.seq)
                if seqs.waiting and seqs.next - seqs.low <= idempotence_limits.IDEMPOTENCE_WINDOW // 2:
                    seqs.waiting = False
                    self._window_cond.notify_all()
        send.future.set_result(result)  # runs the callbacks
        with self._count_lock:
            self._finished += 1
            idle = self._finished == self._started
        if idle:
            with self._cond:
                self._cond.notify_all()

    @staticmethod
    def _run_callback(callback, future):
        try:
            callback(future.result())
        except Exception:
            log.exception("send callback %r failed", callback)

    # -- retries --------------------------------------------------------------------------

    def _retry_later(self, send, error):
        """Queue another attempt (at once if another broker may take it, else after a backoff) or give up."""
        send.error = error
        now = time.monotonic()
        if self._closed or now >= send.deadline:
            self._finish(send, SendResult(False, send.partition, error=error))
            return
        delay = min(_MAX_BACKOFF_S, 0.05 * 2 ** min(send.attempts, 10))
        if not self._ordered and send.seq is None and not self.idempotent and self._fresh_partitions(send, now):
            delay = 0.0
        with self._cond:
            heapq.heappush(self._retries, (min(now + delay, send.deadline), next(self._seq), send))
            self._cond.notify_all()

    def _fresh_partitions(self, send, now):
        """Partitions on brokers that have not failed this send and are not suspect."""
        return [p for p in self.discovery.cached(send.put.topic)
                if p.broker_id not in send.failed and self._suspect.get(p.broker_id, 0) <= now]

    def _retry_partition(self, send):
        """Where to try next: the same partition when ordered, else preferably a fresh broker."""
        if (self._ordered or send.seq is not None) and send.partition is not None:
            return send.partition  # an idempotent send keeps its partition: its sequence belongs there
        if send.partition is None:
            return self.choose_partition(send.message)
        now = time.monotonic()
        partitions = self.discovery.partitions(send.put.topic)
        candidates = (self._fresh_partitions(send, now)
                      or [p for p in partitions if p.broker_id not in send.failed]
                      or [p for p in partitions if self._suspect.get(p.broker_id, 0) <= now]
                      or partitions)
        return self._random.choice(candidates) if candidates else None

    def _retry_loop(self):
        while True:
            with self._cond:
                while not self._closed and (not self._retries or self._retries[0][0] > time.monotonic()):
                    wait = self._retries[0][0] - time.monotonic() if self._retries else 1.0
                    self._cond.wait(max(0.001, min(wait, 1.0)))
                if self._closed:
                    pending, self._retries = self._retries, []
                else:
                    pending = [heapq.heappop(self._retries)]
            if self._closed:
                for _due, _seq, send in pending:
                    self._finish(send, SendResult(False, send.partition, error=ConnectionLost("producer closed")))
                return
            for _due, _seq, send in pending:
                self._retry(send)

    def _retry(self, send):
        if time.monotonic() >= send.deadline:
            self._finish(send, SendResult(False, send.partition, error=send.error))
            return
        try:
            target = self._retry_partition(send)
        except Exception as exc:  # a custom selector failed
            self._finish(send, SendResult(False, send.partition, error=exc))
            return
        if target is not None and self.idempotent and send.seq is None:  # its first partition, found only now
            if self._batcher is not None:
                self._add_idempotent(send, target)  # may wait for buffer room, as send_async does
                return
            target = self._sequenced(send, target, wait=False)  # never wait here: replies free the room
        if target is None:
            self._retry_later(send, self._no_partition(send.put.topic) if send.partition is None else send.error)
        else:
            self._attempt(send, target)
