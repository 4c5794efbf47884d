"""The consumer: pull (``fetch``) and push (``subscribe`` + ``start``) with groups, offsets and retries.

    c = Consumer("orders-group", zk_connect="zk1:2181")
    c.subscribe("orders", handle)        # handle(message); an exception means "failed"
    c.start()
    ...
    c.close()                            # stop fetching, commit offsets, leave the group

Three ways to find partitions:

* **group** (``zk_connect`` given): the group's members split every topic's partitions
  (MetaQ's range assignment over ``/meta/consumers/<group>``, see :mod:`metaq.client.group`);
  offsets in ZooKeeper by default.
* **direct** (``brokers=["meta://h:p", ...]``, no ZooKeeper): this consumer owns every
  partition of those brokers (``stats`` gives each broker's id and the topic's partition
  count); offsets in the brokers' own offset store by default.
* **broadcast** (``broadcast=True``): no group coordination; every broadcast consumer reads every partition
  and keeps its own offsets in a local JSON file.

Threads: one fetch thread per owned partition (a partition's messages reach the handler one at a time in offset
order); it sends long-polling ``get``s, so an idle consumer burns no CPU and sees a new message as soon as the
broker stores it. The handler therefore runs on several threads at once (one per partition, plus the recover
thread) and must be thread-safe. One maintenance thread commits offsets every ``commit_interval`` and
refreshes the partition list in direct and broadcast mode; one recover thread replays parked messages.

Delivery is at least once: the in-memory offset moves past a message only after the handler returned (or the
filter skipped it, or it was parked), and offsets are committed periodically, on a rebalance and on close, so
a crash redelivers at most what came after the last commit. A message whose handler keeps failing is retried
``max_retries`` times (the handler is called at most ``1 + max_retries`` times, with a growing backoff), then
parked: put to ``dead_letter_topic`` if set, else (or when that put fails) appended to the local recover store
(:mod:`metaq.client.recover`), which is replayed to the handler every ``recover_interval``.
A topic subscribed with ``orderly=True`` never parks: its failing message is retried with the same growing
backoff (capped at ``RETRY_BACKOFF_MAX_S``) until the handler takes it, and the later messages of its
partition wait behind it, so each partition is handled strictly in offset order.
"""

import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime

from metaq import errors
from metaq.limits import MAX_WAIT_MS, validate_group, validate_topic
from metaq.protocol import events as ev
from metaq.protocol import stats as stats_codec
from metaq.protocol.checksum import metaq_checksum
from metaq.client.bulk import MessageBatch, decode_batch
from metaq.client.connection import ConnectionPool
from metaq.client.discovery import open_discovery
from metaq.client.divergence import ReadsKept
from metaq.client.fetcher import LONG_POLL_MARGIN_S, STOP_TIMEOUT_S, PartitionFetcher, log_skipped, records_of
from metaq.client.priorities import PriorityFetcher, check_levels
from metaq.client.message import Message, Partition
from metaq.client.offsets import BrokerOffsetStore, LocalFileOffsetStore, ZkOffsetStore
from metaq.client.replies import reply_error
from metaq.client.reqreply import replying
from metaq.client.recover import ParkingLot
from metaq.client import replay
from metaq.client.keys import lookup as key_lookup
from metaq.client.subscription import Subscription, as_partition, broker_tags, make_filter, sql_filter

__all__ = ["Consumer", "default_consumer_id"]

log = logging.getLogger(__name__)

START_FROM = replay.START_WORDS
#: Handler retries back off from ``retry_backoff``, doubling up to this.
RETRY_BACKOFF_MAX_S = 5.0
#: Direct and broadcast mode re-read the partition lists this often (ZooKeeper watches also trigger it).
REFRESH_INTERVAL_S = 5.0
#: 301 replies one ``fetch`` follows before it gives up.
MAX_MOVES = 3
_LATEST = 2**62  # an ``offset`` request for this is clamped to the partition's max offset


def default_consumer_id():
    """``"<host ip>-<pid>-<uuid4 hex>"``, MetaQ's consumer UUID format."""
    try:
        ip = socket.gethostbyname(socket.gethostname())
    except OSError:
        ip = "127.0.0.1"
    return "%s-%d-%s" % (ip, os.getpid(), uuid.uuid4().hex)


