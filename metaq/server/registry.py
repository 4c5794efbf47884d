"""ZooKeeper registration in MetaQ's layout (reference ``metaq-protocol.md`` §4).

Nodes this broker (a master) writes, all data UTF-8 strings:

    <root>/brokers/ids/<id>                         persistent  meta://host:port (for clients older than MetaQ 1.4)
    <root>/brokers/ids/<id>/master                  ephemeral   meta://host:port
    <root>/brokers/ids/<id>/master_config_checksum  ephemeral   decimal CRC-32 of the parsed configuration,
                                                                secrets redacted
    <root>/brokers/topics/<topic>/<id>-m            ephemeral   partition count (legacy, read by contrib producers)
    <root>/brokers/topics-pub/<topic>/<id>-m        ephemeral   {"numParts":N,"broker":"<id>-m"}
    <root>/brokers/topics-sub/<topic>/<id>-m        ephemeral   the same JSON

A master also writes (ours, not MetaQ's; the ``master`` node stays byte-exact)
the ephemeral ``ids/<id>/replication`` = ``{"address": "host:port" or null,
"epoch": N, "epoch_start": P, "epoch_origin": O, "url": "meta://host:port"}``: its replication
port and epoch, which a superseded old master reads to rejoin it as a slave
(``roles.rejoin_if_superseded``).

A member with a RocketMQ port (remoting or gRPC) also writes the ephemeral ``ids/<id>/rocketmq-master``
(``rocketmq-slave<N>`` as slave N) = ``{"name": broker name, "remoting": "ip:port", "grpc": "host:port"}``, from
which every broker's RocketMQ routes list the cluster (``routes.py``); a member with an MQTT port the ephemeral
``ids/<id>/mqtt-master`` (``mqtt-slave<N>``) = ``{"address": "host:port", "tls": security.tls.mode}``, which
``metaq-admin brokers`` lists for a device fleet's provisioning, and a member with an HTTP port ``http-master``
alike, for operators (names and JSON: ``protocol/registration.py``).

A replication slave N (same broker id) writes instead, all ephemeral:
``ids/<id>/slave<N>`` = meta://host:port, ``topics-sub/<topic>/<id>-s<N>`` (JSON)
and the legacy ``topics/<topic>/<id>-s<N>``; never master nodes nor topics-pub.
A promoted slave removes its slave nodes and registers as master (``set_role``).

Registration runs in one greenlet (``_run``); kazoo's state listener only sets
flags and wakes it, so a kazoo callback never blocks. Every (re)connection
triggers a full pass that creates what is missing, so the layout comes back
after a session expiry or a ZooKeeper restart. A node left by this broker's
previous, killed incarnation (same broker id, its session not yet expired) is
replaced when it carries our address; one with another address means another
live broker claims our id: we log it and retry until it goes away.
"""

import json
import logging
import re
import socket

import gevent
from gevent.event import Event
from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError, NotEmptyError
from kazoo.handlers.gevent import SequentialGeventHandler

from metaq.errors import MetaqError
from metaq.protocol.registration import KINDS, ROCKETMQ, listener_data, member_node, rocketmq_data
from metaq.timers.levels import SCHEDULE_TOPIC

log = logging.getLogger(__name__)

#: Seconds a clean shutdown spends removing our nodes before giving up (ZooKeeper may be down).
UNREGISTER_TIMEOUT_S = 5.0
RETRY_MIN_S, RETRY_MAX_S = 0.2, 5.0


