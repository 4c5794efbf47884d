"""Broker assembly: one store, one flusher, the text server, background tasks, shutdown."""

import itertools
import logging
import socket
import time
import zlib

import gevent
from gevent.event import Event
from gevent.lock import Semaphore
import yaml
from gevent.server import StreamServer

from metaq import speedups
from metaq.protocol import checksum
from metaq.protocol.text import encode_result
from metaq.server.delay import DelayScheduler
from metaq.server.text.dispatch import TextDispatcher
from metaq.server.text.fastput import FastPuts
from metaq.server.flusher import AheadWorker, Flusher, now_ms
from metaq.server.longpoll import PartitionWaiters
from metaq.server.replication import roles
from metaq.server.registry import ZkRegistry
from metaq.server.remoting.server import RemotingServer
from metaq.server.replication.slave import SlaveLink
from metaq.server.stats import BrokerStats, NodeFacts, StatsService, remoting_values
from metaq.server.text.connection import Connection
from metaq.server.transactions import TxService
from metaq.store.store import MessageStore

log = logging.getLogger(__name__)

#: Seconds a graceful shutdown waits for busy connections to finish their requests.
SHUTDOWN_GRACE_S = 10.0


class Broker:
    def __init__(self, config, config_path=None):
        self.config = config
        self.config_path = config_path
        self.stats = BrokerStats()
        self.waiters = PartitionWaiters()
        self.stopping = False
        self.stopped = Event()
        self.stopped_cleanly = False  # set by a stop that flushed everything and marked the shutdown clean
        self.connections = set()
        self.max_connections = config.max_connections()
        self.disk_state = None
        self.refusal = None  # why puts are refused right now (disk, failed flush), or None
        self.port = None
        self._tasks = []
        self._server = None
        self.config_checksum = zlib.crc32(self.config_text())
        started = time.monotonic()
        self.store = MessageStore.open(config.store_config(), now_ms())
        self.recovery_seconds = time.monotonic() - started
        self._log_recovery()
        self.store_lock = Semaphore()  # background store work (checkpoints, work ahead) vs a replication cut
        self.flusher = Flusher(self.store, self.store.config, self.on_visible, self.refresh_refusal, self.store_lock)
        self.ahead = AheadWorker(self.store, self.store_lock)
        self.role = roles.startup_role(config, self.store)  # "master" | "slave" (see roles.py)
        self.promoting = False
        self.started = False
        self.slave_link = SlaveLink(self) if self.role == "slave" else None
        self.replication = roles.make_replication_server(self) if self.role == "master" else None
        self.read_refusal = roles.handshake_refusal(self)  # why gets are refused (before a rejoin's handshake)
        self.registry = ZkRegistry(self) if config.zk.connect else None
        self.tx = TxService(self)  # after the store: recovery completes interrupted commits
        self.delay = DelayScheduler(self)  # reads its levels' entries from the recovered store
        self._conn_ids = itertools.count(1)
        self.dispatcher = TextDispatcher(self)
        self.remoting = RemotingServer(self) if config.remoting.port else None
        self.fast_puts = FastPuts(self, self.dispatcher) if config.broker.burst_puts else None
        self.stats_service = StatsService(self.stats, self.store, self.flusher, self.waiters, self.config_text)
        self.stats_service.add_source("node", self.stats_facts)
        self.stats_service.add_source("replication", lambda: roles.stats_values(self))
        self.stats_service.add_source("delay", self.delay.summary_values)
        self.stats_service.add_source("delay_levels", self.delay.level_rows)
        self.stats_service.add_source("transactions", self.tx.manager.in_doubt)
        self.stats_service.add_source("remoting", lambda: remoting_values(self.remoting))

    # -- facts used by handlers and stats ------------------------------------

    @property
    def connection_count(self):
        return len(self.connections)

    def stats_facts(self):
        """What ``stats`` shows of the broker itself (``StatsService``'s ``node`` source)."""
        return NodeFacts(self.config.broker.id, self.port, self.slave_link is not None, self.connection_count,
                         self.config_checksum, self.config.store.flush,
                         self.disk_state.usage_ratio if self.disk_state else 0.0, bool(self.refusal),
                         self.registry.state if self.registry is not None else "standalone")

    def config_text(self):
        if self.config_path:
            with open(self.config_path, "rb") as f:
                return f.read()
        return yaml.safe_dump(self.config.model_dump(), sort_keys=False).encode()

    def refresh_refusal(self):
        """Recompute ``refusal`` from the flusher's health and the last disk check."""
        if self.flusher.failure is not None:
            self.refusal = "writes are refused after a failed flush (%s); restart the broker" % self.flusher.failure
        elif self.disk_state is not None and self.disk_state.refusing_writes:
            self.refusal = self.disk_state.reason
        else:
            self.refusal = None

    def on_visible(self, keys):
        self.waiters.notify(keys)
        if self.replication is not None:
            self.replication.notify()

    # -- lifecycle -----------------------------------------------------------

    def _log_recovery(self):
        r = self.store.recovery
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

    def set_role(self, role, slave_link):
        """Switch to ``"master"`` (slave_link None) or to ``"slave"`` of ``slave_link``'s master (roles.py)."""
        if self.slave_link is not None and self.slave_link is not slave_link:
            self.slave_link.stop()
        if self.replication is not None and role == "slave":
            self.replication.stop()
        self.role, self.slave_link = role, slave_link
        if role == "master":
            self.replication = roles.make_replication_server(self)
            self.read_refusal = None
            if self.started and self.replication is not None:
                self.replication.start()
        else:
            self.replication = None
            self.read_refusal = roles.handshake_refusal(self)
            if self.started:
                slave_link.start()
        if self.registry is not None:
            self.registry.set_role(slave_link.slave_id if slave_link is not None else None)
        self.delay.role_changed()

    def start(self):
        cfg = self.config.broker
        if self.registry is not None:
            self.registry.open_session()
            if self.role == "master" and self.registry.zk.connected:
                roles.rejoin_if_superseded(self)
        if self.role == "master":
            roles.begin_master_epoch(self)
        self._server = StreamServer((cfg.host, cfg.port), self._handle, backlog=1024)
        self._server.start()
        self.port = self._server.server_port
        self.flusher.start()
        self.ahead.start()
        self.disk_state = self.store.check_disk()
        self.refresh_refusal()
        self._tasks = [gevent.spawn(self._disk_loop), gevent.spawn(self._retention_loop)]
        self.tx.start()
        self.delay.start()  # after the flusher: its saves wait for deliveries to be durable
        if self.replication is not None:
            self.replication.start()
        if self.remoting is not None:
            self.remoting.start()
        if self.slave_link is not None:
            self.slave_link.start()
        if self.registry is not None:
            self.registry.start(self.port)
        self.started = True
        log.info("metaq broker %d ready on %s:%d (flush=%s, data=%s, max_connections=%d%s%s, epoch %d)",
                 cfg.id, cfg.host, self.port, self.config.store.flush,
                 self.store.config.data_dir, self.max_connections,
                 ", RocketMQ remoting on %s (name server and broker %s)" % (self.remoting.address,
                                                                           self.remoting.broker_name)
                 if self.remoting else "",
                 ", slave %d of %s" % (self.slave_link.slave_id, self.slave_link.master) if self.slave_link
                 else ", replication port %d (%s)" % (self.replication.port, self.replication.mode)
                 if self.replication else "", self.store.epochs.epoch)
        if self.read_refusal is not None:
            log.warning("reads refused until the first epoch handshake: %s", self.read_refusal)
        if checksum.IMPLEMENTATION == "python-zlib":
            log.warning("the C helper metaq._speedups is %s: puts and reads take the slower pure-Python path",
                        "turned off (METAQ_PURE_PYTHON)" if speedups.built() else "not built (no compiler?)")
        else:
            log.info("C helper loaded; CRC-32 from %s", checksum.IMPLEMENTATION)

    def _handle(self, sock, address):
        if self.stopping:
            sock.close()
            return
        if len(self.connections) >= self.max_connections:
            try:
                sock.sendall(encode_result(503, b"too many connections: the limit is %d" % self.max_connections, 0))
            except OSError:
                pass
            sock.close()
            log.warning("refused a connection from %s: %d connections open", address[0], len(self.connections))
            return
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # replies are small: no Nagle delay
        except OSError:
            pass
        conn = Connection(self, sock, address)
        conn.conn_id = next(self._conn_ids)
        self.connections.add(conn)
        try:
            conn.serve()
        finally:
            self.connections.discard(conn)
            self.tx.connection_closed(conn.conn_id)

    def _disk_loop(self):
        interval = self.config.store.disk_check_interval_s
        while not self.stopping:
            before = self.disk_state.refusing_writes if self.disk_state else False
            try:
                self.disk_state = self.store.check_disk()
            except OSError as exc:
                log.error("disk check failed: %s", exc)
            self.refresh_refusal()
            now_refusing = self.disk_state.refusing_writes
            if now_refusing != before:
                if now_refusing:
                    log.error("%s", self.disk_state.reason)
                else:
                    log.warning("disk usage %.1f%% is below the danger mark again: writes accepted",
                                self.disk_state.usage_ratio * 100)
            gevent.sleep(interval)

    def _retention_loop(self):
        interval = self.config.store.retention_check_interval_s
        while not self.stopping:
            gevent.sleep(interval)
            self.run_retention()

    def run_retention(self):
        usage = self.disk_state.usage_ratio if self.disk_state else None
        try:
            report = self.store.retention(now_ms(), usage)
        except OSError as exc:
            log.error("retention failed: %s", exc)
            return None
        if report.deleted_segments:
            log.info("retention deleted %d segments (%d bytes)", len(report.deleted_segments), report.freed_bytes)
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
        if self._server is not None:
            self._server.close()
        if self.registry is not None:
            self.registry.stop()  # first, so producers and consumers move away while we finish
        self.waiters.notify_all()
        if self.remoting is not None:
            self.remoting.stop(SHUTDOWN_GRACE_S)
        for conn in list(self.connections):
            if not conn.busy:
                conn.close()
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        while any(c.busy for c in self.connections) and time.monotonic() < deadline:
            gevent.sleep(0.01)
        for conn in list(self.connections):
            conn.close()
        gevent.killall(self._tasks, block=False)
        self.delay.stop()  # before the flusher and the store: its last save waits for a flush
        if self.slave_link is not None:
            self.slave_link.stop()
        if self.replication is not None:
            self.replication.stop()
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
