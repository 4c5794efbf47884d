"""Where the brokers are: the client's one place for finding brokers and the partitions of a topic.

Two sources, one interface:

* ``DirectDiscovery``: a fixed list of ``meta://host:port`` urls. Each broker tells its
  id with ``stats`` and a topic's partition count with ``stats <topic>``; answers are
  cached (a broker's id for good, a topic's partitions for ``refresh_interval``).
* ``ZkDiscovery``: MetaQ's ZooKeeper layout (reference §4), read and kept current by
  watches in :class:`metaq.client.cluster.ZkCluster`: masters under
  ``brokers/ids/<id>/master``, slaves under ``.../slave<N>``, partitions to send to from
  ``topics-pub`` (masters only), partitions to consume from ``topics-sub`` (masters and
  slaves), both falling back to the legacy ``topics``.

Both give (all but ``read_url``'s ``reachable`` argument the same):

    partitions(topic)          where to send: sorted; ``Partition(b, -1)`` for a broker that
                               has no such topic yet (the first put creates it there)
    cached(topic)              the last answer of ``partitions`` without asking anyone
    invalidate / refuse        forget a topic's partitions / a broker that refused the topic
    url(broker_id)             a broker's (master's) url for sends
    subscribe_partitions(t)    where to consume from
    broker_urls()              ``{broker_id: url}`` of every broker known (masters)
    master_url(b) / read_url(b, reachable)
                               where offsets and writes go / where reads go (the master, or a
                               slave while the master is gone: :func:`choose_read_url`)
    resource_brokers()         ``([(broker_id, url)], [problem])``: brokers that answer
    every_url()                every broker to ask (the list, or the registered masters)

Users: the producer (and through it local transactions and ``XAResource``), the
consumer, ``metaq-admin`` and ``metaq.spark`` (:func:`find_brokers`).
"""

import logging
import threading
import time

from metaq.errors import BrokerError, Forbidden, MetaqError, RemoteProtocolError, Unauthenticated
from metaq.protocol import events as ev
from metaq.protocol import stats as stats_codec
from metaq.client.connection import BrokerConnection, parse_url
from metaq.client.message import Partition
from metaq.client.replies import reply_error

__all__ = ["DirectDiscovery", "ZkDiscovery", "open_discovery", "find_brokers", "broker_id_from_stats",
           "partition_count_from_stats", "ask_broker_id", "choose_read_url", "unknown_topic_partitions"]

log = logging.getLogger(__name__)


# -- pure logic ---------------------------------------------------------------------------


def broker_id_from_stats(reply):
    """The ``broker_id`` line of a ``stats`` reply; the reply's error for a non-200 reply (``replies.reply_error``:
    say Unauthenticated for a 401), KeyError/ValueError when absent."""
    if isinstance(reply, ev.Result) and reply.code in (Unauthenticated.code, Forbidden.code):
        raise reply_error(reply, "stats")
    if not isinstance(reply, ev.Result) or reply.code != 200:
        raise BrokerError("stats answered %s" % getattr(reply, "code", type(reply).__name__))
    return int(stats_codec.parse_summary(reply.body)["broker_id"])


def partition_count_from_stats(reply):
    """The ``partitions`` line of a ``stats <topic>`` reply; 0 when the broker has no such topic, said no, or
    answered with another item (a topic named like a ``stats`` item, such as ``topics`` or ``delay``, gets
    that item: its partitions are then unknown here, and a producer lets the broker choose)."""
    if not isinstance(reply, ev.Result) or reply.code != 200:
        return 0
    try:
        return stats_codec.parse_topic(reply.body).partitions
    except RemoteProtocolError:
        return 0


def choose_read_url(master, slaves, reachable):
    """Where to read a broker's partitions: its master while it is registered and ``reachable(url)``, else the
    first reachable slave (lowest slave number first), else the first slave, else the master (or None)."""
    if master is not None and reachable(master):
        return master
    return next((url for url in slaves if reachable(url)), slaves[0] if slaves else master)