class GrantedTimeout(logging.Filter):
    """The session timeout ZooKeeper granted (it may cap what we asked for at its ``maxSessionTimeout``): kazoo
    keeps it nowhere but in a message it logs, at its BLATHER level (5), when a session is created. Our kazoo
    logger passes its records through this filter, which reads that figure and lets through only what the
    ``kazoo`` logger's own level would have."""

    PATTERN = re.compile(r"negotiated session timeout: (\d+)")
    #: kazoo's lines for each connection attempt and each failed one: kept at DEBUG, since the registry says
    #: once, in its own words, that ZooKeeper does not answer (``last_error`` keeps the latest reason)
    RETRY_CHATTER = ("Connecting to ", "Connection dropped: ", "Connection time-out: ", "Transition to CONNECTING",
                     "Closing connection to ")

    def __init__(self):
        super().__init__()
        self.ms = None
        self.last_error = None

    def filter(self, record):
        if record.levelno < logging.DEBUG:
            found = self.PATTERN.search(record.getMessage())
            if found:
                self.ms = int(found.group(1))
        elif record.levelno > logging.DEBUG and record.msg.startswith(self.RETRY_CHATTER):
            if record.msg.startswith(("Connection dropped: ", "Connection time-out: ")):
                self.last_error = record.getMessage()
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return record.levelno >= logging.getLogger("kazoo").getEffectiveLevel()


def kazoo_logger(granted):
    """A logger for our KazooClient that sees kazoo's BLATHER records (for ``granted``) and prints as kazoo's."""
    logger = logging.getLogger("kazoo.client.metaq")
    logger.setLevel(5)
    if granted not in logger.filters:
        for old in list(logger.filters):
            logger.removeFilter(old)
        logger.addFilter(granted)
    return logger


class IdClaimedElsewhere(Exception):
    """Another live session holds our broker id's master node with another address."""


def advertised_url(host, port):
    """``meta://host:port`` as clients should dial it (a wildcard bind advertises this host's address)."""
    if host in ("", "0.0.0.0", "::"):
        try:
            host = socket.gethostbyname(socket.gethostname())
        except OSError:
            host = "127.0.0.1"
    if ":" in host:
        return "meta://[%s]:%d" % (host, port)
    return "meta://%s:%d" % (host, port)


def topic_json(partitions, broker_id, node=None):
    return json.dumps({"numParts": partitions, "broker": node or "%d-m" % broker_id}, separators=(",", ":"))


