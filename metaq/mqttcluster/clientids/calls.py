"""Broker-to-broker calls of an MQTT cluster over the peers' replication ports (front-end: the server layer;
docs/architecture.md "MQTT cluster: client ids").

A call is one PEER_CALL frame (the caller's broker id and a JSON request ``{"op": ..., ...}``) answered by one
PEER_REPLY (JSON), both declared with the replication stream's frames (``metaq.protocol.replication``). A link
begins as a slave's does: the callee's CHALLENGE, the caller's PROOF of the shared replication secret (bound to
its broker id: ``handshake.peer_proof``), then the first call (``OPENING`` first when it is larger than the callee
reads before the proof: REPLICATION_HANDSHAKE_FRAME_BYTES); the callee answers with its own PROOF before the
first reply, and the caller acts on nothing it has not proved (``handshake.check_callee``). TLS as a slave's link
(``security.tls.replication``). Every call is bounded by ``MQTT_CLUSTER_CALL_TIMEOUT_S`` (connection, handshake
and answer): past it, or on any failure, the peer is unreachable for that call (``PeerUnreachable``). Idle links
are kept, at most ``MQTT_CLUSTER_PEER_CONNECTIONS`` per peer (on the peer's replication port they pass its
connection cap within ``MQTT_CLUSTER_PEER_HEADROOM``, clients filling the cap or not, and a proved peer's connections
count apart: ``MQTT_CLUSTER_PEERS_PER_ADDRESS``, but only once proved), each used by one call at a time, so
that many calls to one peer go at once (a CONNECT's registration each); more wait their turn within their bound.
``MQTT_CLUSTER_LEASE_CONNECTIONS`` of those turns are kept for ``lease`` calls (the client ids' lease renewals), so
that the others, however many wait, never hold a renewal back past its lease.
Links to one peer are opened one at a time, so a caller holds at most one unproved connection on a peer's port
(where the brokers of one host share ``HEADROOM_PER_ADDRESS`` until they prove the secret). An ``exclusive`` call
(the batches of ids held and released, whose order against the registrations matters) waits for every call to the
peer before it to be answered and goes alone: every call after it waits for its answer, as on one link.

``serve_calls`` answers a link's calls in order (for the cluster's one ``serve.PeerServer``), each by the handler its
``op`` names; a handler's error is sent back as ``{"error": text}``.
"""

import json
import logging
import re
import socket
import time
from collections import deque

import gevent
from gevent.event import Event
from gevent.lock import Semaphore

from metaq import errors

from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.server.replication import limits as replication_limits
from metaq.protocol import replication as rp
from metaq.protocol.replication_peer import PEER_CALL_HEAD
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.serving.connections import share_loop
from metaq.serving.replication import handshake
from metaq.serving.replication.link import send_event

log = logging.getLogger(__name__)

__all__ = ["PeerClient", "PeerUnreachable", "Turns", "serve_calls"]

#: Seconds a peer's link may stay idle on the callee before it is closed (the caller opens another).
PEER_IDLE_S = 60.0
#: The first call of a link whose real first call is larger than the callee reads before the proof
#: (``REPLICATION_HANDSHAKE_FRAME_BYTES``): an op no broker serves, answered with an error the caller passes over.
OPENING = b'{"op":"open"}'


class PeerUnreachable(Exception):
    """A call got no answer (no connection, a refused or failed handshake, no reply in time)."""


def _encode(value):
    """``value`` (a dict) as compact JSON (``json.dumps``'s bytes), built in steps with the loop shared between them
    (``share_loop``): its dicts a key at a time, its lists an item at a time (each item whole). A large answer (a
    session's handover, up to MQTT_HANDOVER_MAX_BYTES) so stalls the other clients no longer than one item (one
    message) does."""
    parts = []
    _encode_into(parts, value, [time.monotonic()])
    return "".join(parts).encode("utf-8")


def _encode_into(parts, value, turn):
    if isinstance(value, dict):
        parts.append("{")
        for i, (key, item) in enumerate(value.items()):
            parts.append("%s%s:" % ("," if i else "", _dumps(key)))
            _encode_into(parts, item, turn)
        parts.append("}")
    elif isinstance(value, list):
        parts.append("[")
        for i, item in enumerate(value):
            parts.append("," if i else "")
            parts.append(_dumps(item))
            turn[0] = share_loop(turn[0])
        parts.append("]")
    else:
        parts.append(_dumps(value))


