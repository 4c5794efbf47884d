"""Broker assembly: one store, one flusher, the text server, background tasks, shutdown.

What the configuration may leave off (ZooKeeper, its election, the remoting, MQTT, MQTT cluster, HTTP and gRPC ports)
is imported where it is assembled, only when it is set: a broker loads the code of what it serves and starts sooner
(tests/server/test_startup.py keeps it).
"""

import gc
import logging
import socket
import time
from typing import Callable, NamedTuple

import gevent
from gevent.event import Event
from gevent.lock import Semaphore

from metaq import errors, limits, speedups
from metaq.transactions import limits as transactions_limits
from metaq.trace.service import Tracer
from metaq.admin.service import AdminOps, TextGroupMembers
from metaq.admin.wire import ClientCommand
from metaq.store.limits import COLD_READ_CHECK_S
from metaq.protocol import checksum, registration
from metaq.priorities.wire import with_owner_keys
from metaq.clock import now_ms
from metaq.server.config import advertised_ip, is_loopback
from metaq.serving import looplag
from metaq.serving.proxies import TrustedProxies
from metaq.serving.connections import ConnectionCore, ConnectionLimits, Strangers
from metaq.timers.scheduler import DelayScheduler
from metaq.server.flusher import AheadWorker, Flusher
from metaq.server.guard import Guard
from metaq.serving.longpoll import PartitionWaiters
from metaq.serving.putpath import PutPath, WriteGate
from metaq.reqreply.service import ReplyRouter
from metaq.server.replication.roles import Roles
from metaq.server.stats import (BrokerStats, NodeFacts, StatsService, grpc_values, quota_rows, remoting_values,
                                security_values)
from metaq.server.text.dispatch import TextDispatcher
from metaq.protocol.text import error_reply
from metaq.server.text.fastput import FastPuts
from metaq.server.text.server import TextFrontEnd
from metaq.transactions.text import TextTransactions
from metaq.serving.tls import TlsPolicy, client_context
from metaq.transactions.service import TxService
from metaq.pop.service import PopService
from metaq.topics.service import TopicAdmin
from metaq.groups.service import GroupAdmin
from metaq.store.results import PRESSURE_FULL, PRESSURE_NONE
from metaq.storestate import open_store
from metaq.timers.service import TimerService

log = logging.getLogger(__name__)

#: Seconds a graceful shutdown waits for busy connections to finish their requests.
SHUTDOWN_GRACE_S = 10.0


