"""The producer: pick a partition, ``put`` the message, retry elsewhere on failure.

    with Producer(zk_connect="127.0.0.1:2181") as producer:      # brokers found in ZooKeeper
        result = producer.send(Message("orders", b"hello"))
        if not result.success:
            print("not sent:", result.error)

    producer = Producer(brokers=["meta://127.0.0.1:8123"])     # or a direct broker list

Every send is pipelined: ``send_async`` returns a future at once and many puts
are in flight on each broker connection. A send that fails for a transient
reason (connection lost, timeout, 503) is retried on another partition,
preferably on another broker, until ``retry_deadline``; the failing broker is
avoided for ``suspect_time`` seconds. With an ordered selector (``KeySelector``)
the message is retried on its own partition only, so per-key order holds.
Delivery is at least once: a put whose reply was lost may have been stored,
and its retry stores it again.
"""

import heapq
import itertools
import logging
import random
import threading
import time
from concurrent.futures import Future

from metaq import limits
from metaq.errors import (BrokerError, ClientError, ConnectionLost, DiskFull, MetaqError, RequestTimeout,
                          Unavailable)
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol import stats as stats_codec
from metaq.client.connection import ConnectionPool, parse_url
from metaq.client.message import Message, Partition, SendResult
from metaq.client.selectors import as_selector

__all__ = ["Producer"]

log = logging.getLogger(__name__)

_RETRYABLE = (ConnectionLost, RequestTimeout, Unavailable)
_MAX_BACKOFF_S = 1.0


class _ZkDiscovery:
    """Partitions from ZooKeeper's ``topics-pub`` (via ZkCluster), cached until a watch says they changed.

    A topic no broker lists yet (it is created by its first put) gets
    ``Partition(id, -1)`` for every registered master: the broker picks the partition.
    """

    def __init__(self, cluster):
        self.cluster = cluster
        self._lock = threading.Lock()
        self._parts = {}
        self._last = {}  # survives invalidation, for readers that must not block
        self._gen = {}
        self._urls = None
        self._refusing = set()  # (topic, broker id)

    def partitions(self, topic):
        parts = self._parts.get(topic)
        if parts is not None:
            return parts
        with self._lock:
            if topic not in self._gen:
                self._gen[topic] = 0
                self.cluster.watch_topic(topic, lambda: self._changed(topic))
            gen = self._gen[topic]
        parts = self.cluster.publish_partitions(topic)
        if not parts:
            parts = [Partition(bid, -1) for bid in sorted(self.cluster.broker_urls())
                     if (topic, bid) not in self._refusing]
        self._last[topic] = parts
        with self._lock:
            if self._gen[topic] == gen:
                self._parts[topic] = parts
        return parts

    def cached(self, topic):
        """The partitions last read for ``topic`` ([] if none), without reading ZooKeeper."""
        return self._last.get(topic, [])

    def _changed(self, topic):
        with self._lock:
            self._gen[topic] = self._gen.get(topic, 0) + 1
            self._parts.pop(topic, None)
            self._urls = None

    def url(self, broker_id):
        urls = self._urls
        if urls is None:
            urls = self._urls = self.cluster.broker_urls()
        return urls.get(broker_id)

    def invalidate(self, topic):
        self._changed(topic)

    def refuse(self, topic, broker_id):
        self._refusing.add((topic, broker_id))
        self._changed(topic)

    def close(self):
        self.cluster.close()