def unknown_topic_partitions(topic, broker_ids, refusing):
    """``Partition(b, -1)`` for every broker (sorted) but those in ``refusing`` (``{(topic, b)}``):
    where to send a topic no broker has yet (the broker picks the partition)."""
    return [Partition(bid, -1) for bid in sorted(broker_ids) if (topic, bid) not in refusing]


def ask_broker_id(conn, timeout):
    """Ask the broker on ``conn`` its id (``stats``); raises MetaqError, KeyError or ValueError."""
    return broker_id_from_stats(conn.call(ev.Stats(None, 0), timeout))


# -- a fixed list of brokers --------------------------------------------------------------


class DirectDiscovery:
    """Brokers from a fixed list of urls, asked with ``stats`` (broker id) and ``stats <topic>`` (partition count).

    ``pool`` is the caller's ``ConnectionPool``. A broker where the topic does not exist yet
    contributes ``Partition(id, -1)`` to ``partitions``: the put lets the broker choose.
    Partitions are cached for ``refresh_interval`` seconds, and for only
    ``retry_interval`` when a broker did not answer.
    """

    def __init__(self, urls, pool, timeout=3.0, refresh_interval=30.0, retry_interval=3.0):
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
        self._unanswered = {}  # url -> why it did not answer its last ask (one entry per listed url at most)

    # -- brokers --------------------------------------------------------------------------

    def broker_id(self, url):
        """``url``'s broker id, asked once; raises MetaqError, KeyError or ValueError."""
        if url not in self._ids:
            self._learn_id(url, self.pool.get(url).call(ev.Stats(None, 0), self.timeout))
        return self._ids[url]

    def _learn_id(self, url, reply):
        bid = broker_id_from_stats(reply)
        self._ids[url] = bid
        self._by_id[bid] = url

    def broker_urls(self):
        """``{broker_id: url}`` of the listed brokers that told their id (those not known yet are asked now).

        Raises ``Unauthenticated`` when none is known and a broker refused the credentials (not a network
        trouble: the caller must hear of it)."""
        refused = None
        for url in self.urls:
            if url in self._ids:
                continue
            try:
                self.broker_id(url)
            except (MetaqError, KeyError, ValueError) as exc:
                log.warning("broker %s did not tell its id: %s", url, exc)
                refused = exc if isinstance(exc, Unauthenticated) else refused
        if refused is not None and not self._by_id:
            raise refused
        return dict(self._by_id)

    def url(self, broker_id):
        """The url of ``broker_id`` if it already told its id (never asks: safe on a reader thread), else None."""
        return self._by_id.get(broker_id)

    def master_url(self, broker_id):
        """The url of ``broker_id`` (asking the brokers not known yet), or None."""
        return self._by_id.get(broker_id) or self.broker_urls().get(broker_id)

    def read_url(self, broker_id, reachable=None):
        """Where to read ``broker_id``: there are no slaves in a direct list, so its url."""
        return self.master_url(broker_id)

    def every_url(self):
        return list(self.urls)

    def resource_brokers(self):
        """``([(broker_id, url)], [problem])``: the listed brokers that tell their id, and why the others did not."""
        found, problems = [], []
        for url in self.urls:
            try:
                found.append((self.broker_id(url), url))
            except (MetaqError, KeyError, ValueError) as exc:
                problems.append("%s: %s" % (url, exc))
        return found, problems

    # -- partitions -----------------------------------------------------------------------

    def partitions(self, topic):
        """The partitions to send ``topic`` to, sorted (cached; see the class)."""
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
        parts, complete, refused = [], True, None
        for url, id_future, topic_future in asked:
            try:
                if id_future is not None:
                    self._learn_id(url, id_future.result(self.timeout + 5))
                count = partition_count_from_stats(topic_future.result(self.timeout + 5))
            except (MetaqError, TimeoutError, ValueError, KeyError) as exc:
                log.info("broker %s did not describe topic %s: %s", url, topic, exc)
                self._unanswered[url] = str(exc) or type(exc).__name__
                complete = False
                refused = exc if isinstance(exc, Unauthenticated) else refused
                continue
            self._unanswered.pop(url, None)
            bid = self._ids[url]
            if count > 0:
                parts.extend(Partition(bid, p) for p in range(count))
            else:
                parts.extend(unknown_topic_partitions(topic, (bid,), self._refusing))
        if refused is not None and not parts:
            raise refused  # every broker refused the credentials (or was down): say so, not "no partitions"
        ttl = self.refresh_interval if complete else min(self.refresh_interval, self.retry_interval)
        return sorted(parts), time.monotonic() + ttl

    def cached(self, topic):
        """The last partitions found for ``topic`` (never asks the brokers: safe on a reader thread)."""
        entry = self._topics.get(topic)
        return entry[0] if entry is not None else []

    def why_none(self, topic):
        """Why ``partitions(topic)`` found none, in words naming each listed broker that did not answer its last
        ask (``meta://127.0.0.1:8123: cannot connect to ...: connection refused``), or "" when every one did."""
        problems = []
        for url in self.urls:
            why = self._unanswered.get(url)
            if why is not None:
                problems.append(why if url in why else "%s: %s" % (url, why))  # most errors name the url already
        return "; ".join(problems)

    def invalidate(self, topic):
        """Ask the brokers again on the next ``partitions(topic)``."""
        entry = self._topics.get(topic)
        if entry is not None:
            self._topics[topic] = (entry[0], 0.0)

    def refuse(self, topic, broker_id):
        """``broker_id`` does not take ``topic``: no more ``Partition(broker_id, -1)`` for it."""
        self._refusing.add((topic, broker_id))
        self.invalidate(topic)

    def subscribe_partitions(self, topic):
        """The partitions to consume ``topic`` from: every answering broker's ``stats <topic>`` count."""
        parts = []
        for broker_id, url in sorted(self.broker_urls().items()):
            try:
                reply = self.pool.get(url).call(ev.Stats(topic, 0), self.timeout)
                if reply.code != 200:
                    raise BrokerError("stats %s: result %d %s" % (topic, reply.code, bytes(reply.body)[:200]))
            except MetaqError as exc:
                log.info("cannot list partitions of %s on broker %d: %s", topic, broker_id, exc)
                continue
            parts.extend(Partition(broker_id, p) for p in range(partition_count_from_stats(reply)))
        return parts

    def watch_topic(self, topic, callback):
        """Nothing to watch in a fixed list (callers refresh on a timer); returns a no-op unwatch."""
        return lambda: None

    def close(self):
        pass