class Broker:
    """Builds every component from the configuration, gives each the collaborators it uses, runs and stops them."""

    def __init__(self, config):
        self.config = config
        self.stats = BrokerStats()
        self.stopping = False
        self.ready = False  # set when the broker says it is ready: every listener open
        self.pressure_deleted_segments = 0  # segments retention deleted young to relieve the disk (stats)
        self._retention_due = Event()  # a slave's copy met a full disk: retention runs now, not at its next interval
        self.stopped = Event()
        self.stopped_cleanly = False  # set by a stop that flushed everything and marked the shutdown clean
        self._tasks = []
        self.config_checksum = config.checksum()
        started = time.monotonic()
        # a bad permissions file stops the start here; the store's producer windows are counted per user
        self.guard = Guard(config.security, {"transactions": config.transactions.max_open,
                                             "topics": config.limits.max_topics,
                                             "partitions": config.limits.max_partitions,
                                             "request_waiters": config.limits.max_pending_requests,
                                             "timers": config.limits.max_pending_timers,
                                             "connections": config.max_connections(),
                                             "parked_gets": config.limits.max_parked_gets})
        self.store = open_store(config.store_config(), now_ms(),
                                lambda user: self.guard.quotas.limit(user, "idempotent_producers"),
                                lambda user, n: self.guard.quotas.check(user, "consumer_offsets", n))
        self.waiters = PartitionWaiters(config.limits.max_parked_gets,
                                        lambda user, n: self.guard.quotas.check(user, "parked_gets", n))
        self.store.on_partitions_made(self.waiters.partitions_made)  # told as it moves, never asked per wake
        self.recovery_seconds = time.monotonic() - started
        self._log_recovery()
        self.store_lock = Semaphore()  # background store work (checkpoints, work ahead) vs a replication cut
        self.gate = WriteGate()
        self.flusher = Flusher(self.store, self.store.config, self.on_visible, self._flush_failed, self.store_lock)
        self.ahead = AheadWorker(self.store, self.store_lock, self.flusher.observe_flushes)
        lim = config.limits
        self.tls = TlsPolicy(config.security.tls)  # and a bad certificate, key or CA file here
        strangers = Strangers(lim.login_timeout_s, config.max_unauthenticated(), lim.max_unauthenticated_per_address,
                              lim.stranger_eviction_age_s)
        self.core = ConnectionCore(config.max_connections(),
                                   ConnectionLimits(lim.idle_timeout_s, lim.request_timeout_s, lim.max_reply_bytes,
                                                    lim.max_partial_request_bytes, strangers),
                                   config.max_connections_per_address(), self.guard, self.tls,
                                   lim.tls_handshakes_per_address_s,
                                   TrustedProxies(config.security.trusted_proxies, config.security.proxy_protocol))
        self.roles = Roles(config, self.store, self.core, self.flusher, self.waiters, self.store_lock)
        self.roles.on_disk_full(self._retention_due.set)  # a slave's copy met a full disk: the same rule
        self.registry = self.cluster = None
        if config.zk.connect:
            from metaq.server.registry import ZkRegistry
            from metaq.server.routes import ClusterView

            self.registry = ZkRegistry(config, self.store, self.config_checksum, self.roles.slave_id,
                                       lambda: self.roles.replication_port, self._rocketmq_addresses,
                                       self._listener_registrations)
            self.roles.attach_registry(self.registry)
            self.roles.on_change(self.registry.set_role)
            # the cluster's RocketMQ brokers, for the RocketMQ front-ends' routes (server/routes.py)
            self.cluster = ClusterView(self.registry.zk, config.zk.root).brokers
        self.election = None
        if config.replication.ha == "auto":  # the config requires zk.connect with it
            from metaq.server.replication.election import Election

            self.election = Election(config, self.store, self.roles, self.registry.zk, self.registry.ids_path,
                                     lambda: self.registry.url,
                                     lambda: self.remoting.address if self.remoting is not None else None,
                                     self.registry.granted_timeout_s, self._mqtt_address)
            self.roles.attach_election(self.election)
        self.tx = TxService(self.store, config, self.flusher, self.waiters, self.stats, self.roles.is_master,
                            self.guard.quotas)  # recovery completes commits (a slave's follows the log)
        self.core.on_close(lambda conn: self.tx.connection_closed(conn.conn_id))
        self.delay = DelayScheduler(self.store, config, self.flusher, self.waiters, self.gate,
                                    is_master=self.roles.is_master)  # reads its entries from the store
        self.roles.on_change(self.delay.role_changed)
        self.roles.on_cut(self.delay.log_cut)  # offsets saved past a cut count deliveries that went with it
        self.roles.on_change(self.tx.role_changed)
        self.timers = TimerService(self.store, self.flusher, self.waiters, self.gate, self.roles.is_master,
                                   async_flush=config.store.flush == "async",  # any delivery time; its index
                                   max_pending=config.limits.max_pending_timers,
                                   quota=lambda user, n, more: self.guard.quotas.check(user, "timers", n, more))
        self.roles.on_change(self.timers.role_changed)
        self.roles.on_change(self._clamp_offsets)
        self.put_path = PutPath(self.store, self.stats, self.flusher, self.waiters, self.roles, self.gate,
                                self.delay, self.registry, sync_flush=config.store.flush == "sync", guard=self.guard)
        # every change of what the write decision reads moves its version: decisions kept are asked again
        self.gate.on_change = self.put_path.changed
        self.roles.put_refusal = self.put_path.writable_refusal  # ``Roles.writable``: the put path's yes or no
        self.guard.on_change.append(self.put_path.changed)
        self.roles.on_change(self.put_path.changed)
        self.put_path.timers = self.timers
        self.tx.attach_writes(self.put_path.check_writable, self.put_path.confirm)
        self.pop = PopService(self.store, self.put_path, self.roles.is_master,
                              waiters=self.waiters)  # per-message acknowledgement (pop/service.py)
        self.roles.on_change(self.pop.role_changed)
        self.stats_service = StatsService(self.stats, self.store, self.flusher, self.waiters, config.redacted_text)
        self.replies = ReplyRouter(config.broker.id, config.remoting.cluster, lim.max_pending_requests,
                                   lim.max_pending_requests_per_connection,  # request-reply, both protocols
                                   lambda user, n: self.guard.quotas.check(user, "request_waiters", n))
        self.core.on_close(self.replies.connection_closed)
        self.core.on_close(lambda conn: self.guard.connection_closed(getattr(conn, "session", None)))  # its quota
        self.group_members = TextGroupMembers()  # text connections using broker-kept offsets (admin/service.py)
        self.core.on_close(self.group_members.connection_closed)
        self.admin = AdminOps(self.store, self.put_path, self.group_members,
                              lambda group: self.remoting.group_members(group) if self.remoting is not None else [])
        self.topic_admin = TopicAdmin(self.store, self.store_lock, self.registry,
                                      lambda: self.put_path.slave_refusal)  # the topic table (topics/service.py)
        self.topic_admin.on_change.append(self.put_path.changed)  # a topic deleted or altered: decisions asked again
        self.topic_admin.on_change.append(self.waiters.partitions_changed)  # readers of topics made or gone look again
        self.tracer = Tracer(self.store, lambda: self.pop.state, self._remoting_host, config.broker.id,
                             lambda: self.roles.read_refusal)  # where is my message (trace/service.py)
        self.group_admin = GroupAdmin(self.store.groups, lambda: self.put_path.slave_refusal)  # groups/service.py
        self.group_admin.on_change.append(self._group_settings_changed)
        self.dispatcher = TextDispatcher(self.store, self.stats, self.put_path, TextTransactions(self.tx, self.guard),
                                         self.roles, self.waiters, config, self.stats_service.render, self.guard,
                                         self.replies, self.admin, self.group_members, self.topic_admin,
                                         self.pop, self.tracer, self.group_admin)
        self.fast_puts = FastPuts(self.put_path, lim) if config.broker.burst_puts else None
        http = (("https" if config.security.tls.mode == "on" else "http", config.http.host or config.broker.host,
                 config.http.port) if config.http.port else None)  # named to an HTTP client on the text port
        self.text = TextFrontEnd(self.core, self.dispatcher, self.fast_puts, self.flusher, self.stats, lim,
                                 zero_copy=config.broker.zero_copy_reads, http=http)
        self.remoting = None
        if config.remoting.port:
            from metaq.server.remoting.server import RemotingServer

            self.remoting = RemotingServer(self.core, config, self.store, self.stats, self.put_path, self.tx,
                                           self.roles, self.waiters, elected_master=self.election.master_remoting
                                           if self.election is not None else None, replies=self.replies,
                                           cluster=self.cluster)
        self.mqtt = None
        self.mqtt_ws = []  # the MQTT port's WebSocket listeners, once started
        self.mqtt_cluster = self.cluster_members = None
        if config.mqtt.port:  # docs/mqtt.md
            from metaq.mqtt.port import MqttPort

            seam = None
            if self.registry is not None:  # MQTT across the cluster (metaq/mqttcluster)
                from metaq.mqttcluster.members import Members

                self.cluster_members = Members(self.registry.zk, config.zk.root)  # read once for the whole cluster
                seam = mqtt_cluster(config, self.store, self.put_path, self.cluster_members, self.waiters,
                                    self._replication_for_peers())
            self.mqtt = MqttPort(self.core, config.mqtt, self.store, self.put_path, self.guard, self.waiters,
                                 config.store.max_transfer_size, lambda: self.roles.is_master,
                                 lambda: self.election.master_mqtt() if self.election is not None else None,
                                 self.roles.acknowledge_refusal, lambda: self.roles.unconfirmable_refusal, seam)
            self.roles.on_change(self.mqtt.role_changed)  # a promoted slave's sessions are its own
            if seam is not None:
                self.mqtt_cluster = self.mqtt.cluster  # the seam the port made: started and stopped with the broker
        self.stats_service.add_source("node", self.stats_facts)
        self.stats_service.add_source("replication", self.roles.stats_values)
        self.stats_service.add_source("delay", lambda: self.delay.summary_values() + self.timers.summary_values()
                                      + self.tx.manager.summary_values())
        self.stats_service.add_source("delay_levels", self.delay.level_rows)
        self.stats_service.add_source("transactions", self.tx.manager.in_doubt)
        self.stats_service.add_source("pop", self.pop.rows)
        self.stats_service.add_source("pop_positions", self.pop.positions)
        self.stats_service.add_source("quotas", self.quota_use)
        self.stats_service.add_source("remoting", lambda: remoting_values(self.remoting))
        self.stats_service.add_source("security", lambda: security_values(self.guard, config.security.tls.mode,
                                                                                 strangers.evicted,
                                                                                 self.core.proxy_refused))
        self.stats_service.add_source("zero_copy", self.text.zero_copy_values)
        self.stats_service.add_source("mqtt", self.mqtt.summary_values if self.mqtt is not None  # and its cluster's
                                      else lambda: [("mqtt_port", 0)])
        if self.mqtt is not None:
            self.stats_service.add_source("mqtt_positions", self.mqtt.positions)
        self.http = None
        if config.http.port:  # docs/operating.md "The HTTP port"
            from metaq.admin.http import AdminViews, add_admin_routes
            from metaq.server.http.api import BrokerViews
            from metaq.server.http.origin import BrowserCheck
            from metaq.server.http.port import HttpPort
            from metaq.server.http.server import UnsentReplies
            from metaq.server.http.topicview import WebSocketPorts
            from metaq.timers.http import TimerViews, add_timer_routes
            from metaq.trace.http import TraceViews, add_trace_routes

            views = BrokerViews(self.store, self.stats, self.put_path, self.guard, self.roles,
                                self.stats_service.summary_values, lambda: self.stopping, lim.max_body_bytes,
                                self.disk_pressure, config.broker.id)
            http_host = config.http.host or config.broker.host
            names = [socket.gethostname(), config.broker.host, http_host] + config.http.allowed_hosts
            check = BrowserCheck(names, every_request=not self.guard.enabled and is_loopback(http_host),
                                 configured=config.http.allowed_hosts)  # docs/operating.md "The HTTP port": browsers
            self.http = HttpPort(self.core, views, self.tx.manager.in_doubt, self.flusher.observe_flushes,
                                 config.http.open_metrics, check,
                                 UnsentReplies(lim.max_http_unsent_bytes, lim.request_timeout_s), self.quota_use,
                                 WebSocketPorts(config.mqtt.ws_port, config.mqtt.wss_port, config.mqtt.ws_path,
                                                config.mqtt.max_keep_alive_s))
            admin_views = AdminViews(self.admin, self.store, self.topic_admin, self.guard, self.group_admin)
            add_admin_routes(self.http.router, admin_views)  # offsets, dead letters
            add_timer_routes(self.http.router, TimerViews(self.timers, self.put_path))  # list and cancel timers
            add_trace_routes(self.http.router, TraceViews(self.tracer, self.guard))  # where is my message

        self.grpc = None
        if config.grpc.port:  # docs/rocketmq5.md
            self.grpc = grpc_port(self.core, config, self.store, self.put_path, self.guard, self.cluster, self.tx,
                                  self.pop)
            self.dispatcher.route(ClientCommand, self.grpc.service.clients.text(error_reply))  # clients stack|verify
        self.stats_service.add_source("grpc", lambda: grpc_values(self.grpc))

    # -- facts used by stats --------------------------------------------------

    def _group_settings_changed(self):
        """A group's settings changed: the replication master sends the table to its slaves now."""
        if self.roles.replication is not None:
            self.roles.replication.notify()

    def quota_use(self):
        """``stats quotas`` and /metrics: per user and quota, what it holds and its quota (``stats.quota_rows``)."""
        return quota_rows(self.guard, {"idempotent_producers": self.store.idempotence.table.owners(),
                                       "connections": self.guard.connected(),
                                       "consumer_offsets": self.store.consumer_offsets.held(),
                                       "topics": {u: h[0] for u, h in self.store.topic_owners().items()},
                                       "partitions": {u: h[1] for u, h in self.store.topic_owners().items()},
                                       "request_waiters": self.replies.table.by_user(),
                                       "transactions": self.tx.manager.by_user(),
                                       "timers": self.timers.held(),
                                       "parked_gets": dict(self.waiters.by_user),
                                       "producer_topics": self.grpc.service.producer_topics_held()
                                       if self.grpc is not None else {},
                                       "consumer_clients": self.grpc.service.consumer_clients_held()
                                       if self.grpc is not None else {}})

    @property
    def port(self):
        return self.text.port

    @property
    def max_connections(self):
        return self.core.max_connections

    @property
    def connection_count(self):
        """Connections open on the text port (``curr_connections``; the remoting port has its own line)."""
        return self.text.connection_count()

    def _remoting_host(self):
        """The remoting port's ``(ip, port)`` as offset message ids name it, or None without the port."""
        r = self.remoting
        return (r.store_ip, r.port) if r is not None and r.store_ip is not None and r.port else None

    def _rocketmq_addresses(self):
        """What the registry publishes for RocketMQ routes (server/routes.py): ``(broker name, remoting "ip:port",
        gRPC "host:port")``, None for a port not open; None without either port."""
        remoting = self.remoting.address if self.remoting is not None and self.remoting.port else None
        grpc = None
        if self.grpc is not None and self.grpc.port:
            grpc = _dialed(*self.grpc.service.endpoint())
        if remoting is None and grpc is None:
            return None
        return self.config.remoting.broker_name or "metaq-%d" % self.config.broker.id, remoting, grpc

    def _replication_for_peers(self):
        """What the MQTT cluster uses of the replication port, each passed in (``PeersReplication``)."""
        roles = self.roles
        return PeersReplication(secret=roles.secret, is_master=lambda: roles.is_master,
                                is_member=lambda: roles.is_master and roles.replication_port is not None,
                                confirmed_end=roles.confirmed_end, wait_confirmed=roles.wait_confirmed,
                                serve_peers=roles.serve_peers)

    def _mqtt_address(self):
        """This broker's MQTT address as the elected master's leader node names it ("host:port", a wildcard bind
        host as the address others reach it at), or None without the port: a slave's Server Reference."""
        mqtt = getattr(self, "mqtt", None)
        if mqtt is None or not mqtt.port:
            return None
        return _dialed(self.config.mqtt.host or self.config.broker.host, mqtt.port)

    def _listener_registrations(self):
        """What the registry publishes of the MQTT and HTTP ports (``protocol/registration.py``): ``{kind:
        ("host:port", TLS mode)}`` of the ports this broker has."""
        tls = self.config.security.tls.mode
        out = {}
        mqtt = self._mqtt_address()
        if mqtt is not None:
            out[registration.MQTT] = (mqtt, tls)
        http = getattr(self, "http", None)
        if http is not None and self.config.http.port:
            out[registration.HTTP] = (_dialed(self.config.http.host or self.config.broker.host,
                                              self.config.http.port), tls)
        return out

    def stats_facts(self):
        """What ``stats`` shows of the broker itself (``StatsService``'s ``node`` source)."""
        self.check_disk()  # stats shows the disk as it is now, the figure the gate decides on (and df shows)
        disk = self.gate.disk_state
        return NodeFacts(self.config.broker.id, self.port, not self.roles.is_master, self.connection_count,
                         self.config_checksum, self.config.store.flush, disk.usage_ratio if disk else 0.0,
                         bool(self.gate.refusal), self.registry.state if self.registry is not None else "standalone",
                         self.pressure_deleted_segments, self.disk_pressure()[0])

    def disk_pressure(self):
        """``(state, why)``: ``full`` when writes, or this slave's copy of its master's log, are refused for lack of
        disk (above the danger mark, or a write met ENOSPC); ``warn`` when retention deletes the oldest segments
        before their time (``DiskState.pressure``); else ``none`` (``stats`` ``disk_pressure``, ``/readyz``)."""
        link, gate = self.roles.slave_link, self.gate
        if link is not None and link.disk_full:
            return PRESSURE_FULL, link.disk_full
        if gate.refusal and gate.flush_failure is None:
            return PRESSURE_FULL, gate.refusal
        disk = gate.disk_state
        return (disk.pressure, disk.pressure_reason) if disk is not None else (PRESSURE_NONE, "")

    def _flush_failed(self):
        self.gate.refresh(flush_failure=self.flusher.failure)

    def on_visible(self, keys):
        self.waiters.notify(with_owner_keys(keys))  # a priority level's append wakes its topic's get_prio
        self.roles.notify()

    # -- lifecycle -----------------------------------------------------------

    def _clamp_offsets(self, slave_id):
        """Now master (promoted or elected): committed offsets past a partition's end go back to it, before this
        broker writes there (offsets/table.py ``clamp``); saved at once, off the loop."""
        if slave_id is not None:
            return
        store = self.store

        def end_of(topic, partition):
            try:
                return store.max_offset(topic, partition)
            except errors.NotFound:
                return None

        moved = store.consumer_offsets.clamp(end_of)
        if moved:
            log.warning("now master: %d committed consumer offsets were past their partition's end (a lost tail "
                        "of the old master); moved back to it, so that no group skips what is written there", moved)
            gevent.get_hub().threadpool.spawn(store.consumer_offsets.save)

    def _log_recovery(self):
        r = self.store.recovery
        if r.index_units_repaired:
            log.warning("recovery rebuilt %d index units from the commit log: they did not name their records",
                        r.index_units_repaired)
        if r.clean_shutdown:
            log.info("clean restart: recovery scan skipped (%.3f s)", self.recovery_seconds)
            return
        log.info("recovery scanned %d bytes, %d records from position %d in %.3f s; "
                 "index units rebuilt %d, dropped %d",
                 r.scanned_bytes, r.records_scanned, r.scanned_from, self.recovery_seconds,
                 r.index_units_rebuilt, r.index_units_dropped)
        if r.truncated_bytes:
            log.warning("recovery cut a torn tail: %d bytes, %d records", r.truncated_bytes, r.truncated_records)
        if r.corruption:
            log.warning("recovery forced past corruption: %s", r.corruption)

    def _listen_mqtt_websocket(self, host):
        """The MQTT port's WebSocket listeners that are set (docs/mqtt.md "Over WebSocket")."""
        from metaq.mqtt.websocket import listen_websocket

        for name, number in (("mqtt-ws", self.config.mqtt.ws_port), ("mqtt-wss", self.config.mqtt.wss_port)):
            if number:
                listener = listen_websocket(self.core, self.mqtt, self.config.mqtt, name, host, number)
                self.mqtt_ws.append(listener)
                log.info("MQTT over WebSocket on %s://%s:%d%s", "wss" if name == "mqtt-wss" else "ws", host,
                         listener.port, self.config.mqtt.ws_path)

    def start(self):
        cfg = self.config.broker
        if self.registry is not None:
            self.registry.open_session()
        self.roles.start()  # maybe rejoin a newer master (ZooKeeper); a master's new epoch
        self.text.listen(cfg.host, cfg.port)
        self.flusher.start()
        self.ahead.start()
        self.gate.refresh(disk_state=self.store.check_disk())
        self._tasks = [gevent.spawn(self._disk_loop), gevent.spawn(self._retention_loop)]
        self.tx.start()
        self.pop.start()
        self.delay.start()  # after the flusher: its saves wait for deliveries to be durable
        self.timers.start()
        if self.remoting is not None:
            self.remoting.start()
        self.roles.start_links()
        if self.http is not None:
            self.http.listen(self.config.http.host or cfg.host, self.config.http.port)
        if self.mqtt is not None:
            self.mqtt.listen(self.config.mqtt.host or cfg.host, self.config.mqtt.port)
            self._listen_mqtt_websocket(self.config.mqtt.host or cfg.host)
        if self.mqtt_cluster is not None:
            self.mqtt_cluster.start()  # its client ids, then its links
            self.cluster_members.start()  # after its listeners joined
        if self.grpc is not None:
            self.grpc.listen(self.config.grpc.host or cfg.host, self.config.grpc.port)
            self.grpc.service.start()  # the check-back of its half messages
        self.guard.start()
        if self.registry is not None:
            self.registry.start(self.port)
        if self.election is not None:
            self.election.start()
        self._log_exposure()
        link, replication = self.roles.slave_link, self.roles.replication
        self.ready = True  # from here a SIGTERM stops it cleanly (server/__main__.py)
        gc.freeze()  # what start-up made lives as long as the process: out of every later full collection's walk
        looplag.PROBE.start()
        gc.set_threshold(*gc.get_threshold()[:2], limits.GC_MIDDLE_PASSES_PER_FULL)
        log.info("metaq broker %d ready on %s:%d (flush=%s, data=%s, max_connections=%d%s%s, epoch %d)",
                 cfg.id, cfg.host, self.port, self.config.store.flush,
                 self.store.config.data_dir, self.max_connections,
                 ", RocketMQ remoting on %s (name server and broker %s)" % (self.remoting.address,
                                                                           self.remoting.broker_name)
                 if self.remoting else "",
                 ", slave %d of %s" % (link.slave_id, link.master) if link
                 else ", replication port %d (%s)" % (replication.port, replication.mode)
                 if replication else "", self.store.epochs.epoch)
        if self.http is not None:
            log.info("HTTP port on %s:%d: /metrics, /healthz, /readyz, /api/..., the dashboard at /",
                     self.config.http.host or cfg.host, self.http.port)
        if self.mqtt is not None:
            log.info("MQTT port on %s:%d (MQTT 3.1.1 and 5.0)", self.config.mqtt.host or cfg.host, self.mqtt.port)
        if self.grpc is not None:
            log.info("RocketMQ 5 gRPC port on %s:%d (apache.rocketmq.v2.MessagingService)",
                     self.config.grpc.host or cfg.host, self.grpc.port)
        if self.roles.read_refusal is not None:
            log.warning("reads refused until the first epoch handshake: %s", self.roles.read_refusal)
        if checksum.IMPLEMENTATION == "python-zlib":
            log.warning("the C helper metaq.native._bytes is %s: puts and reads take the slower pure-Python path",
                        "turned off (METAQ_PURE_PYTHON)" if speedups.built() else "not built (no compiler?)")
        else:
            log.info("C helper loaded; CRC-32 from %s", checksum.IMPLEMENTATION)

    def _log_exposure(self):
        """Say at every start who can reach this broker and what they must prove (docs/security.md)."""
        sec = self.config.security
        auth, tls = self.guard.status()
        log.info("security: authentication %s%s, TLS %s, replication secret %s", auth,
                 " (%s)" % sec.acl_file if sec.auth else "", tls if sec.tls.mode != "permissive" else "permissive",
                 "set" if (sec.replication_secret or sec.replication_secret_file) else "not set")
        if sec.insecure:
            exposed = [host for _name, host in self.config.listen_addresses() if not is_loopback(host)]
            if exposed and not sec.auth:
                log.warning("INSECURE: listening on %s with authentication off (security.insecure: true): anyone "
                            "who reaches this broker can read and write every topic and run admin commands",
                            ", ".join(sorted(set(exposed))))

    def _disk_loop(self):
        interval = self.config.store.disk_check_interval_s
        pool = gevent.get_hub().threadpool
        while not self.stopping:
            self.check_disk()
            pool.apply(self.store.drop_cold_pages)  # reads of a cold backlog map pages while nothing is written
            waited = 0.0
            while waited < interval and not self.stopping:  # and a fast reader's, sooner (COLD_READ_DROP_BYTES)
                step = min(COLD_READ_CHECK_S, interval - waited)
                gevent.sleep(step)
                waited += step
                if self.store.cold_reads_due():
                    pool.apply(self.store.drop_cold_pages)

    def check_disk(self):
        """The disk check (the loop's, and each ``stats``'): measure, give the WriteGate the figure, log a change. A
        slave found past its danger mark (with a warn mark below 1.0) runs retention now, as when its copy meets a
        full disk: its last copy may have taken it there, and no later copy need come to be refused."""
        gate = self.gate
        before = gate.disk_state.refusing_writes if gate.disk_state else False
        try:
            gate.refresh(disk_state=self.store.check_disk())
        except OSError as exc:
            log.error("disk check failed: %s", exc)
            gate.refresh()
        if gate.disk_state is None:
            return
        now_refusing = gate.disk_state.refusing_writes
        if now_refusing and not self.roles.is_master and self.config.store.disk_warn_ratio < 1.0:
            self._retention_due.set()  # a slave past its danger mark after its last copy: nothing else retries
        if now_refusing != before:
            if now_refusing:
                log.error("%s", gate.disk_state.reason)
            else:
                log.warning("disk usage %.1f%% is below the danger mark again: writes accepted",
                            gate.disk_state.usage_ratio * 100)

    def _retention_loop(self):
        """Retention every ``retention_check_interval_s``, and at once when a slave's copy met a full disk (no client
        retries it: the slave would wait the whole interval), at most once a ``disk_check_interval_s``."""
        interval = self.config.store.retention_check_interval_s
        while not self.stopping:
            due = self._retention_due.wait(interval)
            if self.stopping:
                return
            self._retention_due.clear()
            self.run_retention()
            if due:  # a full disk asks again at every refused copy: not more often than the disk is checked
                gevent.sleep(min(interval, self.config.store.disk_check_interval_s))

    def run_retention(self):
        self.check_disk()  # measured now: a figure from before a deletion would delete again what is gone already
        usage = self.gate.disk_state.usage_ratio if self.gate.disk_state else None
        try:
            report = self.store.retention(now_ms(), usage)  # the timer index's floor: store.follower
        except OSError as exc:
            log.error("retention failed: %s", exc)
            return None
        if report.deleted_segments:
            log.info("retention deleted %d segments (%d bytes)", len(report.deleted_segments), report.freed_bytes)
        if report.pressured_segments:
            self.pressure_deleted_segments += report.pressured_segments
            log.warning("disk pressure: %d segments deleted before their retention time on this %s; reads below the "
                        "new first offsets answer as past the log's start", report.pressured_segments,
                        "master" if self.roles.is_master else "slave")
        return report

    def stop(self):
        """Graceful shutdown: stop accepting, finish in-flight requests, flush, mark clean."""
        if self.stopping:
            return
        self.stopping = True
        try:
            self._shut_down()
        except Exception:  # noqa: BLE001 - the process must still exit (not marked clean)
            log.exception("shutdown failed; the data dir is not marked clean")
        finally:
            self.stopped.set()

    def _shut_down(self):
        log.info("shutting down: no new connections; finishing in-flight requests")
        keep = ("replication",)  # slaves keep getting what the finishing requests write
        self.core.stop_accepting(keep)
        if self.mqtt_cluster is not None:
            self.cluster_members.stop()
            self.mqtt_cluster.stop()  # its links, then its client ids
        if self.mqtt is not None:  # while it may still write: its wills published, its sessions written
            self.mqtt.stop(SHUTDOWN_GRACE_S)
        if self.election is not None:
            self.election.step_down()  # stop acknowledging; an in-sync slave catches up; closing the session ends
            self.election.stop()       # our leadership at once (no session timeout to wait for)
        if self.registry is not None:
            self.registry.stop()  # first, so producers and consumers move away while we finish
        self.waiters.close()  # parked long polls answer now
        self.replies.close()  # and requests waiting for replies
        if self.remoting is not None:
            self.remoting.stop()
        if self.grpc is not None:
            self.grpc.service.stop()
        self.core.shutdown(SHUTDOWN_GRACE_S, keep)
        gevent.killall(self._tasks, block=False)
        self.guard.stop()
        self.delay.stop()  # before the flusher and the store: its last save waits for a flush
        self.timers.stop()
        self.roles.stop()
        self.pop.stop()
        self.tx.stop()
        self.ahead.stop()
        self.flusher.stop()
        if self.flusher.failure is None:
            self.store.close(now_ms())
            self.stopped_cleanly = True
            log.info("broker stopped cleanly")
        else:
            # A failed flush is never retried (fsyncgate: a retry may "succeed" without writing) and no
            # checkpoint may cover what it failed to write: let the store go as a kill -9 would.
            self.store.abandon()
            log.error("broker stopped after a failed flush (%s): the log was left as it was, not marked "
                      "clean; the next start recovers from what the disk really holds", self.flusher.failure)


