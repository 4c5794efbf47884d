"""The RocketMQ remoting port: connections, frames in, responses out (DESIGN §6).

One greenlet reads each connection and parses frames with the sans-IO
``RemotingParser``. A connection is multiplexed: quick requests are answered
in order by the reader, while pulls (which may long-poll) and sends (which
wait for their flush) each run in a greenlet of their own from a bounded pool,
so a parked pull never holds up heartbeats or other pulls on the same socket.
Responses carry the request's opaque and may go out in any order; writes hold
the connection's lock so frames never interleave.

A frame whose structure is broken (length out of range, unknown header type,
undecodable header, EOF inside a frame) closes the connection, as Java does;
a frame whose header decoded but holds a bad field gets an error response and
the connection goes on.
"""

import itertools
import logging
import socket
import time

import gevent
from gevent.lock import Semaphore
from gevent.pool import Pool

from metaq import errors
from metaq.server.remoting import limits as remoting_limits
from metaq.transactions import limits as transactions_limits
from metaq.protocol.rocketmq.remoting import RemotingCommand, RemotingParser, RequestCode, encode_command, make_request
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.serving import connections as core
from metaq.server.config import advertised_ip
from metaq.server.remoting.dispatch import RemotingDispatcher
from metaq.transactions.remoting import CheckBack
from metaq.server.remoting.clients import ClientRegistry, ProducerRegistry
from metaq.server.remoting.locks import LockTable
from metaq.reqreply.remoting import RemotingReplies

log = logging.getLogger(__name__)

#: How often clients without a recent heartbeat are dropped.
EXPIRY_INTERVAL_S = 10.0


