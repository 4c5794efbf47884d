"""One link to one peer: connect to its replication port, prove the secret with the slave's handshake
(``serving.replication.link.authenticate``, with the peers' proofs: ``handshake.peer_proof``), send ROUTES (this
broker's filters, its resume positions for that peer and its ``$share`` groups with members; in parts when it does not
fit one frame: ``split_routes``, the first in the handshake, the others once the peer's first RECORDS proved it; a
first part the peer would not read before the proof, REPLICATION_HANDSHAKE_FRAME_BYTES, goes after an empty one), then
hand each RECORDS frame to the cluster (``MqttCluster.apply``) and send ROUTES again when the filters or the groups
change. Each ROUTES names its route's version, which the peer acks (ROUTED): ``acked``, the latest version the peer
acts on, for the takeover's end (``MqttCluster.routed``). A link that hears no frame for LINK_TIMEOUT_S (the peer
sends one at least every HEARTBEAT_S) ends: one watch a link (``_watch``), not a timer armed and cancelled on every
read. A link that fails is retried with backoff (BACKOFF_MIN_S .. BACKOFF_MAX_S) and says why in stats.
"""

import logging
import socket
import time

import gevent

from metaq import errors
from metaq.server.replication import limits as replication_limits
from metaq.protocol import replication as rp
from metaq.protocol.replication_mqtt import split_routes
from metaq.serving.connections import loop_polls, turn_after
from metaq.serving.replication.link import (BACKOFF_MAX_S, BACKOFF_MIN_S, LINK_TIMEOUT_S, authenticate, next_event,
                                           send_event)

log = logging.getLogger(__name__)

#: A link looks at the route at least this often (a change wakes it at once).
ROUTE_WAIT_S = 1.0
#: Seconds after which a link whose peer was sent a route version and never acked one is a link to a peer of the version
#: before the acks: a takeover's end does not wait for it (a peer that acks does so within milliseconds of a route).
ACK_EXPECTED_S = 2.0