class Consumer:
    """A consumer of one group; see the module docstring for modes, threads and delivery guarantees.

    ``group``: the consumer group (letters, digits, ``_ - . %``). ``zk_connect``: ZooKeeper
    (``"host:port[,host:port][/chroot]"``) for group mode; ``brokers``: broker urls for direct
    mode (give one of the two). ``consumer_id``: this member's id (default
    :func:`default_consumer_id`); the group member id is ``"<group>_<consumer_id>"``.
    ``offset_store``: ``"zk"`` (default with ZooKeeper), ``"broker"`` (default without),
    ``"file"`` (default for broadcast; at ``offsets_file``, default
    ``~/.metaq/offsets/<group>-<consumer_id or hostname>.json``) or an object with
    ``load(topic, partition)``, ``commit(dict)`` and ``close()``. ``start_from``: where a
    partition with no stored offset starts, ``"earliest"`` or ``"latest"``; or a time (a datetime, or an int of
    ms since the Unix epoch; a naive datetime is local time, see :mod:`metaq.client.replay`) to **replay** from:
    every partition this consumer is given, the first time in its life (at start and at later rebalances),
    starts at the first offset the broker stored at or after that time, instead of the stored offset; commits
    then continue from there as usual. :meth:`seek` moves one partition while consuming.
    ``max_size``: bytes asked per get; ``long_poll_ms``: how long a get waits at the broker.
    ``max_retries``, ``retry_backoff``: handler retries; ``dead_letter_topic``,
    ``recover_dir`` (default ``~/.metaq/recover``), ``recover_interval``: where failed messages
    go and how often parked ones are replayed. ``skip_corrupt``: when the broker reports a stored
    record corrupt (``errors.CorruptRecord``, ``result 512``: it never serves one), log a WARNING
    naming topic, partition and offset and go on at the next offset; off by default, so
    :meth:`fetch` raises ``CorruptRecord`` and a subscription's partition stops there, with an
    ERROR line, until an operator decides. ``security``: credentials and TLS (``metaq.client.security``;
    None: from the environment); a broker that refuses them raises ``errors.Unauthenticated`` from
    :meth:`start` and :meth:`fetch`. Invalid arguments raise ValueError or
    ``errors.ClientError`` here, before anything connects.
    """

    def __init__(self, group, zk_connect=None, brokers=None, *, zk_root="/meta", consumer_id=None, broadcast=False,
                 offset_store=None, offsets_file=None, start_from="earliest", commit_interval=5.0,
                 max_size=256 * 1024, long_poll_ms=5000, max_retries=5, retry_backoff=0.1, dead_letter_topic=None,
                 recover_dir=None, recover_interval=60.0, session_timeout=10.0, skip_corrupt=False, security=None):
        self.group = validate_group(group)
        if zk_connect and brokers:
            raise ValueError("give zk_connect (group mode) or brokers (direct mode), not both")
        if not zk_connect and not brokers:
            raise ValueError("a consumer needs zk_connect or a list of broker urls")
        if isinstance(brokers, str):
            brokers = [brokers]
        self.brokers = list(brokers or ())
        self._check_numbers(start_from, commit_interval, max_size, long_poll_ms, max_retries, retry_backoff,
                            recover_interval)
        self.zk_connect, self.zk_root, self.session_timeout = zk_connect, zk_root, session_timeout
        self.consumer_id = consumer_id or default_consumer_id()
        if not isinstance(self.consumer_id, str) or "/" in self.consumer_id or not self.consumer_id.isprintable():
            raise ValueError("invalid consumer_id %r" % (consumer_id,))
        self.member_id = "%s_%s" % (self.group, self.consumer_id)
        self.broadcast = bool(broadcast)
        self.start_from, self.commit_interval, self.max_size = start_from, commit_interval, max_size
        replay_ms = replay.start_from_time(start_from)
        self._replay = replay.ReplayStart(replay_ms) if replay_ms is not None else None
        self.long_poll_ms, self.max_retries, self.retry_backoff = long_poll_ms, max_retries, retry_backoff
        self.recover_interval = recover_interval
        self.skip_corrupt = bool(skip_corrupt)
        self.dead_letter_topic = validate_topic(dead_letter_topic) if dead_letter_topic is not None else None
        self.offsets_file = offsets_file or os.path.join(
            os.path.expanduser("~"), ".metaq", "offsets",
            "%s-%s.json" % (self.group, consumer_id or socket.gethostname()))
        self._store_spec = self._check_store(offset_store)
        self._lock = threading.RLock()
        self._commit_lock = threading.Lock()
        self._subs = {}
        self._fetchers = {}  # (topic, Partition) -> PartitionFetcher
        self.reads_kept = ReadsKept()  # what revoked fetchers had read, for the next ones (a failover's rebalance)
        self.parking = ParkingLot(recover_dir or os.path.join(os.path.expanduser("~"), ".metaq", "recover"),
                                   self.group, self.dead_letter_topic, self._put_dead_letter)
        self._pool = ConnectionPool(request_timeout=10.0, security=security)
        self._discovery = None  # metaq.client.discovery, made on first use
        self._coordinator = None
        self._store = None
        self._read_from = {}  # broker_id -> url reads went to last (master, or a slave during a failover)
        self._unwatch = []
        self._threads = []
        self._stopping = threading.Event()
        self._refresh_wanted = threading.Event()
        self._state = "new"  # new -> started -> closed

    @staticmethod
    def _check_numbers(start_from, commit_interval, max_size, long_poll_ms, max_retries, retry_backoff,
                       recover_interval):
        replay.start_from_time(start_from)  # ValueError unless earliest, latest or a time
        if not 0 <= long_poll_ms <= MAX_WAIT_MS:
            raise ValueError("long_poll_ms must be 0..%d, got %r" % (MAX_WAIT_MS, long_poll_ms))
        for name, value, low in (("commit_interval", commit_interval, 0), ("max_size", max_size, 0),
                                 ("recover_interval", recover_interval, 0)):
            if not value > low:
                raise ValueError("%s must be > %s, got %r" % (name, low, value))
        if max_retries < 0 or retry_backoff < 0:
            raise ValueError("max_retries and retry_backoff must be >= 0")

    def _check_store(self, spec):
        if spec is None:
            return "file" if self.broadcast else ("zk" if self.zk_connect else "broker")
        if isinstance(spec, str):
            if spec not in ("zk", "broker", "file"):
                raise ValueError("offset_store must be 'zk', 'broker', 'file' or a store object, got %r" % (spec,))
            if spec == "zk" and not self.zk_connect:
                raise ValueError("offset_store='zk' needs zk_connect")
            if self.broadcast and spec != "file":
                raise ValueError("broadcast consumers keep their own offsets: use offset_store='file' or an object")
            return spec
        if not all(callable(getattr(spec, name, None)) for name in ("load", "commit")):
            raise ValueError("an offset store object needs load(topic, partition) and commit(offsets)")
        return spec

    # -- public API -----------------------------------------------------------------------------

    def subscribe(self, topic, handler, filter=None, orderly=False, reply=False, priorities=0, sql=None):
        """Deliver ``topic``'s messages to ``handler(message)`` once started; an exception from it means failure.

        ``filter``: a callable ``message -> bool``, an attribute string (messages whose attribute equals it) or
        an iterable of attribute strings; messages filtered out are skipped (their offsets advance). An attribute
        filter is applied by the broker (``get_tags``, docs/messaging.md "Tag filtering"), and again here. ``orderly``:
        a failing message holds its partition, retried with backoff until it succeeds (or the consumer closes),
        instead of being parked after ``max_retries``. ``reply``: what the handler returns answers each request
        (``reqreply.client.replying``: docs/messaging.md "Request-reply"). ``priorities``: the topic's levels, for a
        priority topic (docs/messaging.md "Priorities": higher levels are fetched first; the broker refuses a wrong
        count). ``sql``: a SQL92 expression on the messages' properties (their attribute as ``TAGS``), evaluated
        by the broker (``get_sql``, docs/messaging.md "SQL92 filters"), and here too if the broker cannot; a bad
        one raises ``errors.BadFilterExpression`` naming the position; not with ``filter``. Call before
        :meth:`start`.
        """
        topic = validate_topic(topic)
        if not callable(handler):
            raise errors.ClientError("handler must be callable, got %r" % (handler,))
        handler, accept = replying(handler, self.connection) if reply else handler, make_filter(filter)
        compiled, sql_accept = sql_filter(sql, filter)
        accept = sql_accept or accept
        with self._lock:
            if self._state != "new":
                raise errors.ClientError("subscribe() must be called before start()")
            if topic in self._subs:
                raise errors.ClientError("topic %r is already subscribed" % topic)
            self._subs[topic] = Subscription(topic, handler, accept, bool(orderly), broker_tags(filter),
                                             check_levels(priorities, self._replay), compiled)
        return self

    def start(self):
        """Join the group (or take every partition), load offsets and start fetching.

        In group mode this returns after the first rebalance. Raises ``errors.ClientError`` without
        subscriptions, ``errors.ConnectionLost`` / ``errors.Unavailable`` when ZooKeeper or every
        broker is unreachable.
        """
        with self._lock:
            if self._state != "new":
                raise errors.ClientError("consumer already %s" % self._state)
            if not self._subs:
                raise errors.ClientError("subscribe to at least one topic before start()")
            self._state = "started"
        try:
            self._store = self._make_store()
            self.parking.open_existing(self._subs)
            if self.zk_connect and not self.broadcast:
                self._start_group()
            else:
                discovery = self._get_discovery()
                self._unwatch = [discovery.watch_topic(t, self._refresh_wanted.set) for t in self._subs]
                if not self.zk_connect and not discovery.broker_urls():
                    raise errors.ConnectionLost("none of the brokers %s answered" % ", ".join(self.brokers))
                self._refresh_partitions()
            self._spawn(self._maintenance_loop, "maint")
            self._spawn(self._recover_loop, "recover")
        except BaseException:
            self.close()
            raise
        return self

    def close(self):
        """Stop fetching, commit every offset, release owned partitions, leave the group and disconnect."""
        with self._lock:
            if self._state == "closed":
                return
            started, self._state = self._state == "started", "closed"
        self._stopping.set()
        self._refresh_wanted.set()
        for unwatch in self._unwatch:
            unwatch()
        if self._coordinator is not None:
            self._coordinator.stop()  # revokes (stops fetchers, commits), then deletes owner and id nodes
        self._revoke(set(self._fetchers))
        for thread in self._threads:
            thread.join(STOP_TIMEOUT_S)
        if started and self._store is not None and self._store is not self._store_spec:
            self._guarded(self._store.close, "close the offset store")  # a store object passed in is the caller's
        self.parking.close()
        self._pool.close()
        if self._discovery is not None:
            self._discovery.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def seek(self, partition, position, topic=None):
        """Consume ``partition`` (a Partition or ``"b-p"``, owned by this consumer) from ``position`` next: an int
        is an offset, a datetime a time (:meth:`offset_at`). ``topic`` may be left out when the consumer
        subscribes to one topic. Returns the offset. Messages of that partition fetched and not yet handed to
        the handler are dropped and a failing message's retries stop: only the message being handed over at
        that moment (its handler running or starting) may still complete. The new position is committed as
        any other. An offset outside the partition is followed to the nearest one, as a fetch
        does. ``errors.ClientError`` for a partition this consumer does not own (now).
        """
        part = as_partition(partition)
        if topic is None:
            if len(self._subs) != 1:
                raise errors.ClientError("seek: name the topic (this consumer subscribes to %s)"
                                         % (", ".join(sorted(self._subs)) or "nothing"))
            topic = next(iter(self._subs))
        with self._lock:
            fetcher = self._fetchers.get((topic, part))
        if fetcher is None:
            owned = ", ".join("%s/%s" % (t, p) for t, parts in self.assignment().items() for p in parts) or "none"
            raise errors.ClientError("seek: %s %s is not assigned to this consumer (assigned: %s)" % (topic, part,
                                                                                                      owned))
        offset = self.offset_at(topic, part, position) if isinstance(position, datetime) else position
        fetcher.seek(replay.check_offset(offset))
        return offset

    def commit(self):
        """Commit the current offset of every owned partition now (only the changed ones are written)."""
        with self._lock:
            fetchers = dict(self._fetchers)
        self._commit_fetchers(fetchers)

    def assignment(self):
        """``{topic: [Partition, ...]}``: the partitions this consumer currently owns, sorted."""
        with self._lock:
            out = {topic: [] for topic in self._subs}
            for topic, part in self._fetchers:
                out.setdefault(topic, []).append(part)
        return {topic: sorted(parts) for topic, parts in out.items()}

    def lag(self):
        """``{(topic, Partition): max_offset - committed}`` for every owned partition (asks the brokers).

        ``committed`` is the last committed (or loaded) offset; before the first commit, the current
        position; before that is known, the partition's min offset. A priority topic's partition: the sum over
        its levels.
        """
        with self._lock:
            fetchers = dict(self._fetchers)
        tables = {}
        for broker_id in {part.broker_id for _topic, part in fetchers}:
            tables[broker_id] = self._offset_table(broker_id)
        return {key: fetcher.lag(key, tables[key[1].broker_id]) for key, fetcher in fetchers.items()}

    # -- reads on demand: fetch (a pull), offset_at (a time's offset), lookup (a key's messages) --------------

    def fetch(self, topic, partition, offset, max_size=None, max_wait_ms=0):
        """Pull: the messages of ``partition`` (a Partition or ``"b-p"``) from ``offset`` on, ``[]`` if none.

        Works without :meth:`start`. A 301 reply (offset outside the partition) is followed to the
        offset the broker names (logged). ``max_wait_ms`` > 0 makes the broker wait that long for a
        message. Messages carry ``offset``, ``id``, ``partition`` and ``attribute``.
        """
        return self._pull(topic, partition, offset, max_size, max_wait_ms, _messages_of)

    def fetch_batch(self, topic, partition, offset, max_size=None, max_wait_ms=0):
        """Pull as ``fetch`` does, decoded in bulk: a ``MessageBatch`` (``metaq.client.bulk``) of the messages from
        ``offset`` on, empty (``len`` 0) if none. One C call decodes the whole reply (no Python object per
        message); its ``next_offset`` is where the next call starts. 301s and corrupt records as ``fetch``."""
        return self._pull(topic, partition, offset, max_size, max_wait_ms, _batch_of)

    def _pull(self, topic, partition, offset, max_size, max_wait_ms, decode):
        """One ``get`` from ``offset``, decoded by ``decode(topic, part, offset, reply)``; a 301 followed (at most
        ``MAX_MOVES`` times), a corrupt record skipped when ``skip_corrupt``."""
        topic = validate_topic(topic)
        part = as_partition(partition)
        if not 0 <= max_wait_ms <= MAX_WAIT_MS:
            raise ValueError("max_wait_ms must be 0..%d" % MAX_WAIT_MS)
        max_size = max_size or self.max_size
        moves = 0
        while moves <= MAX_MOVES:
            conn = self.connection(part.broker_id, read=True)
            request = ev.Get(topic, self.group, part.partition, offset, max_size, 0, max_wait_ms or None)
            reply = conn.call(request, timeout=max_wait_ms / 1000.0 + LONG_POLL_MARGIN_S)
            try:
                return decode(topic, part, offset, reply)
            except errors.Moved as exc:
                log.info("fetch %s %s: offset %d is outside the partition; following to %d",
                         topic, part, offset, exc.offset)
                offset = exc.offset
                moves += 1
            except errors.CorruptRecord as exc:
                if not self.skip_corrupt or exc.next_offset <= offset:
                    raise
                log_skipped(exc)
                offset = exc.next_offset
        raise errors.Moved(offset, "fetch %s %s: moved more than %d times" % (topic, part, MAX_MOVES))

    def iter_batches(self, topic, partition, offset, max_size=None, max_wait_ms=0):
        """``fetch_batch`` after ``fetch_batch`` from ``offset``, each from the last one's ``next_offset``, until one
        comes back empty (the partition's end, after waiting ``max_wait_ms`` there): a generator of non-empty
        ``MessageBatch``es. Nothing is committed: keep the last ``next_offset`` to go on from."""
        while True:
            batch = self.fetch_batch(topic, partition, offset, max_size, max_wait_ms)
            if not batch.count:
                return
            yield batch
            offset = batch.next_offset

    def offset_at(self, topic, partition, when):
        """The first offset of ``partition`` (a Partition or ``"b-p"``) of ``topic`` the broker stored at or after
        ``when`` (a datetime or ms since the Unix epoch; a naive datetime is local time); the partition's end
        when nothing was stored since, its first kept offset when ``when`` is older. Works without :meth:`start`."""
        part = as_partition(partition)
        return replay.offset_at(self.connection(part.broker_id, read=True), validate_topic(topic), part.partition,
                                replay.to_timestamp_ms(when))

    def lookup(self, topic, key, since=None, until=None):
        """Every message of ``topic`` whose keys hold ``key`` (the RocketMQ ``KEYS`` words, ``UNIQ_KEY``, or a
        metaq ``Message(key=...)``), stored within ``[since, until]`` (datetimes or ms since the Unix epoch; None:
        no bound), from every broker of the topic, newest first; each page of the broker's answer is bounded
        (``limits.MAX_KEY_QUERY_RESULTS``). Works without :meth:`start`."""
        topic = validate_topic(topic)
        found = []
        for broker_id in sorted({p.broker_id for p in self._partitions_of(topic)}):
            for m in key_lookup(self.connection(broker_id, read=True), topic, key, since, until):
                m.partition = Partition(broker_id, m.partition)
                found.append(m)
        found.sort(key=lambda m: m.id, reverse=True)  # a message id starts with its store time
        return found

    # -- partitions and ownership ---------------------------------------------------------------

    def _start_group(self):
        from metaq.client.group import GroupCoordinator

        self._coordinator = GroupCoordinator(
            self._get_discovery().zk, self.zk_root, self.group, self.member_id,
            session_timeout=self.session_timeout,  # partitions: read from ZooKeeper by the coordinator itself
            revoke=lambda keys: self._revoke({(t, Partition.parse(p)) for t, p in keys}),
            assign=lambda keys: self._assign({(t, Partition.parse(p)) for t, p in keys}),
            on_error=lambda exc: log.warning("consumer %s: %s", self.member_id, exc))
        self._coordinator.start(list(self._subs))

    def _assign(self, keys):
        """Start a fetcher for every ``(topic, Partition)`` in ``keys`` (offsets load in the fetch thread)."""
        if not keys:
            return
        with self._lock:
            if self._stopping.is_set():
                return
            for topic, part in sorted(keys):
                if (topic, part) not in self._fetchers and topic in self._subs:
                    sub = self._subs[topic]
                    fetcher = self._fetchers[(topic, part)] = (PriorityFetcher if sub.priorities else
                                                               PartitionFetcher)(self, sub, part)
                    fetcher.start()
        log.info("consumer %s now fetching %s", self.member_id, ", ".join("%s/%s" % k for k in sorted(keys)))

    def _revoke(self, keys):
        """Stop the fetchers of ``keys``, wait for their handlers, and commit their offsets."""
        with self._lock:
            fetchers = {key: self._fetchers.pop(key) for key in keys if key in self._fetchers}
        for fetcher in fetchers.values():
            fetcher.request_stop()
        for fetcher in fetchers.values():
            fetcher.join()
            for kept in fetcher.handover():
                self.reads_kept.keep(*kept)
        if fetchers and self._store is not None:
            self._guarded(lambda: self._commit_fetchers(fetchers), "commit offsets of revoked partitions")

    def _refresh_partitions(self):
        """Direct and broadcast mode: own every partition of the subscribed topics.

        With ZooKeeper the list follows ``topics-sub`` (a broker that unregisters loses its
        partitions until it comes back); in direct mode partitions are only ever added, so a
        broker that does not answer for a while keeps its fetchers (they retry).
        """
        wanted = set()
        for topic in self._subs:
            wanted.update((topic, part) for part in self._partitions_of(topic))
        with self._lock:
            owned = set(self._fetchers)
        if self.zk_connect:
            self._revoke(owned - wanted)
        self._assign(wanted - owned)

    def _partitions_of(self, topic):
        return self._get_discovery().subscribe_partitions(topic)

    # -- brokers --------------------------------------------------------------------------------

    def _get_discovery(self):
        with self._lock:
            if self._discovery is None:
                self._discovery = open_discovery(self.zk_connect or None, None if self.zk_connect else self.brokers,
                                                 pool=self._pool, zk_root=self.zk_root,
                                                 zk_session_timeout=self.session_timeout, timeout=10.0)
            return self._discovery

    def _url_of(self, broker_id):
        """The master of ``broker_id`` (offsets kept by brokers and dead letters go there, never to a slave)."""
        return self._get_discovery().master_url(broker_id)

    def _read_url_of(self, broker_id):
        """Where to read ``broker_id``'s partitions: its master, or, while the master is gone (its ZooKeeper
        node absent or its address refusing connections), a registered slave at the same offsets."""
        discovery = self._get_discovery()
        url = discovery.read_url(broker_id, lambda u: self._pool.get(u).reachable())
        if not self.zk_connect:
            return url
        master = discovery.master_url(broker_id)
        previous = self._read_from.get(broker_id)
        if url != previous:
            self._read_from[broker_id] = url
            if previous is not None or url != master:
                log.warning("broker %d: reading from %s %s (master %s)", broker_id,
                            "the master" if url == master else "slave", url, master or "not registered")
        return url

    def is_slave_read(self, broker_id, url):
        """True when ``url`` (where a read went) is not ``broker_id``'s master: reads failed over to a slave."""
        return bool(self.zk_connect) and url != self._url_of(broker_id)

    def connection(self, broker_id, read=False):
        url = self._read_url_of(broker_id) if read else self._url_of(broker_id)
        if not url:
            raise errors.ConnectionLost("broker %d is not known (not registered, or not answering)" % broker_id)
        return self._pool.get(url)

    def _stats(self, broker_id, item):
        reply = self.connection(broker_id, read=True).call(ev.Stats(item, 0))
        if reply.code != 200:
            raise reply_error(reply, "stats %s" % item)
        return reply.body

    def _offset_table(self, broker_id):
        """``{(topic, partition): (min_offset, max_offset)}`` from ``stats offsets``."""
        return {(r.topic, r.partition): (r.min_offset, r.max_offset)
                for r in stats_codec.parse_offsets(self._stats(broker_id, "offsets"))}

    # -- offsets --------------------------------------------------------------------------------

    def _make_store(self):
        spec = self._store_spec
        if not isinstance(spec, str):
            return spec
        if spec == "zk":
            return ZkOffsetStore(self._get_discovery().zk, self.zk_root, self.group)
        if spec == "broker":
            return BrokerOffsetStore(self._pool, self._url_of, self.group)
        return LocalFileOffsetStore(self.offsets_file, self.group)

    def stored_entry(self, topic, part):
        """``(offset, msg_id)`` the group committed (msg_id -1 when the store keeps none), or None."""
        load_entry = getattr(self._store, "load_entry", None)
        if load_entry is not None:
            return load_entry(topic, part)
        offset = self._store.load(topic, part)
        return None if offset is None else (offset, -1)

    def initial_offset(self, topic, part):
        """``(offset, committed)``: the stored offset, else ``start_from`` (``committed`` None then); with a
        ``start_from`` time, the offset at that time the first time this consumer is given the partition."""
        if self._replay is not None and self._replay.wanted((topic, part)):
            offset = self.offset_at(topic, part, self._replay.timestamp_ms)
            self._replay.done((topic, part))
            log.info("%s %s: replaying from offset %d, the first stored at or after %d ms (start_from)",
                     topic, part, offset, self._replay.timestamp_ms)
            return offset, None
        stored = self.stored_entry(topic, part)
        if stored is not None:
            return stored[0], stored[0]
        target = 0 if self.start_from == "earliest" else _LATEST
        reply = self.connection(part.broker_id, read=True).call(ev.Offset(topic, self.group, part.partition, target,
                                                                            0))
        if reply.code != 200:
            raise reply_error(reply, "offset %s %s" % (topic, part))
        offset = int(reply.body)
        log.info("%s %s: no stored offset for group %s; starting at the %s offset %d",
                 topic, part, self.group, self.start_from, offset)
        return offset, None

    def _commit_fetchers(self, fetchers):
        """Commit the positions of ``fetchers``; one commit at a time, so a stale position never overwrites a
        newer one."""
        with self._commit_lock:
            positions = {}
            for key, f in fetchers.items():
                positions.update(f.positions(key))  # a priority topic's fetcher: one per level
            if not positions or self._store is None:
                return
            self._store.commit(positions)
            for key, f in fetchers.items():
                f.committed_at(key, positions)

    # -- handling, retries, parking ---------------------------------------------------------------

    def process(self, sub, message, stop):
        """Run the handler on ``message`` with retries, parking it when they run out (never, if orderly).

        True when the message is done with (handled, filtered out or parked); False when
        ``stop`` was set during the retries (the message stays unconsumed).
        """
        if sub.accept is not None:
            try:
                if not sub.accept(message):
                    return True
            except Exception:
                log.exception("filter of %s raised on %s; delivering the message", sub.topic, message)
        attempt = 0
        while True:
            try:
                sub.handler(message)
                return True
            except Exception as exc:
                attempt += 1
                if attempt > self.max_retries and not sub.orderly:
                    log.warning("handler failed %d times on %s (last: %r); parking it", attempt, message, exc)
                    return self.parking.park(message, stop)
                delay = min(RETRY_BACKOFF_MAX_S, self.retry_backoff * 2 ** min(attempt - 1, 62))
                log.log(logging.WARNING if attempt > self.max_retries else logging.INFO, "handler failed on %s "
                        "(attempt %d): %r; retrying in %.2f s", message, attempt, exc, delay)  # orderly: it waits
                if stop.wait(delay):
                    return False

    def _put_dead_letter(self, message, topic):
        """Put ``message`` to ``topic`` (partition -1, same flag and data) on the broker it came from."""
        flag, data = message.encode()
        flag = message.flag if message.flag is not None else flag
        conn = self.connection(message.partition.broker_id)
        reply = conn.call(ev.Put(topic, -1, flag, data, 0, metaq_checksum(data)))
        if reply.code != 200:
            raise reply_error(reply, "put %s" % topic)
        return reply.body.decode()

    def parked(self):
        """``{topic: [Message, ...]}``: messages parked in the local recover store, not yet replayed successfully."""
        return self.parking.pending()

    def replay_parked(self):
        """Hand every parked message to its handler once now; remove those that succeed; their count."""
        return self.parking.replay({t: s.handler for t, s in self._subs.items()}, self._stopping)

    # -- background threads -----------------------------------------------------------------------

    def _spawn(self, target, name):
        thread = threading.Thread(target=target, daemon=True, name="metaq-consumer-%s-%s" % (self.group, name))
        self._threads.append(thread)
        thread.start()

    def _maintenance_loop(self):
        next_commit = time.monotonic() + self.commit_interval
        next_refresh = time.monotonic() + REFRESH_INTERVAL_S
        coordinated = self._coordinator is not None
        while not self._stopping.is_set():
            now = time.monotonic()
            wait = next_commit - now if coordinated else min(next_commit, next_refresh) - now
            woken = self._refresh_wanted.wait(max(0.0, wait))
            if self._stopping.is_set():
                return
            now = time.monotonic()
            if not coordinated and (woken or now >= next_refresh):
                self._refresh_wanted.clear()
                next_refresh = now + REFRESH_INTERVAL_S
                self._guarded(self._refresh_partitions, "refresh partitions")
            if now >= next_commit:
                next_commit = now + self.commit_interval
                self._guarded(self.commit, "commit offsets")

    def _recover_loop(self):
        while not self._stopping.wait(self.recover_interval):
            self._guarded(self.replay_parked, "replay parked messages")

    def _guarded(self, func, what):
        try:
            func()
        except Exception as exc:
            log.warning("consumer %s: %s failed: %r", self.member_id, what, exc)


def _messages_of(topic, part, offset, reply):
    """``fetch``'s decoder: a Message per record of ``reply``, ``[]`` for a 404."""
    records = records_of(reply, "get %s %s %d" % (topic, part, offset))
    return [Message.from_record(topic, part, offset + i, rec) for i, rec in enumerate(records)]


def _batch_of(topic, part, offset, reply):
    """``fetch_batch``'s decoder: the whole reply in one C call, an empty batch for a 404."""
    if isinstance(reply, ev.Value):
        return decode_batch(topic, part, offset, reply.body)
    records_of(reply, "get %s %s %d" % (topic, part, offset))  # 404: none; else raises
    return MessageBatch(topic, part, offset)