class RemotingServer:
    """The listener, its connections and the consumer-group bookkeeping."""

    def __init__(self, core_, config, store, stats, put_path, tx, roles, waiters, elected_master=None, replies=None,
                 cluster=None):
        """``elected_master``: with ``replication.ha: auto``, a callable giving the elected master's RocketMQ
        address (``host:port``) or None while none is known; routes name it as broker 0. Without it (ha:
        manual, standalone) routes name this broker as the master, whatever its role, unless ZooKeeper names
        another. ``replies``: the request-reply router (``reqreply.service``; None: SEND_REPLY_MESSAGE is not
        supported). ``cluster(topic)``: with ZooKeeper, the cluster's brokers now (``routes.ClusterView.brokers``:
        RouteBroker rows, None while ZooKeeper cannot be read); None: this broker alone."""
        cfg = config.remoting
        self.elected_master = elected_master
        self.cluster = cluster
        self.broker_id = config.broker.id
        self.core = core_
        self.config = cfg
        self.host = cfg.host or config.broker.host
        self.port = None
        self.broker_name = cfg.broker_name or "metaq-%d" % config.broker.id
        self.store_ip = None  # set at start: the IP in routes and message ids
        self.clients = ClientRegistry(cfg.client_timeout_s, self._group_changed, cfg.max_client_entries)
        self.locks = LockTable(cfg.lock_expiry_s, cfg.max_locks)  # orderly consumers' queue locks
        self.notify_bytes = 0  # bodies of our own requests waiting to be sent, every connection's (send_request)
        # every connection's requests
        self.requests = core.ReplyBudget(remoting_limits.MAX_REMOTING_INFLIGHT_BYTES_TOTAL)
        self._changed, self._notifier = set(), None  # groups whose members changed, told after NOTIFY_COALESCE_S
        self.producers = ProducerRegistry(cfg.client_timeout_s, cfg.max_client_entries)
        self.checkback = CheckBack(tx, self.producers, cfg, lambda: (self.store_ip, self.port),
                                   transactions_limits.MAX_CHECKS_PER_ROUND)
        host = lambda: (self.store_ip, self.port)  # noqa: E731
        self.replies = (RemotingReplies(host, self.producers, replies, config.limits.max_body_bytes)
                        if replies is not None else None)
        self.dispatcher = RemotingDispatcher(
            store, stats, config, put_path, tx, roles, waiters, broker_name=self.broker_name, host=host,
            route_brokers=self.route_brokers, clients=self.clients, producers=self.producers, locks=self.locks,
            replies=self.replies, guard=getattr(core_, "guard", None), requests=self.requests,
            closing=lambda: core_.closing)
        self.stats = stats
        self.listener = None
        self._tasks = []

    @property
    def address(self):
        """``ip:port`` as routes give it to clients."""
        return "%s:%d" % (self.store_ip, self.port)

    def route_addresses(self):
        """A route's ``brokerAddrs``: ``{0: master}``, or ``{}`` while an election has no master to name
        (clients then find no writable queue and ask again at their next send)."""
        if self.elected_master is None:
            return {0: self.address}
        master = self.elected_master()
        return {0: master} if master else {}

    def route_brokers(self, topic):
        """A route's brokers, ``[(broker name, brokerAddrs, queues)]``: this broker first, its queues None (the
        store's count, asked by the caller), its master as ``route_addresses`` names it (or, ha: manual, as
        ZooKeeper does) and its slaves as ZooKeeper lists them; then every other broker of the cluster, with
        ``topic``'s queue count there (0: it does not hold the topic yet)."""
        rows = self.cluster(topic) if self.cluster is not None else None
        own = next((r for r in rows or () if r.broker_id == self.broker_id), None)
        if self.elected_master is not None or own is None:
            addrs = self.route_addresses()
        else:
            addrs = {0: own.remoting.get(0) or self.address}
        if own is not None:
            master = addrs.get(0)
            addrs.update((k, v) for k, v in own.remoting.items() if k != 0 and v != master)
        return [(self.broker_name, addrs, None)] + [(r.name, dict(r.remoting), r.queues) for r in rows or ()
                                                    if r.broker_id != self.broker_id]

    @property
    def closing(self):
        return self.core.closing

    @property
    def connections(self):
        """The open RemotingConnections (``curr_connections`` counts the text port's only)."""
        return self.core.connections("remoting")

    def start(self):
        self.listener = self.core.listen("remoting", self.host, self.config.port, self._connection)
        self.port = self.listener.port
        self.store_ip = advertised_ip(self.config.advertised_host or self.host)
        self._tasks = [gevent.spawn(self._expiry_loop)]
        self.checkback.start()

    def stop(self):
        """Stop the background tasks (the connection core closes the connections)."""
        gevent.killall(self._tasks, block=False)
        if self._notifier is not None:
            self._notifier.kill(block=False)
        self.checkback.stop()

    def _connection(self, sock, address, conn_id):
        return RemotingConnection(self, sock, address, conn_id)

    def _expiry_loop(self):
        while True:
            gevent.sleep(EXPIRY_INTERVAL_S)
            now = time.monotonic()
            self.producers.expire(now)
            for group in self.clients.expire(now):
                log.info("remoting: clients of group %s expired (no heartbeat for %.0f s)", group,
                         self.config.client_timeout_s)
            expired = self.locks.expire(now)
            if expired:
                log.info("remoting: %d queue locks expired (not renewed for %.0f s)", expired,
                         self.config.lock_expiry_s)

    def group_members(self, group):
        """``[(client id, address, idle seconds)]``: the RocketMQ clients live in consumer ``group`` (admin ops)."""
        return self.clients.live_members(group, time.monotonic())

    def connection_closed(self, conn):
        """A remoting connection ended: its clients leave their groups (consumers and producers) and give up the
        queues they locked."""
        self.clients.connection_closed(conn)
        self.producers.connection_closed(conn)
        self.locks.connection_closed(conn)

    def _group_changed(self, group):
        """Tell the group's clients to rebalance (oneway NOTIFY_CONSUMER_IDS_CHANGED), the changes of the next
        ``NOTIFY_COALESCE_S`` together: 10,000 clients joining one group each told every member (quadratic: 18 s of
        the loop for 20,000), now once per group and window."""
        self._changed.add(group)
        if self._notifier is None:
            self._notifier = gevent.spawn_later(NOTIFY_COALESCE_S, self._notify_changed)

    def _notify_changed(self):
        groups, self._changed, self._notifier = self._changed, set(), None
        turn = time.monotonic()
        for group in sorted(groups):
            for conn in self.clients.connections(group):
                conn.send_request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})
            turn = core.share_loop(turn)


#: Changes of a consumer group's members within this many seconds are told to its clients together.
NOTIFY_COALESCE_S = 0.05