def _dialed(host, port):
    """``host:port`` as other machines dial a listener bound to ``host`` (a wildcard: this machine's address)."""
    host = advertised_ip(host) if host in ("", "0.0.0.0", "::") else host
    return ("[%s]:%d" if ":" in host else "%s:%d") % (host, port)


class PeersReplication(NamedTuple):
    """What the MQTT cluster uses of the replication port (``Roles``), and nothing else of it: the replication
    ``secret`` its links and calls prove; ``is_master()``; ``is_member()``: a master with a replication port (a member
    of the cluster); ``confirmed_end()`` and ``wait_confirmed(timeout)``: what may leave this broker for a peer (in
    ``sync`` mode, only what the slaves confirmed); ``serve_peers(handler)``: the one handler of the other masters'
    links on every replication server (now and after a promotion)."""
    secret: object
    is_master: Callable
    is_member: Callable
    confirmed_end: Callable
    wait_confirmed: Callable
    serve_peers: Callable


def mqtt_cluster(config, store, put_path, members, waiters, replication):
    """The function of the MQTT port (and what the port serves the cluster's copies with, ``MqttPort.serve_copies``,
    and where a retained record may lie in its sessions' log, ``RetainedMark.end``)
    that makes its seam with the MQTT cluster (``mqttcluster.seam``): the cluster's following (its links to the
    peers, which serve the subscribers waiting here with what they copy), its client ids (calls to the other masters
    over their replication ports, with the replication secret and the TLS a slave's link uses), and the one server
    of the other masters on the replication port (``replication.serve_peers``: their follows, and their calls, each
    held to what the member may ask: ``Asks``); given every part it uses, the replication port's as ``replication``
    (``PeersReplication``)."""
    from metaq.mqttcluster.asks import Asks
    from metaq.mqttcluster.clientids.calls import PeerClient
    from metaq.mqttcluster.clientids.service import ClientIds
    from metaq.mqttcluster.following.peers import MqttCluster
    from metaq.mqttcluster.seam import ClusterSeam
    from metaq.mqttcluster.serve import PeerServer

    tls = config.security.tls
    context = client_context(tls) if tls.mode != "off" and tls.replication else None
    broker_id = config.broker.id

    def make(port, serve, retained_end):
        following = MqttCluster(broker_id, store, put_path, port, members, replication.is_master,
                                membership=registration.mqtt_membership(config.mqtt.port, config.zk.connect,
                                                           config.replication.port),
                                secret=replication.secret, tls=context, hold_s=config.mqtt.cluster_start_hold_s,
                                serve=serve)
        client_ids = ClientIds(port, store, members, broker_id, PeerClient(broker_id, replication.secret, context),
                               config.mqtt.cluster_max_ids, config.store.max_transfer_size, replication.is_member,
                               config.mqtt.cluster_id_lease_s, config.mqtt.cluster_holder_share_percent,
                               cluster=following)  # its route and positions: the takeover's end
        asks = Asks(broker_id, lambda: members.current, following.follows_here)
        peers = PeerServer(store, waiters, port.topics, following.shares, replication.confirmed_end,
                           replication.wait_confirmed, client_ids.calls, following.followed, asks, retained_end)
        replication.serve_peers(peers.serve)
        return ClusterSeam(following, client_ids, asks, peers.turn)
    return make