def _dumps(value):
    return json.dumps(value, separators=(",", ":"))


def _decode(body):
    """A call's or an answer's JSON object (``_encode``'s, or any JSON object), its top-level lists parsed an item at
    a time with the loop shared between them, as ``_encode`` builds them."""
    try:
        value = _parse_in_turns(bytes(body).decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        raise errors.RemoteProtocolError("a peer call that is not JSON: %s" % exc, fatal=True) from None
    if not isinstance(value, dict):
        raise errors.RemoteProtocolError("a peer call that is not a JSON object", fatal=True)
    return value


_JSON = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")


def _parse_in_turns(text):
    """``json.loads(text)``, built in the steps ``_encode`` takes (objects a key at a time, arrays an item at a time,
    each item whole), the loop shared between them. ValueError when it is not JSON."""
    i = _skip(text, 0)
    if text[i:i + 1] != "{":
        return json.loads(text)
    value, i = _parse_value(text, i, [time.monotonic()])
    if _skip(text, i) != len(text):
        raise ValueError("extra data at %d" % i)
    return value


def _parse_value(text, i, turn):
    """``(value, the place past it)`` of the JSON value at ``i`` (no space before it)."""
    c = text[i:i + 1]
    if c == "{":
        out, i = {}, _skip(text, i + 1)
        if text[i:i + 1] == "}":
            return out, i + 1
        while True:
            key, i = _JSON.raw_decode(text, i)
            if not isinstance(key, str):
                raise ValueError("an object key that is not a string before %d" % i)
            i, _c = _expect(text, i, ":")
            out[key], i = _parse_value(text, i, turn)
            i, c = _expect(text, i, ",}")
            if c == "}":
                return out, i
    if c == "[":
        items, i = [], _skip(text, i + 1)
        if text[i:i + 1] == "]":
            return items, i + 1
        while True:
            item, i = _JSON.raw_decode(text, i)
            items.append(item)
            turn[0] = share_loop(turn[0])
            i, c = _expect(text, i, ",]")
            if c == "]":
                return items, i
    return _JSON.raw_decode(text, i)


def _skip(text, i):
    return _SPACE.match(text, i).end()


def _expect(text, i, chars):
    """``(place, c)``: the character ``c`` at ``i`` (spaces before it skipped), one of ``chars``, and the place past
    it and the spaces after it; ValueError otherwise."""
    i = _skip(text, i)
    c = text[i:i + 1]
    if not c or c not in chars:
        raise ValueError("expected one of %r at %d" % (chars, i))
    return _skip(text, i + 1), c


def _next(sock, parser, deadline):
    """The next frame, or RemoteProtocolError / OSError / TimeoutError."""
    while True:
        event = parser.next_event()
        if event is CLOSED:
            raise OSError("the peer closed the link")
        if event is not NEED_DATA:
            return event
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no answer in time")
        sock.settimeout(left)
        parser.receive_data(sock.recv(65536))


class Turns:
    """The calls to one peer: at most ``most`` at once, in the order asked (a call never passes one that waits); an
    exclusive call goes once every call before it is answered, alone, and the calls after it wait for its answer."""

    def __init__(self, most):
        self.most = most
        self.going = 0
        self.alone = False  # the call going is an exclusive one
        self._waiting = deque()  # [exclusive, Event set when its turn came]

    def take(self, exclusive, timeout):
        """Wait for a turn, at most ``timeout`` seconds; False when none came (nothing taken then)."""
        if not self._waiting and self._may(exclusive):
            self._start(exclusive)
            return True
        entry = (exclusive, Event())
        self._waiting.append(entry)
        if entry[1].wait(timeout) or entry[1].is_set():
            return True
        self._waiting.remove(entry)
        self._grant()  # an exclusive call that gave up may have held back the calls after it
        return False

    def give(self):
        """A call taken with ``take`` was answered (or failed): the next ones waiting go."""
        self.going -= 1
        self.alone = False
        self._grant()

    def _may(self, exclusive):
        return not self.alone and (self.going == 0 if exclusive else self.going < self.most)

    def _start(self, exclusive):
        self.going += 1
        self.alone = exclusive

    def _grant(self):
        while self._waiting and self._may(self._waiting[0][0]):
            exclusive, event = self._waiting.popleft()
            self._start(exclusive)
            event.set()


class _Link:
    __slots__ = ("sock", "parser")

    def __init__(self, sock, parser):
        self.sock, self.parser = sock, parser

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class PeerClient:
    """This master's calls to the others: ``broker_id`` its own, ``secret`` the replication secret (bytes or None),
    ``tls`` the TLS client context a slave's link uses (None: plain)."""

    def __init__(self, broker_id, secret, tls=None, timeout_s=mqttcluster_limits.MQTT_CLUSTER_CALL_TIMEOUT_S):
        self.broker_id = broker_id
        self.secret = secret
        self.tls = tls
        self.timeout_s = timeout_s
        self._idle = {}  # "host:port" -> [_Link]
        self._turns = {}  # "host:port" -> Turns: its calls going and waiting
        self._opening = {}  # "host:port" -> Semaphore: one link to it opened at a time
        self.calls = 0
        self.failures = 0

    def call(self, address, request, timeout_s=None, exclusive=False, lease=False):
        """``request`` (a dict) answered by the peer at ``address`` ("host:port") within ``timeout_s`` (default: the
        client's): its answer (a dict). Raises PeerUnreachable; an answer ``{"error": ...}`` is returned as it
        is. ``exclusive``: after every call before it is answered and before any after it (see the module doc).
        ``lease``: a lease renewal, in the turns kept for them (MQTT_CLUSTER_LEASE_CONNECTIONS), apart from the
        others' order."""
        self.calls += 1
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        turns = self._turns.get((address, lease))
        if turns is None:
            kept = mqttcluster_limits.MQTT_CLUSTER_LEASE_CONNECTIONS
            most = kept if lease else mqttcluster_limits.MQTT_CLUSTER_PEER_CONNECTIONS - kept
            turns = self._turns[(address, lease)] = Turns(most)
        if not turns.take(exclusive, timeout_s):
            self.failures += 1
            raise PeerUnreachable("broker at %s: its links stayed busy for %.1f s" % (address, timeout_s))
        try:
            return self._call(address, _encode(request), deadline)
        finally:
            turns.give()

    def _call(self, address, body, deadline):
        for attempt in (0, 1):  # a kept link the callee closed meanwhile: once more on a new one
            pooled = self._idle.get(address)
            link = pooled.pop() if pooled else None
            fresh = link is None
            try:
                with gevent.Timeout(max(0.001, deadline - time.monotonic()), TimeoutError):
                    if link is None:
                        with self._opening.setdefault(address, Semaphore()):
                            link = self._open(address, deadline, body)
                    else:
                        send_event(link.sock, rp.PeerCall(self.broker_id, body))
                    reply = _next(link.sock, link.parser, deadline)
                if isinstance(reply, rp.ErrorFrame):
                    raise errors.Unavailable("the peer refused the call (%d): %s" % (reply.code, reply.text))
                if not isinstance(reply, rp.PeerReply):
                    raise errors.RemoteProtocolError("expected PEER_REPLY, got %s" % type(reply).__name__.upper(),
                                                     fatal=True)
                answer = _decode(reply.body)
            except (OSError, TimeoutError, errors.MetaqError, errors.RemoteProtocolError, ValueError) as exc:
                if link is not None:
                    link.close()
                if not fresh and attempt == 0 and time.monotonic() < deadline:
                    continue
                self.failures += 1
                raise PeerUnreachable("broker at %s: %s" % (address, exc)) from None
            kept = self._idle.setdefault(address, [])
            if len(kept) < mqttcluster_limits.MQTT_CLUSTER_PEER_CONNECTIONS:
                kept.append(link)
            else:
                link.close()
            return answer
        raise PeerUnreachable("broker at %s: no answer" % address)  # not reached: the loop returns or raises

    def _open(self, address, deadline, body):
        host, _, port = address.rpartition(":")
        sock = socket.create_connection((host, int(port)), timeout=max(0.001, deadline - time.monotonic()))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.tls is not None:
            sock = self.tls.wrap_socket(sock, server_hostname=host)
        parser = rp.ReplicationParser()
        link = _Link(sock, parser)
        try:
            challenge = _next(sock, parser, deadline)
            if not isinstance(challenge, rp.Challenge):
                raise errors.RemoteProtocolError("expected CHALLENGE, got %s" % type(challenge).__name__.upper(),
                                                 fatal=True)
            ours, refusal = handshake.peer_proof(self.secret, challenge, self.broker_id)
            if refusal is not None:
                raise errors.Unauthenticated(refusal)
            send_event(sock, ours)
            small = PEER_CALL_HEAD.size + len(body) <= replication_limits.REPLICATION_HANDSHAKE_FRAME_BYTES
            send_event(sock, rp.PeerCall(self.broker_id, body if small else OPENING))
            theirs = _next(sock, parser, deadline)
            if isinstance(theirs, rp.ErrorFrame):
                raise errors.Unavailable("the peer refused the link (%d): %s" % (theirs.code, theirs.text))
            if not isinstance(theirs, rp.Proof):
                raise errors.RemoteProtocolError("expected PROOF, got %s" % type(theirs).__name__.upper(), fatal=True)
            refusal = handshake.check_callee(self.secret, challenge.nonce, ours.nonce, self.broker_id, theirs)
            if refusal is not None:
                raise errors.Unauthenticated(refusal)
            if not small:  # the opening's answer passed over, the call itself goes now
                _next(sock, parser, deadline)
                send_event(sock, rp.PeerCall(self.broker_id, body))
        except BaseException:
            link.close()
            raise
        return link

    def kept(self, address):
        """How many links to ``address`` are open and idle now (at most MQTT_CLUSTER_PEER_CONNECTIONS)."""
        return len(self._idle.get(address, ()))

    def close(self):
        for links in self._idle.values():
            for link in links:
                link.close()
        self._idle.clear()


def serve_calls(sock, parser, call, peer, handlers, admit=None):
    """One link's calls, answered in order: its first call ``call`` (a PeerCall whose caller proved the secret), then
    each next one, until the caller closes it or leaves it idle PEER_IDLE_S. ``handlers``: op -> ``fn(caller broker
    id, request) -> answer dict``; ``admit(caller, request) -> (refusal or None, request)``: what the caller may ask
    (``asks.Asks.admit``; None: all). Every call of the link is the proved broker's: one naming another ends it."""
    proved = call.broker_id
    try:
        while True:
            send_event(sock, rp.PeerReply(_encode(_answer(handlers, call, admit))))
            try:
                call = _next(sock, parser, time.monotonic() + PEER_IDLE_S)
            except TimeoutError:
                return
            if not isinstance(call, rp.PeerCall):
                raise errors.RemoteProtocolError("expected PEER_CALL, got %s" % type(call).__name__.upper(),
                                                 fatal=True)
            if call.broker_id != proved:
                log.warning("mqtt cluster: the link of broker %d from %s sent a call as broker %d: ending it", proved,
                            peer, call.broker_id)
                return
    except (OSError, errors.RemoteProtocolError) as exc:
        log.debug("mqtt cluster: the link from %s ended: %s", peer, exc)


def _answer(handlers, call, admit=None):
    """The answer to ``call`` by the handler its ``op`` names, once ``admit`` let it; a handler's error, or the
    refusal, as ``{"error": text}``."""
    try:
        request = _decode(call.body)
        handler = handlers.get(request.get("op"))
        if handler is None:
            return {"error": "unknown call %r" % request.get("op")}
        if admit is not None:
            refusal, request = admit(call.broker_id, request)
            if refusal is not None:
                log.warning("mqtt cluster: a call of broker %d refused: %s", call.broker_id, refusal)
                return {"error": refusal}
        return handler(call.broker_id, request)
    except errors.RemoteProtocolError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the caller is told, the link goes on
        log.exception("mqtt cluster: a call of broker %d failed", call.broker_id)
        return {"error": "%s: %s" % (type(exc).__name__, exc)}