# -- ZooKeeper ----------------------------------------------------------------------------


class ZkDiscovery:
    """Brokers and partitions from MetaQ's ZooKeeper layout (a :class:`ZkCluster`, which it owns and closes).

    ``partitions`` is cached until a watch says the topic changed: the partitions of the brokers that list the
    topic, and ``Partition(id, -1)`` for every other registered master that has not refused it (the topic is made
    there by its first put; the broker picks the partition), so a topic made on demand spreads over every broker,
    as ``DirectDiscovery`` spreads it.
    """

    def __init__(self, cluster):
        self.cluster = cluster
        self._lock = threading.Lock()
        self._parts = {}
        self._last = {}  # survives invalidation, for readers that must not block
        self._gen = {}
        self._urls = None
        self._refusing = set()  # (topic, broker id)

    @classmethod
    def connect(cls, zk_connect, root="/meta", session_timeout=10.0, connect_timeout=15.0):
        """Connect to ZooKeeper (``errors.ConnectionLost`` when it cannot be reached in ``connect_timeout`` s)."""
        from metaq.client.cluster import ZkCluster  # kazoo is loaded only when ZooKeeper is used

        return cls(ZkCluster(zk_connect, root, session_timeout, connect_timeout=connect_timeout))

    @property
    def zk(self):
        """The started KazooClient (consumers keep their group and offset nodes with it)."""
        return self.cluster.zk

    @property
    def root(self):
        return self.cluster.root

    # -- brokers --------------------------------------------------------------------------

    def broker_urls(self):
        """``{broker_id: master url}`` of every broker with a registered master."""
        return self.cluster.broker_urls()

    def url(self, broker_id):
        """The registered master of ``broker_id`` for sends (cached until a watch fires), or None."""
        urls = self._urls
        if urls is None:
            urls = self._urls = self.cluster.broker_urls()
        return urls.get(broker_id)

    def master_url(self, broker_id):
        return self.cluster.master_url(broker_id)

    def read_url(self, broker_id, reachable):
        """The master while registered and ``reachable(url)``, else a registered slave (:func:`choose_read_url`)."""
        return choose_read_url(self.cluster.master_url(broker_id), self.cluster.slave_urls(broker_id), reachable)

    def every_url(self):
        return [url for _bid, url in sorted(self.cluster.broker_urls().items())]

    def resource_brokers(self):
        return list(self.cluster.broker_urls().items()), []

    # -- partitions -----------------------------------------------------------------------

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
        listing = {p.broker_id for p in parts}
        others = [bid for bid in self.cluster.broker_urls() if bid not in listing]
        if others:
            parts = sorted(parts + unknown_topic_partitions(topic, others, self._refusing))
        self._last[topic] = parts
        with self._lock:
            if self._gen[topic] == gen:
                self._parts[topic] = parts
        return parts

    def cached(self, topic):
        """The partitions last read for ``topic`` ([] if none), without reading ZooKeeper."""
        return self._last.get(topic, [])

    def why_none(self, topic):
        """Why ``partitions(topic)`` found none: no broker has registered a master in ZooKeeper, or ""."""
        if self.cluster.broker_urls():
            return ""
        return "no broker is registered in ZooKeeper under %s" % self.cluster.root

    def _changed(self, topic):
        with self._lock:
            self._gen[topic] = self._gen.get(topic, 0) + 1
            self._parts.pop(topic, None)
            self._urls = None

    def invalidate(self, topic):
        self._changed(topic)

    def refuse(self, topic, broker_id):
        self._refusing.add((topic, broker_id))
        self._changed(topic)

    def subscribe_partitions(self, topic):
        return self.cluster.subscribe_partitions(topic)

    def watch_topic(self, topic, callback):
        """``callback()`` on the cluster's refresher thread when ``topic`` or the brokers change; returns unwatch."""
        return self.cluster.watch_topic(topic, callback)

    def close(self):
        self.cluster.close()


