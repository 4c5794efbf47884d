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

import errno
import itertools
import logging
import socket
import time

import gevent
from gevent.lock import Semaphore
from gevent.pool import Pool
from gevent.server import StreamServer

from metaq import errors, limits
from metaq.protocol.rocketmq.remoting import RemotingCommand, RemotingParser, RequestCode, encode_command, make_request
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.server.remoting.dispatch import RemotingDispatcher
from metaq.server.remoting.clients import ClientRegistry

log = logging.getLogger(__name__)

RECV_BYTES = 256 * 1024
#: How often clients without a recent heartbeat are dropped.
EXPIRY_INTERVAL_S = 10.0


def advertised_ip(host):
    """An IP address clients can reach for a bind host (a wildcard bind advertises this machine's address)."""
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0]
    except OSError:
        return "127.0.0.1"


class RemotingServer:
    """The listener, its connections and the consumer-group bookkeeping."""

    def __init__(self, broker):
        cfg = broker.config.remoting
        self.broker = broker
        self.config = cfg
        self.host = cfg.host or broker.config.broker.host
        self.port = None
        self.broker_name = cfg.broker_name or "metaq-%d" % broker.config.broker.id
        self.store_ip = None  # set at start: the IP in routes and message ids
        self.connections = set()  # RemotingConnections (not counted in curr_connections: that is the text port)
        self.clients = ClientRegistry(cfg.client_timeout_s, self._group_changed)
        self.dispatcher = RemotingDispatcher(broker, self)
        self._server = None
        self._tasks = []

    @property
    def address(self):
        """``ip:port`` as routes give it to clients."""
        return "%s:%d" % (self.store_ip, self.port)

    def start(self):
        self._server = StreamServer((self.host, self.config.port), self._handle, backlog=1024)
        self._server.start()
        self.port = self._server.server_port
        self.store_ip = advertised_ip(self.config.advertised_host or self.host)
        self._tasks = [gevent.spawn(self._expiry_loop)]

    def stop(self, grace_s=10.0):
        """Stop accepting, let requests in progress finish (parked pulls answer at once: the broker is
        stopping), then close every connection."""
        if self._server is not None:
            self._server.close()
        gevent.killall(self._tasks, block=False)
        deadline = time.monotonic() + grace_s
        for conn in list(self.connections):
            conn.pool.join(timeout=max(0.0, deadline - time.monotonic()))
        for conn in list(self.connections):
            conn.close()

    def _handle(self, sock, address):
        if self.broker.stopping:
            sock.close()
            return
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        conn = RemotingConnection(self, sock, address)
        conn.conn_id = next(self.broker._conn_ids)  # owner of its half messages' transactions, like a text one
        self.connections.add(conn)
        try:
            conn.serve()
        finally:
            self.connections.discard(conn)
            self.clients.connection_closed(conn)
            self.broker.tx.connection_closed(conn.conn_id)

    def _expiry_loop(self):
        while True:
            gevent.sleep(EXPIRY_INTERVAL_S)
            for group in self.clients.expire(time.monotonic()):
                log.info("remoting: clients of group %s expired (no heartbeat for %.0f s)", group,
                         self.config.client_timeout_s)

    def _group_changed(self, group):
        """Tell the group's clients to rebalance now (oneway NOTIFY_CONSUMER_IDS_CHANGED)."""
        for conn in self.clients.connections(group):
            conn.send_request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})


class RemotingConnection:
    def __init__(self, server, sock, address):
        self.server = server
        self.broker = server.broker
        self.sock = sock
        self.peer = "%s:%s" % address[:2] if isinstance(address, tuple) else str(address)
        self.born_host = tuple(address[:2]) if isinstance(address, tuple) else ("127.0.0.1", 0)
        self.closed = False
        self.conn_id = 0
        self.parser = RemotingParser(max_frame=server.config.max_frame_bytes)
        self.pool = Pool(limits.MAX_REMOTING_INFLIGHT)
        self._write_lock = Semaphore()
        self._opaques = itertools.count(1)
        lim = self.broker.config.limits
        self.idle_timeout = lim.idle_timeout_s
        self.request_timeout = lim.request_timeout_s

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

    def send_request(self, code, ext_fields):
        """A oneway request of ours to the client (its answer, if any, is ignored)."""
        self.send(make_request(code, ext_fields, opaque=next(self._opaques), oneway=True))

    def spawn(self, func, *args):
        """Run ``func(*args)`` from the connection's bounded pool (blocks while the pool is full)."""
        self.pool.spawn(func, *args)

    def close(self):
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass

    def serve(self):
        try:
            while not self.closed and not self.broker.stopping:
                data = self._receive()
                if data is None:
                    return
                if not self._process():
                    return
        finally:
            self.pool.kill(block=False)
            self.close()

    def _receive(self):
        timeout = self.request_timeout if self.parser.in_frame else self.idle_timeout
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(RECV_BYTES)
        except socket.timeout:
            log.info("remoting %s: %s for %.0f s; closing", self.peer,
                     "a partial frame" if self.parser.in_frame else "no request", timeout)
            return None
        except OSError as exc:
            if exc.errno not in (errno.ECONNRESET, errno.EBADF, errno.ENOTCONN):
                log.info("remoting %s: receive failed: %s", self.peer, exc)
            return None
        try:
            self.parser.receive_data(data)
        except errors.RemoteProtocolError:
            return None
        return data

    def _process(self):
        """Handle every complete frame buffered; False when the connection must close."""
        dispatcher = self.server.dispatcher
        while not self.closed:
            try:
                cmd = self.parser.next_event()
            except errors.RemoteProtocolError as exc:
                self.broker.stats.protocol_errors += 1
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