def grpc_port(core, config, store, put_path, guard, cluster=None, tx=None, pop=None):
    """The gRPC port (``metaq.rmq5``), given what it uses. Imported here, only when ``grpc.port`` is set: its
    protobuf code is generated at setup (tools/protos.py), and a broker without the port never needs it."""
    try:
        from metaq.rmq5.port import GrpcPort, PortLimits
        from metaq.rmq5.pulls import PullService
        from metaq.rmq5.clientcommands import ClientCommands, StoredMessages
        from metaq.rmq5.renewer import Renewer
        from metaq.rmq5.halves import Checks
        from metaq.rmq5.rpcs import MessagingService
    except ImportError as exc:
        raise errors.ConfigError("grpc.port is set but the gRPC port cannot load (%s): run make setup, or pip install "
                                 "grpcio-tools and python tools/protos.py" % exc) from None
    g, r = config.grpc, config.remoting  # half messages' check-back: the remoting port's settings
    bind = g.host or config.broker.host
    holder = {}

    def endpoint():
        return g.advertised_host or bind, holder["port"].port

    service = MessagingService(store, put_path, guard, config.remoting.broker_name or "metaq-%d" % config.broker.id,
                               config.limits.max_body_bytes, endpoint, broker_id=config.broker.id, cluster=cluster,
                               tx=tx, checks=Checks(r.transaction_check_interval_ms / 1000.0, r.transaction_timeout_ms,
                                                    r.transaction_check_max, r.max_half_messages,
                                                    transactions_limits.MAX_CHECKS_PER_ROUND), pop=pop,
                               pulls=PullService(store, guard, put_path.waiters, put_path.roles, put_path.check_master,
                                                 endpoint, config.store.max_transfer_size, config.limits.max_wait_ms),
                               clients=ClientCommands(StoredMessages(store, endpoint,
                                                                     config.store.max_transfer_size).find),
                               renewer=Renewer(pop, g.renew_invisible_ms) if pop is not None else None)
    port = holder["port"] = GrpcPort(core, service, PortLimits(g.max_streams_per_connection, g.max_message_bytes,
                                                              g.max_header_bytes, g.max_call_s, g.max_control_frames,
                                                              g.max_new_streams, g.flood_window_s,
                                                              g.flood_penalty_s))
    return port