# -- making one ---------------------------------------------------------------------------


def open_discovery(zk_connect=None, brokers=None, *, pool, zk_root="/meta", zk_session_timeout=10.0,
                   zk_connect_timeout=15.0, timeout=3.0, refresh_interval=30.0, retry_interval=3.0):
    """A ``ZkDiscovery`` (``zk_connect``) or a ``DirectDiscovery`` (``brokers``: urls, or one comma-separated str).

    Exactly one of the two; ValueError otherwise or for an empty list.
    """
    if (zk_connect is None) == (brokers is None):
        raise ValueError("give exactly one of zk_connect and brokers")
    if zk_connect is not None:
        return ZkDiscovery.connect(zk_connect, zk_root, zk_session_timeout, zk_connect_timeout)
    urls = [u.strip() for u in brokers.split(",")] if isinstance(brokers, str) else list(brokers)
    if not urls:
        raise ValueError("brokers is empty")
    return DirectDiscovery(urls, pool, timeout, refresh_interval, retry_interval)


def find_brokers(brokers=(), zk_connect=None, zk_root="/meta", timeout=10.0, security=None):
    """``{broker_id: url}`` once: the masters registered in ZooKeeper and/or each listed url's own id.

    For one-shot tools (a short-lived connection per listed broker); raises MetaqError,
    KeyError or ValueError when a listed broker does not tell its id. ``security``: see
    ``metaq.client.security.resolve`` (None: the environment).
    """
    urls = {}
    if zk_connect:
        discovery = ZkDiscovery.connect(zk_connect, zk_root, connect_timeout=timeout)
        try:
            urls.update(discovery.broker_urls())
        finally:
            discovery.close()
    for url in brokers:
        with BrokerConnection(url, connect_timeout=timeout, request_timeout=timeout, heartbeat_interval=0,
                              security=security) as conn:
            urls[ask_broker_id(conn, timeout)] = url
    return urls