class _DirectDiscovery:
    """Partitions asked from a fixed broker list with ``stats`` (broker id) and ``stats <topic>`` (partition count).

    A broker where the topic does not exist yet contributes ``Partition(id, -1)``:
    the put lets the broker choose. Answers are cached for ``refresh_interval``
    seconds, and for only ``retry_interval`` when a broker did not answer.
    """

    def __init__(self, urls, pool, timeout, refresh_interval, retry_interval):
        self.urls = list(urls)
        for url in self.urls:
            parse_url(url)
        self.pool = pool
        self.timeout = timeout
        self.refresh_interval = refresh_interval
        self.retry_interval = retry_interval
        self._lock = threading.Lock()
        self._ids = {}  # url -> broker id
        self._by_id = {}  # broker id -> url
        self._topics = {}  # topic -> (partitions, expires_at)
        self._refusing = set()  # (topic, broker id): said it does not accept the topic

    def partitions(self, topic):
        entry = self._topics.get(topic)
        if entry is not None and entry[1] > time.monotonic():
            return entry[0]
        locked = self._lock.acquire(timeout=self.timeout * 2 + 10) if entry is None else self._lock.acquire(False)
        if not locked:
            return entry[0] if entry is not None else []  # another thread is refreshing: use what we have
        try:
            entry = self._topics.get(topic)
            if entry is None or entry[1] <= time.monotonic():
                entry = self._topics[topic] = self._discover(topic)
            return entry[0]
        finally:
            self._lock.release()

    def _discover(self, topic):
        asked = []
        for url in self.urls:
            conn = self.pool.get(url)
            id_future = None if url in self._ids else conn.request(ev.Stats(None, 0), self.timeout)
            asked.append((url, id_future, conn.request(ev.Stats(topic, 0), self.timeout)))
        parts, complete = [], True
        for url, id_future, topic_future in asked:
            try:
                if id_future is not None:
                    self._learn_id(url, id_future.result(self.timeout + 5))
                stats = topic_future.result(self.timeout + 5)
                count = stats_codec.parse_topic(stats.body).partitions if stats.code == 200 else 0
            except (MetaqError, TimeoutError, ValueError, KeyError) as exc:
                log.info("broker %s did not describe topic %s: %s", url, topic, exc)
                complete = False
                continue
            bid = self._ids[url]
            if count > 0:
                parts.extend(Partition(bid, p) for p in range(count))
            elif (topic, bid) not in self._refusing:
                parts.append(Partition(bid, -1))
        ttl = self.refresh_interval if complete else min(self.refresh_interval, self.retry_interval)
        return sorted(parts), time.monotonic() + ttl

    def cached(self, topic):
        """The last partitions found for ``topic`` (never asks the brokers: safe on a reader thread)."""
        entry = self._topics.get(topic)
        return entry[0] if entry is not None else []

    def _learn_id(self, url, reply):
        if reply.code != 200:
            raise BrokerError("stats answered %d" % reply.code)
        bid = int(stats_codec.parse_summary(reply.body)["broker_id"])
        self._ids[url] = bid
        self._by_id[bid] = url

    def url(self, broker_id):
        return self._by_id.get(broker_id)

    def invalidate(self, topic):
        entry = self._topics.get(topic)
        if entry is not None:
            self._topics[topic] = (entry[0], 0.0)

    def refuse(self, topic, broker_id):
        self._refusing.add((topic, broker_id))
        self.invalidate(topic)

    def close(self):
        pass


class _Send:
    """One message on its way: where it went, what failed, until when it may be retried."""

    __slots__ = ("message", "put", "future", "deadline", "partition", "failed", "error", "attempts")

    def __init__(self, message, put, future, deadline):
        self.message = message
        self.put = put
        self.future = future
        self.deadline = deadline
        self.partition = None
        self.failed = set()  # broker ids that failed this send
        self.error = None
        self.attempts = 0


def _reply_error(reply):
    """The error a non-200 put reply stands for."""
    reason = reply.body.decode("utf-8", "replace") if isinstance(reply, ev.Result) else "unexpected reply"
    code = getattr(reply, "code", 500)
    if code == 400:
        return ClientError(reason)
    if code == 503:
        return DiskFull(reason) if "disk" in reason.lower() else Unavailable(reason)
    if code == 500:
        return BrokerError(reason)
    error = MetaqError("put answered %s: %s" % (code, reason))
    error.code = code
    return error