class RemotingConnection(core.Connection):
    log_prefix = "remoting"

    def __init__(self, server, sock, address, conn_id):
        super().__init__(sock, address, conn_id, server.core.rules)
        self.server = server
        self.born_host = tuple(address[:2]) if isinstance(address, tuple) else ("127.0.0.1", 0)
        self.parser = RemotingParser(max_frame=server.config.max_frame_bytes)
        self.pool = Pool(remoting_limits.MAX_REMOTING_INFLIGHT)
        self.requests = core.ReplyBudget(remoting_limits.MAX_REMOTING_INFLIGHT_BYTES)  # bodies of requests in progress
        self._write_lock = Semaphore()
        self._opaques = itertools.count(1)
        self._notifying = 0  # our oneway requests waiting to be sent
        self._notify_bytes = 0  # the bodies they carry

    @property
    def busy(self):
        """Pulls and sends still running (a shutdown lets them answer: parked pulls return at once)."""
        return len(self.pool) > 0

    def send(self, cmd):
        """Write one command (a response, or our own oneway request)."""
        if self.closed or cmd is None:
            return
        data = encode_command(cmd)
        with self._write_lock:
            try:
                self.sock.sendall(data)
            except (OSError, socket.timeout) as exc:
                log.info("remoting %s: send failed (%s); closing", self.peer, exc)
                self.close()

    def send_request(self, code, ext_fields, body=b"", oneway=True):
        """A request of ours to the client, oneway unless ``oneway`` is False (its answer is ignored then: a
        PUSH_REPLY_MESSAGE_TO_CLIENT, as RocketMQ sends it), sent from a greenlet of its own: whoever caused it
        (another client's heartbeat, the check-back) never waits on this client's socket. At most
        ``limits.MAX_PENDING_NOTIFIES`` wait per connection; past that the request is dropped (clients also
        rebalance on their own every 20 s; a check-back comes again next round). Returns whether it was queued."""
        size = len(body) if body else 0
        if self.closed or self._notifying >= remoting_limits.MAX_PENDING_NOTIFIES:
            return False
        if (self._notifying and self._notify_bytes + size > remoting_limits.MAX_PENDING_NOTIFY_BYTES) or (
                self.server.notify_bytes
                and self.server.notify_bytes + size > remoting_limits.MAX_PENDING_NOTIFY_BYTES_TOTAL):
            return False  # bounded in bytes too (a pushed reply or a check-back carries a whole message): one
            # connection's, and every connection's together (thousands of connections holding one each)
        self._notifying += 1
        self._notify_bytes += size
        self.server.notify_bytes += size
        gevent.spawn(self._notify, make_request(code, ext_fields, body, opaque=next(self._opaques), oneway=oneway),
                     size)
        return True

    def _notify(self, cmd, size):
        try:
            self.send(cmd)
        finally:
            self._notifying -= 1
            self._notify_bytes -= size
            self.server.notify_bytes -= size

    def spawn(self, func, *args):
        """Run ``func(*args)`` from the connection's bounded pool (blocks while the pool is full)."""
        self.pool.spawn(func, *args)

    def close(self):
        super().close()
        self.requests.wake()

    def serve(self):
        try:
            first = True
            while not self.closed and not self.server.closing:
                data = self.receive()
                if data is None:
                    return
                if first:
                    if self.tls_hello(data):
                        return
                    first = False
                try:
                    self.parser.receive_data(data)
                except errors.RemoteProtocolError:
                    return
                if not self._process():
                    return
        finally:
            self.pool.kill(block=False)
            self.close()
            self.server.connection_closed(self)

    def _process(self):
        """Handle every complete frame buffered; False when the connection must close."""
        dispatcher = self.server.dispatcher
        turn = time.monotonic()
        while not self.closed:
            turn = core.share_loop(turn)
            if self.closed:  # closed meanwhile: nothing more is taken from this buffer
                return False
            try:
                cmd = self.parser.next_event()
            except errors.RemoteProtocolError as exc:
                self.server.stats.protocol_errors += 1
                if exc.fatal:
                    log.info("remoting %s: %s; closing", self.peer, exc.reason)
                    return False
                self.send(dispatcher.error_response(RemotingCommand(0, opaque=exc.opaque), exc))
                continue
            if cmd is NEED_DATA:
                return True
            if cmd is CLOSED:
                return False
            if cmd.is_response:
                continue  # a client's answer to one of our oneway notifications
            if not dispatcher.handle(cmd, self):
                return False
        return False