class PeerLink:
    """This broker following peer ``broker_id`` at ``address`` (``"host:port"`` of its replication port)."""

    def __init__(self, cluster, broker_id, address):
        self.cluster = cluster
        self.broker_id = broker_id
        self.address = address
        host, _sep, port = address.rpartition(":")
        self.host, self.port = host.strip("[]"), int(port)
        self.connected = False
        self.last_error = None
        self.connects = 0
        self.lost = 0  # times the link ended once up (stat ``mqtt_cluster_links_lost``)
        self.copied = 0
        self._sock = None
        self._greenlet = None
        self._stopping = False
        self._heard = 0.0  # when the link's last frame came (time.monotonic(): ``_watch``)
        self._silent = False  # the link ended for hearing nothing for LINK_TIMEOUT_S
        self._sent_version = None
        #: the latest version of this broker's route the peer acked (ROUTED): it copies by it (or a later one) from
        #: the positions this broker held when the ack came; kept across reconnections (a route sent again on a new
        #: link applies from the positions the link resumes at)
        self.acked = 0
        self.asked_at = None  # when this link's peer was first sent a route version to ack since the link came up

    def state(self):
        if self.connected:
            return "up %s" % self.address
        return "down %s (%s), retrying" % (self.address, self.last_error or "connecting")

    def start(self):
        self._greenlet = gevent.spawn(self._run)

    def stop(self):
        self._stopping = True
        self._close()
        if self._greenlet is not None:
            self._greenlet.kill(block=False)

    def _close(self):
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _run(self):
        delay = BACKOFF_MIN_S
        while not self._stopping:
            started = time.monotonic()
            try:
                self._session()
            except (OSError, errors.MetaqError) as exc:
                self.last_error = str(exc) or type(exc).__name__
                if self._stopping:
                    pass  # stopped here (the peer left the members, this broker stops): not lost
                elif self.connected:
                    self.lost += 1
                    log.warning("mqtt cluster: link to peer broker %d (%s) lost: %s; reconnecting", self.broker_id,
                                self.address, exc)
                else:
                    log.info("mqtt cluster: cannot follow peer broker %d (%s): %s; retrying in %.1f s",
                             self.broker_id, self.address, exc, delay)
            finally:
                self.connected = False
                self._close()
            if self._stopping:
                return
            if time.monotonic() - started > 5.0:
                delay = BACKOFF_MIN_S
            gevent.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    def _session(self):
        cluster = self.cluster
        sock = self._sock = socket.create_connection((self.host, self.port), timeout=5.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if cluster.tls is not None:
            sock = self._sock = cluster.tls.wrap_socket(sock, server_hostname=self.host)
        parser = rp.ReplicationParser()
        version, filters = cluster.route()
        cluster.positions.untold(self.broker_id)  # this link's peer tells the epochs of what it sends again
        positions = cluster.positions.of(self.broker_id)
        retained, retained_check, retained_epoch, retained_path = cluster.retained_from(self.broker_id)
        routes = rp.Routes(cluster.broker_id, filters, positions, retained,
                           cluster.groups(), cluster.positions.checks(self.broker_id, positions), version=version,
                           weights=cluster.weights(), retained_check=retained_check,
                           epochs=cluster.positions.epochs(self.broker_id, positions), retained_epoch=retained_epoch,
                           epoch_paths=cluster.positions.epoch_paths(self.broker_id, positions),
                           retained_epoch_path=retained_path)
        parts = self._parts(routes)
        if len(rp.serialize(parts[0])) - rp.FRAME_HEADER.size > replication_limits.REPLICATION_HANDSHAKE_FRAME_BYTES:
            # the peer reads no larger frame before the proof: a first part with none of the route, the route after
            parts.insert(0, routes._replace(filters=(), positions=(), groups=(), checks=(), more=True, weights=(),
                                            epochs=(), epoch_paths=()))
        first = authenticate(sock, parser, cluster.secret, cluster.broker_id, parts[0], next_event, "RECORDS")
        for part in parts[1:]:  # the peer starts its follow once the last part came
            send_event(sock, part)
        self._sent_version = version
        sock.settimeout(None)  # a frame within LINK_TIMEOUT_S: ``_watch``
        self._heard, self._silent = time.monotonic(), False
        self.connected = True
        self.asked_at = time.monotonic() if version else None
        self.connects += 1
        self.last_error = None
        log.info("mqtt cluster: following peer broker %d (%s): %d filters", self.broker_id, self.address,
                 len(filters))
        sender = gevent.spawn(self._send_routes, sock)
        watch = gevent.spawn(self._watch, sock, parser, LINK_TIMEOUT_S)
        try:
            event, turn, polls = first, time.monotonic(), loop_polls()
            while not self._stopping:
                if isinstance(event, rp.Records):
                    routed = []
                    self.copied += cluster.apply(self.broker_id, event.entries, routed)
                    self._acks(routed)
                else:
                    raise errors.RemoteProtocolError("unexpected %s from peer broker %d"
                                                     % (type(event).__name__.upper(), self.broker_id), fatal=True)
                # a backlog's frames let the other connections run every MAX_TURN_MS; a wait for a frame let them
                turn, polls = turn_after(turn, polls)
                try:
                    event = next_event(sock, parser)
                except OSError:
                    if self._silent:
                        raise TimeoutError("peer broker %d sent no frame for %.0f s (LINK_TIMEOUT_S)"
                                           % (self.broker_id, LINK_TIMEOUT_S)) from None
                    raise
                self._heard = time.monotonic()
        finally:
            sender.kill(block=False)
            watch.kill(block=False)

    def _watch(self, sock, parser, timeout_s):
        """Close ``sock`` once nothing came on it for ``timeout_s``, neither a frame (``_heard``) nor bytes of one
        (``parser.buffered`` moved: a large frame on a slow link), looked at every quarter of it: the read waiting on
        it fails and the link ends as a silent one (``_silent``). The link's reads wait without a timeout of their
        own."""
        seen, moved = parser.buffered, time.monotonic()
        while True:
            now, buffered = time.monotonic(), parser.buffered
            if buffered != seen:
                seen, moved = buffered, now
            last = max(moved, self._heard)
            if now - last >= timeout_s:
                self._silent = True
                sock.close()
                return
            gevent.sleep(min(timeout_s / 4, last + timeout_s - now))

    def _send_routes(self, sock):
        """Send ROUTES again whenever this broker's filters or groups change."""
        cluster = self.cluster
        while True:
            version, filters = cluster.route()
            if version == self._sent_version:
                cluster.route_changed.wait(ROUTE_WAIT_S)
                continue
            self._sent_version = version
            if self.asked_at is None and version:
                self.asked_at = time.monotonic()
            try:
                for part in self._parts(rp.Routes(cluster.broker_id, filters, (), -1, cluster.groups(),
                                                  version=version, weights=cluster.weights())):
                    send_event(sock, part)
            except OSError:
                return

    def owes_ack(self, version):
        """True when this link's peer is to ack ``version`` of the route and has not yet: the link is up, and the peer
        acks routes (it acked one, or was asked to less than ACK_EXPECTED_S ago, or is about to be)."""
        return self.connected and self.acked < version and \
            (self.acked > 0 or self.asked_at is None or time.monotonic() - self.asked_at < ACK_EXPECTED_S)

    def _acks(self, versions):
        """The route versions the peer's ROUTED entries of a RECORDS frame already applied name (``MqttCluster.apply``
        collects them as it reads the frame, once): ``acked`` moves, the waiters wake."""
        acked = max(versions, default=0)
        if acked > self.acked:
            self.acked = acked
            self.cluster.acked()

    def _parts(self, routes):
        """``routes`` as the ROUTES frames that carry it (``split_routes``), logged when it takes more than one."""
        parts = split_routes(routes)
        if len(parts) > 1:
            log.info("mqtt cluster: the route to peer broker %d (%d filters, %d positions, %d groups) goes in %d "
                     "ROUTES frames (MQTT_CLUSTER_ROUTES_BYTES each at most)", self.broker_id, len(routes.filters),
                     len(routes.positions), len(routes.groups), len(parts))
        return parts