class Producer:
    """Sends messages to MetaQ brokers found in ZooKeeper (``zk_connect``) or listed directly (``brokers``).

    Give exactly one of ``zk_connect`` (e.g. ``"127.0.0.1:2181"``, brokers
    under ``zk_root``) and ``brokers`` (``["meta://host:port", ...]``).
    ``selector`` picks the partition (default ``RoundRobinSelector``; also
    ``RandomSelector``, ``KeySelector`` or any ``fn(topic, partitions, message)``).
    ``send_timeout`` bounds one attempt, ``retry_deadline`` the whole send with
    its retries. Thread-safe; close it (or use ``with``) when done.
    """

    def __init__(self, zk_connect=None, brokers=None, *, zk_root="/meta", selector=None, send_timeout=3.0,
                 retry_deadline=10.0, connect_timeout=3.0, heartbeat_interval=10.0, suspect_time=3.0,
                 zk_session_timeout=10.0, refresh_interval=30.0, max_body_bytes=limits.MAX_BODY_BYTES):
        if (zk_connect is None) == (brokers is None):
            raise ValueError("give exactly one of zk_connect and brokers")
        self.send_timeout = send_timeout
        self.retry_deadline = retry_deadline
        self.suspect_time = suspect_time
        self.max_body_bytes = max_body_bytes
        self.selector = as_selector(selector)
        self._ordered = bool(getattr(self.selector, "ordered", False))
        self._pool = ConnectionPool(connect_timeout=connect_timeout, request_timeout=send_timeout,
                                    heartbeat_interval=heartbeat_interval)
        if zk_connect is not None:
            from metaq.client.cluster import ZkCluster

            self._discovery = _ZkDiscovery(ZkCluster(zk_connect, root=zk_root, session_timeout=zk_session_timeout))
        else:
            urls = [u.strip() for u in brokers.split(",")] if isinstance(brokers, str) else list(brokers)
            if not urls:
                raise ValueError("brokers is empty")
            self._discovery = _DirectDiscovery(urls, self._pool, send_timeout, refresh_interval, suspect_time)
        self._topics_ok = set()
        self._suspect = {}  # broker id -> monotonic time until which it is avoided
        self._cond = threading.Condition()
        self._retries = []  # heap of (due, seq, _Send)
        self._seq = itertools.count()
        self._count_lock = threading.Lock()
        self._started = 0  # sends begun / finished: their difference is in progress
        self._finished = 0
        self._closed = False
        self._random = random.Random()
        self._tx_local = threading.local()  # this thread's LocalTransaction (metaq.client.transaction)
        self._tx_session = None  # the session id of its transaction keys, made on first use
        self._tx_numbers = itertools.count(1)
        self._worker = threading.Thread(target=self._retry_loop, name="metaq-producer-retry", daemon=True)
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
        tx = self._transaction()
        if tx is not None:
            return tx.send_async(message, callback, timeout)
        put = self._make_put(message)
        if self._closed:
            raise RuntimeError("producer is closed")
        future = Future()
        future.set_running_or_notify_cancel()
        if callback is not None:
            future.add_done_callback(lambda f: self._run_callback(callback, f))
        deadline = time.monotonic() + (self.retry_deadline if timeout is None else timeout)
        send = _Send(message, put, future, deadline)
        first = self._first_partition(message)  # a selector's error (say, no key) is raised here
        with self._count_lock:
            self._started += 1
        if first is None:
            self._retry_later(send, Unavailable("no partition is available for topic %s" % message.topic))
        else:
            self._attempt(send, first)
        return future

    def send_oneway(self, message):
        """Write ``message`` without waiting for the broker's answer; True once written to some broker.

        A broker that cannot be reached is skipped for another; nothing is retried after the write.
        Inside this thread's ``transaction()`` it is a transactional send (waits for the put's reply).
        """
        tx = self._transaction()
        if tx is not None:
            return tx.send(message).success
        put = self._make_put(message)
        if self._closed:
            raise RuntimeError("producer is closed")
        partitions = self.partitions(message.topic)
        tried = set()
        target = self._first_partition(message)
        while target is not None:
            tried.add(target.broker_id)
            url = self._discovery.url(target.broker_id)
            try:
                if url is None:
                    raise ConnectionLost("broker %d is not registered" % target.broker_id)
                self._pool.get(url).send_oneway(put._replace(partition=target.partition))
                return True
            except ConnectionLost as exc:
                self._mark_suspect(target.broker_id)
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

        Nothing is sent yet: the thread's first send picks a broker as usual
        and begins the transaction there (``timeout`` seconds, None: the
        broker's default), later sends go to partitions of that broker and are
        never retried elsewhere. Leaving the block commits (all messages become
        visible at once), an exception rolls back; ``tx.commit()`` and
        ``tx.rollback()`` work too. ``request_timeout`` bounds each
        ``transaction`` command. Sends of other threads are not part of it.
        """
        from metaq.client.transaction import LocalTransaction

        return LocalTransaction.open(self, timeout, request_timeout)

    def _transaction(self):
        """The calling thread's open local transaction, or None."""
        tx = getattr(self._tx_local, "tx", None)
        return tx if tx is not None and tx.is_open else None

    def partitions(self, topic):
        """The partitions ``topic`` is sent to now, sorted by (broker_id, partition).

        ``Partition(b, -1)`` stands for a broker where the topic is not created
        yet (direct mode: ``stats <topic>`` says 0 partitions; ZooKeeper: no
        broker registered the topic): the first put creates it, on a partition
        the broker picks, and the real partitions are read again.
        """
        limits.validate_topic(topic)
        return list(self._discovery.partitions(topic))

    def flush(self, timeout=None):
        """Wait until every message sent so far has its result; False if ``timeout`` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
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
        self._pool.close()
        self._discovery.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- one send -------------------------------------------------------------------------

    def _make_put(self, message):
        """Validate ``message`` and build its put (partition filled in per attempt)."""
        if not isinstance(message, Message):
            raise TypeError("expected a metaq.client.Message, got %s" % type(message).__name__)
        if message.topic not in self._topics_ok:
            limits.validate_topic(message.topic)
            self._topics_ok.add(message.topic)
        flag, data = message.encode()
        if len(data) > self.max_body_bytes:
            raise ValueError("message for topic %s is %d bytes (body and attribute): over the limit of %d bytes"
                             % (message.topic, len(data), self.max_body_bytes))
        if message.delay_level:
            return ev.DelayedPut(message.topic, -1, flag, data, 0, metaq_checksum(data), message.delay_level)
        return ev.Put(message.topic, -1, flag, data, 0, metaq_checksum(data))

    def _first_partition(self, message):
        partitions = self._discovery.partitions(message.topic)
        if not partitions:
            return None
        if not self._ordered and self._suspect:
            now = time.monotonic()
            healthy = [p for p in partitions if self._suspect.get(p.broker_id, 0) <= now]
            partitions = healthy or partitions
        return self.selector.select(message.topic, partitions, message)

    def _attempt(self, send, partition):
        """Send one put to ``partition``; the reply arrives in ``_on_reply``."""
        send.attempts += 1
        send.partition = partition
        remaining = send.deadline - time.monotonic()
        url = self._discovery.url(partition.broker_id)
        if url is None:
            self._retry_later(send, ConnectionLost("broker %d is not registered" % partition.broker_id))
            return
        try:
            conn = self._pool.get(url)
        except ConnectionLost as exc:  # the producer is closing
            self._finish(send, SendResult(False, partition, error=exc))
            return
        p = send.put
        if type(p) is ev.Put:
            put = ev.Put(p.topic, partition.partition, p.flag, p.body, 0, p.checksum)
        else:  # a DelayedPut
            put = p._replace(partition=partition.partition)
        conn.request_callback(put, lambda reply, error: self._on_reply(send, partition, reply, error),
                              timeout=max(0.001, min(self.send_timeout, remaining)))

    def _on_reply(self, send, partition, reply, error):
        """Runs on a connection's reader thread (or where the request failed): never blocks."""
        if error is None:
            if isinstance(reply, ev.Result) and reply.code == 200:
                self._succeeded(send, partition, reply)
                return
            error = _reply_error(reply)
            if (error.code == 400 and partition.partition == -1
                    and len({p.broker_id for p in self._discovery.cached(send.put.topic)}) > 1):
                self._discovery.refuse(send.put.topic, partition.broker_id)  # the broker does not take this topic
                send.failed.add(partition.broker_id)
                self._retry_later(send, error)
                return
        if isinstance(error, _RETRYABLE):
            self._mark_suspect(partition.broker_id)
            send.failed.add(partition.broker_id)
            self._retry_later(send, error)
        else:
            self._finish(send, SendResult(False, partition, error=error))

    def _succeeded(self, send, partition, reply):
        try:
            msg_id, part, offset = (int(x) for x in reply.body.split())
        except ValueError:
            self._finish(send, SendResult(False, partition, error=BrokerError("bad put reply %r" % reply.body)))
            return
        stored = Partition(partition.broker_id, part)
        if partition.partition == -1:
            self._discovery.invalidate(send.put.topic)  # the topic exists now: learn its partitions
        message = send.message
        if offset < 0:  # a delayed message: its offset is known only when it is delivered
            offset = None
        message.id, message.partition, message.offset = msg_id, stored, offset
        self._finish(send, SendResult(True, stored, offset, msg_id))

    def _finish(self, send, result):
        if not send.future.done():
            send.future.set_result(result)  # runs the callbacks
            with self._count_lock:
                self._finished += 1
                idle = self._finished == self._started
            if idle:
                with self._cond:
                    self._cond.notify_all()

    def _run_callback(self, callback, future):
        try:
            callback(future.result())
        except Exception:
            log.exception("send callback %r failed", callback)

    # -- retries --------------------------------------------------------------------------

    def _mark_suspect(self, broker_id):
        self._suspect[broker_id] = time.monotonic() + self.suspect_time

    def _retry_later(self, send, error):
        """Queue another attempt (at once if another broker may take it, else after a backoff) or give up."""
        send.error = error
        now = time.monotonic()
        if self._closed or now >= send.deadline:
            self._finish(send, SendResult(False, send.partition, error=error))
            return
        delay = min(_MAX_BACKOFF_S, 0.05 * 2 ** min(send.attempts, 10))
        if not self._ordered and self._fresh_partitions(send, now):
            delay = 0.0
        with self._cond:
            heapq.heappush(self._retries, (min(now + delay, send.deadline), next(self._seq), send))
            self._cond.notify_all()

    def _fresh_partitions(self, send, now):
        """Partitions on brokers that have not failed this send and are not suspect."""
        return [p for p in self._discovery.cached(send.put.topic)
                if p.broker_id not in send.failed and self._suspect.get(p.broker_id, 0) <= now]

    def _retry_partition(self, send):
        """Where to try next: the same partition when ordered, else preferably a fresh broker."""
        if self._ordered and send.partition is not None:
            return send.partition
        if send.partition is None:
            return self._first_partition(send.message)
        now = time.monotonic()
        partitions = self._discovery.partitions(send.put.topic)
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
        if target is None:
            self._retry_later(send, send.error)
        else:
            self._attempt(send, target)