class ZkRegistry:
    def __init__(self, config, store, config_checksum, slave_id, replication_port, rocketmq=lambda: None,
                 listeners=dict):
        """``slave_id``: ours when we start as a slave, else None; ``replication_port()``: the port a master
        serves slaves on, or None; ``rocketmq()``: ``(broker name, remoting "ip:port" or None, gRPC "host:port"
        or None)`` once this broker has a RocketMQ port, else None (published for routes: ``routes.py``);
        ``listeners()``: ``{kind: ("host:port", TLS mode)}`` of its MQTT and HTTP ports (``registration.LISTENERS``;
        a port it does not have left out), published for devices' provisioning and operators (``metaq-admin
        brokers``)."""
        cfg = config.zk
        self.config = config
        self.store = store
        self.config_checksum = config_checksum
        self.replication_port = replication_port
        self.rocketmq = rocketmq
        self.listeners = listeners
        self.connect = cfg.connect
        self.root = cfg.root
        self.broker_id = config.broker.id
        self.slave_id = self.node = None
        self._retired = []  # (node, slave_id, topics) registered under a role we left: removed by the worker
        self._set_names(slave_id)
        self.connection_timeout_s = cfg.connection_timeout_ms / 1000.0
        self.granted = GrantedTimeout()
        self.zk = KazooClient(
            logger=kazoo_logger(self.granted),
            hosts=cfg.connect,
            handler=SequentialGeventHandler(),
            timeout=cfg.session_timeout_ms / 1000.0,
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": RETRY_MAX_S},
            command_retry={"max_tries": 3, "delay": 0.1, "backoff": 2, "max_delay": 1.0},
        )
        self.url = None
        self.state = "connecting"
        self.registered_topics = set()  # topics whose nodes exist in the current session
        self.registrations = 0  # completed full passes (stats, tests)
        self._full_pass = True
        self._pending_topics = set()
        self._gone_topics = set()  # deleted topics whose nodes are still to remove (topic_changed)
        self._wake = Event()
        self._stopping = False
        self._connecting = False
        self._worker = None

    def granted_timeout_s(self):
        """The session timeout ZooKeeper granted our session, in seconds, or None before the first session."""
        return self.granted.ms / 1000.0 if self.granted.ms else None

    @property
    def ids_path(self):
        return "%s/brokers/ids/%d" % (self.root, self.broker_id)

    def _set_names(self, slave_id):
        self.slave_id = slave_id
        self.node = "%d-m" % self.broker_id if slave_id is None else "%d-s%d" % (self.broker_id, slave_id)

    # -- lifecycle ------------------------------------------------------------

    def open_session(self):
        """Connect, waiting up to the connection timeout (idempotent)."""
        if self._connecting:
            return
        self._connecting = True
        self.zk.add_listener(self._on_state)
        connected = self.zk.start_async()
        connected.wait(self.connection_timeout_s)
        if not self.zk.connected:
            log.warning("ZooKeeper at %s not reachable after %g s (%s); serving without it, registering as soon as "
                        "it answers", self.connect, self.connection_timeout_s,
                        self.granted.last_error or "no answer")

    def start(self, port):
        """Connect (if not yet) and register in the background."""
        self.url = advertised_url(self.config.broker.host, port)
        self.open_session()
        self._worker = gevent.spawn(self._run)
        self._wake.set()

    def set_role(self, slave_id):
        """Register from now on as master (``slave_id`` None) or as slave ``slave_id``; the old nodes go."""
        if slave_id == self.slave_id:
            return
        self._retired.append((self.node, self.slave_id, set(self.registered_topics)))
        self._set_names(slave_id)
        self.registered_topics = set()
        self._full_pass = True
        self._wake.set()

    def live_master(self):
        """Another live session's master of our broker id: ``{"url", "address", "epoch", "epoch_start"}`` or None."""
        try:
            data, stat = self.zk.get(self.ids_path + "/master")
        except NoNodeError:
            return None
        if stat.ephemeralOwner == self.zk.client_id[0]:
            return None
        info = {"url": data.decode("utf-8", "replace")}
        try:
            published = json.loads(self.zk.get(self.ids_path + "/replication")[0].decode("utf-8"))
            if isinstance(published, dict):
                info.update(published)
        except (NoNodeError, ValueError):
            pass
        return info

    def free_slave_id(self):
        """The lowest N with no ``slave<N>`` registered under our broker id."""
        taken = set()
        try:
            for name in self.zk.get_children(self.ids_path):
                if name.startswith("slave") and name[5:].isdigit():
                    taken.add(int(name[5:]))
        except NoNodeError:
            pass
        return min(set(range(len(taken) + 1)) - taken)

    def stop(self):
        """Clean shutdown: remove our nodes (bounded by UNREGISTER_TIMEOUT_S), then close the session."""
        self._stopping = True
        self._wake.set()
        if self._worker is not None:
            self._worker.kill(block=True, timeout=1.0)
        if self.zk.connected:
            try:
                with gevent.Timeout(UNREGISTER_TIMEOUT_S):
                    self._unregister()
                log.info("unregistered broker %d from ZooKeeper", self.broker_id)
            except (KazooException, gevent.Timeout) as exc:
                log.warning("could not unregister from ZooKeeper (its ephemeral nodes expire with the session): %r",
                            exc)
        try:
            self.zk.stop()
            self.zk.close()
        except KazooException as exc:
            log.warning("closing the ZooKeeper client: %r", exc)

    # -- events (never block here) -------------------------------------------

    def _on_state(self, state):
        """kazoo's state listener: record and wake the worker, nothing else."""
        if state == KazooState.LOST:
            self.state = "lost"
            self.registered_topics = set()
            log.warning("ZooKeeper session lost: ephemeral nodes are gone; re-registering when it reconnects")
        elif state == KazooState.SUSPENDED:
            self.state = "suspended"
            log.warning("ZooKeeper connection suspended; retrying")
        else:
            self.state = "connected"
            self._full_pass = True  # verify (and restore) every node after any reconnection
        self._wake.set()

    def topic_created(self, topic):
        """Called on a topic's first put: register it soon, without waiting here."""
        if topic not in self.registered_topics and topic != SCHEDULE_TOPIC:
            self._pending_topics.add(topic)
            self._wake.set()

    def topic_changed(self, topic):
        """A topic was created, altered or deleted (topics/service.py): register it again (its count may have
        changed); a deleted one's nodes are removed (``partitions_of`` refuses it)."""
        try:
            self.store.partitions_of(topic)
        except MetaqError:
            self._gone_topics.add(topic)
            self.registered_topics.discard(topic)
            self._wake.set()
            return
        self._gone_topics.discard(topic)
        self.registered_topics.discard(topic)
        self.topic_created(topic)

    # -- the worker ------------------------------------------------------------

    def _run(self):
        delay = RETRY_MIN_S
        while not self._stopping:
            self._wake.wait()
            self._wake.clear()
            if self._stopping:
                return
            if not self.zk.connected:
                continue  # the next CONNECTED state wakes us
            try:
                while self._retired:
                    self._unregister_nodes(*self._retired[0])
                    self._retired.pop(0)
                if self._full_pass:
                    self._full_pass = False
                    self._register_all()
                while self._pending_topics:
                    topic = self._pending_topics.pop()
                    self._register_topic(topic)
                while self._gone_topics:
                    topic = next(iter(self._gone_topics))
                    self._unregister_nodes(self.node, None, [topic], topics_only=True)
                    self._gone_topics.discard(topic)
                delay = RETRY_MIN_S
            except (KazooException, IdClaimedElsewhere) as exc:
                self._full_pass = True
                log.warning("ZooKeeper registration failed (%s); retrying in %.1f s", exc or type(exc).__name__, delay)
                gevent.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                self._wake.set()

    def _register_all(self):
        zk = self.zk
        zk.ensure_path(self.ids_path)
        if self.slave_id is None:
            zk.set(self.ids_path, self.url.encode())
            self._claim(self.ids_path + "/master", self.url, by_address=True)
            self._claim(self.ids_path + "/master_config_checksum", str(self.config_checksum))
            self._claim(self.ids_path + "/replication", self._replication_json())
        else:
            self._claim(self.ids_path + "/slave%d" % self.slave_id, self.url, by_address=True)
        rocketmq = self.rocketmq()
        if rocketmq is not None:
            self._claim("%s/%s" % (self.ids_path, member_node(ROCKETMQ, self.slave_id)), rocketmq_data(*rocketmq))
        for kind, (address, tls) in sorted(self.listeners().items()):
            self._claim("%s/%s" % (self.ids_path, member_node(kind, self.slave_id)), listener_data(address, tls))
        topics = self.store.known_topics()
        for topic in topics:
            self._register_topic(topic)
        self.registrations += 1
        log.info("registered broker %d in ZooKeeper (%s%s) as %s with %d topics",
                 self.broker_id, self.connect, self.root, self.url, len(topics))

    def _register_topic(self, topic):
        if topic == SCHEDULE_TOPIC:  # internal to this broker: nobody produces to or consumes from it
            return
        try:
            partitions = self.store.partitions_of(topic)
        except MetaqError as exc:  # a topic no longer configured is simply not registered
            log.warning("not registering topic %s: %s", topic, exc)
            return
        node = self.node
        brokers = "%s/brokers" % self.root
        self._claim("%s/topics/%s/%s" % (brokers, topic, node), str(partitions))
        payload = topic_json(partitions, self.broker_id, node)
        if self.slave_id is None:
            self._claim("%s/topics-pub/%s/%s" % (brokers, topic, node), payload)
        self._claim("%s/topics-sub/%s/%s" % (brokers, topic, node), payload)
        self.registered_topics.add(topic)

    def _claim(self, path, data, by_address=False):
        """Create ephemeral ``path`` with ``data`` in our session, replacing a stale node of ours."""
        zk, raw = self.zk, data.encode("utf-8")
        for _attempt in range(3):
            try:
                zk.create(path, raw, ephemeral=True, makepath=True)
                return
            except NodeExistsError:
                pass
            try:
                current, stat = zk.get(path)
            except NoNodeError:
                continue
            if stat.ephemeralOwner == zk.client_id[0]:
                if current != raw:
                    zk.set(path, raw)
                return
            if by_address and current != raw:
                raise IdClaimedElsewhere("broker id %d is registered by another session as %s (we are %s); "
                                         "waiting for it to go away" % (self.broker_id, current.decode(), data))
            try:
                zk.delete(path, version=stat.version)
            except NoNodeError:
                pass
        raise IdClaimedElsewhere("could not claim %s" % path)

    def member_url(self):
        """Our ``meta://`` URL: as registered, or before the text port listens, as the configuration gives it (None
        when that is port 0: the port is known once it listens)."""
        if self.url or not self.config.broker.port:
            return self.url
        return advertised_url(self.config.broker.host, self.config.broker.port)

    def replication_address(self, port=None):
        """Where slaves dial us while we serve them on ``port`` (None: the port we serve on now):
        ``replication.advertised_address``, else the advertised host (as in our url) and the port; None without."""
        port = self.replication_port() if port is None else port
        if port is None:
            return None
        url = self.member_url() or advertised_url(self.config.broker.host, 0)
        return self.config.replication.advertised_address or "%s:%d" % (url[len("meta://"):].rsplit(":", 1)[0], port)

    def _replication_json(self):
        epochs = self.store.epochs
        return json.dumps({"address": self.replication_address(), "epoch": epochs.epoch,
                           "epoch_start": epochs.latest[1], "epoch_origin": epochs.latest[2], "url": self.url},
                          separators=(",", ":"), sort_keys=True)

    def _unregister_nodes(self, node, slave_id, topics, topics_only=False):
        brokers = "%s/brokers" % self.root
        for topic in sorted(topics):
            for kind in ("topics", "topics-pub", "topics-sub"):
                self._delete_ours("%s/%s/%s/%s" % (brokers, kind, topic, node))
        if topics_only:
            return
        for kind in KINDS:
            self._delete_ours("%s/%s" % (self.ids_path, member_node(kind, slave_id)))
        if slave_id is not None:
            self._delete_ours(self.ids_path + "/slave%d" % slave_id)
            return
        for name in ("replication", "master_config_checksum", "master"):
            self._delete_ours(self.ids_path + "/" + name)
        self._delete_previous_master()

    def _delete_previous_master(self):
        """We are master no more: a ``master`` node naming our url in another session (our previous incarnation,
        killed before its session expired) goes too, with that session's ``replication`` and checksum nodes, so that
        the member that is master now registers at once instead of waiting out that session."""
        path = self.ids_path + "/master"
        try:
            data, stat = self.zk.get(path)
        except NoNodeError:
            return
        if data.decode("utf-8", "replace") != self.member_url() or stat.ephemeralOwner == self.zk.client_id[0]:
            return
        for name in ("replication", "master_config_checksum"):  # the replication node first: members.py
            try:
                _data, other = self.zk.get(self.ids_path + "/" + name)
                if other.ephemeralOwner == stat.ephemeralOwner:
                    self.zk.delete(self.ids_path + "/" + name, version=other.version)
            except (NoNodeError, BadVersionError):
                pass
        try:
            self.zk.delete(path, version=stat.version)
            log.info("removed the master node our previous incarnation left in ZooKeeper (we are no longer master)")
        except (NoNodeError, BadVersionError):
            pass

    def _unregister(self):
        zk = self.zk
        self._unregister_nodes(self.node, self.slave_id, self.registered_topics)
        if self.slave_id is not None:
            self.registered_topics = set()
            return
        try:
            zk.delete(self.ids_path)
        except NotEmptyError:
            zk.set(self.ids_path, b"")  # slaves are still registered under it (MetaQ does the same)
        except NoNodeError:
            pass
        self.registered_topics = set()

    def _delete_ours(self, path):
        try:
            _data, stat = self.zk.get(path)
            if stat.ephemeralOwner == self.zk.client_id[0]:
                self.zk.delete(path, version=stat.version)
        except NoNodeError:
            pass
