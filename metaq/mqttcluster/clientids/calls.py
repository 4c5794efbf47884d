"""Broker-to-broker calls of an MQTT cluster over the peers' replication ports (front-end: the server layer;
docs/architecture.md "MQTT cluster: client ids").

A call is one PEER_CALL frame (the caller's broker id and a JSON request ``{"op": ..., "id": ..., ...}``) answered by
one PEER_REPLY (JSON) naming the call's ``id``, ``op`` and client id ``c`` back, both declared with the replication
stream's frames (``metaq.protocol.replication``). A link begins as a slave's does: the callee's CHALLENGE, the
caller's PROOF of the shared replication secret (bound to its broker id: ``handshake.peer_proof``), then the first
call (``OPENING`` first when it is larger than the callee reads before the proof: REPLICATION_HANDSHAKE_FRAME_BYTES);
the callee answers with its own PROOF before the first reply, and the caller acts on nothing it has not proved
(``handshake.check_callee``). TLS as a slave's link (``security.tls.replication``).

**Pipelined.** A broker keeps one link to each peer and sends its calls on it as they come, up to
``MQTT_CLUSTER_CALLS_IN_FLIGHT`` at once; the callee answers each as soon as it is done, in any order, and the
caller's one reader of the link hands each answer to the call its id names. An answer to no call in flight (late,
unknown, twice) or naming another op or client id than the call of its id is dropped and counted
(``PeerClient.unmatched``): a peer cannot make one call take another's answer. Every call is bounded by its own
timeout (``MQTT_CLUSTER_CALL_TIMEOUT_S`` by default: connection, handshake and answer): past it, or on any failure,
the peer is unreachable for that call (``PeerUnreachable``); a call whose answer is withheld costs the others
nothing, and the link is ended only when nothing at all came on it since that call was sent. A callee of the version
before answers in order and names no id: its answers go to the oldest call in flight, and a timeout ends the link.
Past the bound calls wait their turn, in order (a call never passes one that waits), within their bound;
``MQTT_CLUSTER_LEASE_CONNECTIONS`` of the turns are kept for ``lease`` calls (the client ids' lease renewals), so
that the others, however many wait, never hold a renewal back past its lease. The link is opened once at a time
(a caller holds at most one unproved connection on a peer's port, where the brokers of one host share
``HEADROOM_PER_ADDRESS`` until they prove the secret); one the callee closed (idle ``PEER_IDLE_S``) is opened again.
An ``exclusive`` call (the batches of ids held and released, whose order against the registrations matters) waits
for every call to the peer before it to be answered and goes alone: every call after it waits for its answer.

**Lease renewals never queue.** A broker busy with thousands of connections' turns runs its greenlets woken by
another (a spawn, an answer handed over) in order behind them, while a greenlet woken by its own socket or timer
runs at once. So a ``lease`` renewal is ``post``-ed: sent by the caller's lease loop (woken by
its timer) on the open link, its answer handed to its ``then`` by the link's reader as it reads it; the callee answers
it in the link's reading greenlet (``ANSWERED_AT_ONCE``). No hop of it waits behind the other greenlets.

``serve_calls`` answers a link's calls (for the cluster's one ``serve.PeerServer``), each by the handler its ``op``
names; a handler's error is sent back as ``{"error": text}``.
"""

import itertools
import json
import logging
import re
import socket
import time
from collections import deque

import gevent
import gevent.socket
from gevent.event import AsyncResult, Event
from gevent.lock import Semaphore

from metaq import errors
from metaq.server.replication import limits as replication_limits
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.protocol import replication as rp
from metaq.protocol.journalrecord import decode_record, encode_record
from metaq.protocol.replication_peer import PEER_CALL_HEAD
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.serving.connections import loop_polls, share_loop, turn_after
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


#: The ops a callee answers in the link's reading greenlet before it reads on (their answer takes no work, and must
#: not wait behind the loop's other greenlets: the module doc, "Lease renewals never queue").
ANSWERED_AT_ONCE = frozenset({"lease"})

#: A call or an answer of at most this many bytes is decoded in one step (orjson's, well under a millisecond); a
#: larger one (a session's handover) an item of its top-level lists at a time, the loop shared between them.
DECODE_WHOLE_BYTES = 64 * 1024


def _encode(value):
    """``value`` (a dict) as compact JSON, built in steps with the loop shared between them (``share_loop``): its
    dicts a key at a time, its lists an item at a time, each item whole by ``encode_record`` (orjson, the json module
    for what orjson will not write). A large answer (a session's handover, up to MQTT_HANDOVER_MAX_BYTES) so stalls
    the other clients no longer than one item (one message) does."""
    parts = []
    _encode_into(parts, value, [time.monotonic()])
    return b"".join(parts)


def _encode_into(parts, value, turn):
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        parts.append(b"{")
        for i, (key, item) in enumerate(value.items()):
            if i:
                parts.append(b",")
            parts.append(encode_record(key))
            parts.append(b":")
            _encode_into(parts, item, turn)
        parts.append(b"}")
    elif isinstance(value, list):
        parts.append(b"[")
        for i, item in enumerate(value):
            if i:
                parts.append(b",")
            parts.append(encode_record(item))
            turn[0] = share_loop(turn[0])
        parts.append(b"]")
    else:  # a dict with a key that is no string too: whole, its keys written as the json module writes them
        parts.append(encode_record(value))


def _decode(body):
    """A call's or an answer's JSON object (``_encode``'s, or any JSON object): up to DECODE_WHOLE_BYTES in one
    step, past it its top-level lists parsed an item at a time with the loop shared between them, as ``_encode``
    builds them. The calls' numbers fit 64 bits (ids, offsets, generations): one past them is read as a float in one
    step (``decode_record``), as an int in turns."""
    try:
        if len(body) <= DECODE_WHOLE_BYTES:
            value = decode_record(body)
        else:
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


def _send_without_waiting(sock, frame):
    """How many bytes of ``frame`` went to ``sock`` (a gevent socket, plain or TLS) without waiting for room: 0 to
    all of it. A TLS socket that took none may hold part of it: the rest is sent from the same frame, from 0."""
    timeout = sock.gettimeout()
    sock.settimeout(0.0)  # (no other greenlet runs before it is set back)
    try:
        return sock.send(frame)
    except BlockingIOError:
        return 0
    finally:
        sock.settimeout(timeout)


def _next(sock, parser, deadline):
    """The next frame, or RemoteProtocolError / OSError / TimeoutError (``deadline`` None: no bound)."""
    while True:
        event = parser.next_event()
        if event is CLOSED:
            raise OSError("the peer closed the link")
        if event is not NEED_DATA:
            return event
        if deadline is None:
            parser.receive_data(sock.recv(65536))
            continue
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
    """One call link to a peer: its calls in flight by id (``pending``: id -> ``_Waiter``, oldest first), one writer
    at a time, its answers read by one reader greenlet (``PeerClient._read``). ``ids``: the callee names its
    answers' ids (None until its first answer; False: a callee of the version before, which answers in order)."""

    __slots__ = ("sock", "parser", "pending", "writing", "ids", "heard", "dead", "reader")

    def __init__(self, sock, parser):
        self.sock, self.parser = sock, parser
        self.pending = {}
        self.writing = Semaphore()
        self.ids = None
        self.heard = 0.0  # when (monotonic) its last frame came
        self.dead = None  # why it ended (an exception), None while it serves
        self.reader = None

    def send(self, event, call_id, waiter):
        """Send the call ``event``, in flight from then as ``call_id`` (in the order the calls go on the wire: a
        callee of the version before answers in it)."""
        with self.writing:
            self.pending[call_id] = waiter
            send_event(self.sock, event)

    def fail(self, why):
        """End the link: every call in flight on it fails with ``why``."""
        if self.dead is None:
            self.dead = why
        self.close()
        pending, self.pending = self.pending, {}
        for waiter in pending.values():
            waiter.failed(why)

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class _Waiter:
    """A call in flight: its ``op`` and client id ``c`` (its answer must name them back), its ``result``; ``then``: a
    posted call's (``PeerClient.post``), called with the answer by the link's reader."""

    __slots__ = ("op", "c", "result", "then", "timer")

    def __init__(self, request, then=None):
        self.op, self.c = request.get("op"), request.get("c")
        self.result = AsyncResult()
        self.then = then
        self.timer = None  # a posted call's bound

    def answered(self, answer):
        self.result.set(answer)
        self._then(answer)

    def failed(self, why):
        """No answer will come (the link ended, the bound passed): a posted call's ``then`` is told None."""
        self.result.set_exception(why)
        self._then(None)

    def _then(self, answer):
        if self.timer is not None:
            self.timer.close()
            self.timer = None
        if self.then is not None:
            then, self.then = self.then, None
            try:
                then(answer)
            except Exception:  # noqa: BLE001 - the link's reader goes on
                log.exception("mqtt cluster: handling an answer of a peer failed")


class PeerClient:
    """This master's calls to the others: ``broker_id`` its own, ``secret`` the replication secret (bytes or None),
    ``tls`` the TLS client context a slave's link uses (None: plain). One link to each peer, its calls pipelined, its
    answers read by a greenlet of its own (on a gevent socket: cooperative whether or not the process is patched)."""

    def __init__(self, broker_id, secret, tls=None, timeout_s=mqttcluster_limits.MQTT_CLUSTER_CALL_TIMEOUT_S):
        self.broker_id = broker_id
        self.secret = secret
        self.tls = tls
        self.timeout_s = timeout_s
        self._links = {}  # "host:port" -> _Link
        self._turns = {}  # ("host:port", lease) -> Turns: its calls going and waiting
        self._opening = {}  # "host:port" -> Semaphore: one link to it opened at a time
        self._ids = itertools.count(1)  # call ids: never used twice by this client
        self.calls = 0
        self.failures = 0
        self.unmatched = 0  # answers dropped: an id not in flight (late, unknown, twice), or naming another call

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
            most = kept if lease else mqttcluster_limits.MQTT_CLUSTER_CALLS_IN_FLIGHT - kept
            turns = self._turns[(address, lease)] = Turns(most)
        if not turns.take(exclusive, timeout_s):
            self.failures += 1
            raise PeerUnreachable("broker at %s: %d calls in flight to it stayed unanswered for %.1f s "
                                  "(MQTT_CLUSTER_CALLS_IN_FLIGHT)" % (address, turns.most, timeout_s))
        try:
            return self._call(address, request, deadline)
        finally:
            turns.give()

    def post(self, address, request, then, timeout_s=None):
        """Send ``request`` to the peer at ``address`` on the link open to it, without waiting: ``then(answer)`` is
        called by the link's reader as the answer comes, ``then(None)`` when none will (the link ended, or
        ``timeout_s`` passed, default the client's: the link is then ended when nothing came on it since). The
        frame goes now as far as the socket takes it, its rest by a greenlet of its own (the peer reads slowly).
        False, nothing sent, when no link is open, another greenlet is writing on it or the write failed (``call``
        opens one and waits its turn). For the lease renewals (the module doc): no greenlet is made or woken on the
        way."""
        link = self._links.get(address)
        if link is None or link.dead is not None or link.writing.locked():
            return False
        self.calls += 1
        call_id = next(self._ids)
        waiter = _Waiter(request, then)
        frame = rp.serialize(rp.PeerCall(self.broker_id, _encode(dict(request, id=call_id))))
        sent = time.monotonic()
        link.writing.acquire()  # free (looked at above, nothing yielded since): the frame goes whole before another
        link.pending[call_id] = waiter
        try:
            went = _send_without_waiting(link.sock, frame)
        except OSError as exc:
            del link.pending[call_id]
            link.writing.release()
            link.fail(exc)
            return False  # nothing sent: ``call`` opens another link
        if went < len(frame):
            gevent.spawn(self._send_rest, link, frame, went)
        else:
            link.writing.release()
        waiter.timer = gevent.get_hub().loop.timer(self.timeout_s if timeout_s is None else timeout_s)
        waiter.timer.start(self._posted_unanswered, link, call_id, sent, update=True)
        return True

    @staticmethod
    def _send_rest(link, frame, went):
        """The rest of a posted call's frame past ``went`` bytes, ``link``'s writer held until it is whole."""
        try:
            link.sock.sendall(frame[went:])
        except OSError as exc:
            link.fail(exc)
        finally:
            link.writing.release()

    def _posted_unanswered(self, link, call_id, sent):
        """A posted call's time ran out (in the loop's timer callback: nothing here waits)."""
        waiter = link.pending.pop(call_id, None)
        if waiter is None:
            return
        self.failures += 1
        waiter.failed(TimeoutError("no answer in time"))
        if link.ids is not True or link.heard < sent:  # answered in order, or nothing heard since: as ``_call``
            link.fail(OSError("no answer in time"))

    def _call(self, address, request, deadline):
        call_id = next(self._ids)
        body = _encode(dict(request, id=call_id))
        for attempt in (0, 1):  # a kept link the callee closed meanwhile: once more on a new one
            link = self._links.get(address)
            fresh = link is None or link.dead is not None
            waiter = _Waiter(request)
            sent = time.monotonic()
            try:
                with gevent.Timeout(max(0.001, deadline - time.monotonic()), TimeoutError):
                    if fresh:
                        with self._opening.setdefault(address, Semaphore()):
                            link = self._links.get(address)
                            if link is None or link.dead is not None:
                                link = self._open(address, deadline, body, call_id, waiter)
                            else:
                                fresh = False
                                self._send(link, call_id, waiter, body)
                    else:
                        self._send(link, call_id, waiter, body)
                    return waiter.result.get()
            except TimeoutError:
                if link is not None:
                    link.pending.pop(call_id, None)
                    if link.ids is not True or link.heard < sent:  # answered in order, or nothing heard since
                        link.fail(OSError("no answer in time"))
                self.failures += 1
                raise PeerUnreachable("broker at %s: no answer in time" % address) from None
            except (OSError, errors.MetaqError, errors.RemoteProtocolError, ValueError) as exc:
                if link is not None:
                    link.pending.pop(call_id, None)
                    link.fail(exc if isinstance(exc, OSError) else OSError(str(exc)))
                if not fresh and attempt == 0 and time.monotonic() < deadline and link.heard < sent:
                    continue
                self.failures += 1
                raise PeerUnreachable("broker at %s: %s" % (address, exc)) from None
        raise PeerUnreachable("broker at %s: no answer" % address)  # not reached: the loop returns or raises

    def _send(self, link, call_id, waiter, body):
        if link.dead is not None:
            raise OSError("the link ended: %s" % link.dead)
        link.send(rp.PeerCall(self.broker_id, body), call_id, waiter)

    def _open(self, address, deadline, body, call_id, waiter):
        host, _, port = address.rpartition(":")
        sock = gevent.socket.create_connection((host, int(port)), timeout=max(0.001, deadline - time.monotonic()))
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
            link.pending[call_id] = waiter
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
            link.pending.pop(call_id, None)
            link.close()
            raise
        link.heard = time.monotonic()
        sock.settimeout(None)
        self._links[address] = link
        link.reader = gevent.spawn(self._read, address, link)
        return link

    def _read(self, address, link):
        """The answers of ``link``, each to the call its id names (a callee of the version before: the oldest in
        flight), until the link ends; an answer to no call in flight, or naming another op or client id than the
        call of its id, is dropped and counted (``unmatched``): the call waits on, within its own bound."""
        try:
            while link.dead is None:
                event = _next(link.sock, link.parser, None)
                link.heard = time.monotonic()
                if isinstance(event, rp.ErrorFrame):
                    raise errors.Unavailable("the peer refused the call (%d): %s" % (event.code, event.text))
                if not isinstance(event, rp.PeerReply):
                    raise errors.RemoteProtocolError("expected PEER_REPLY, got %s" % type(event).__name__.upper(),
                                                     fatal=True)
                self._match(link, _decode(event.body))
        except (OSError, TimeoutError, errors.MetaqError, errors.RemoteProtocolError, ValueError) as exc:
            link.fail(exc if isinstance(exc, OSError) else OSError(str(exc)))
        finally:
            if self._links.get(address) is link:
                del self._links[address]

    def _match(self, link, answer):
        """Hand ``answer`` to the call in flight on ``link`` it answers (see ``_read``)."""
        if link.ids is None:
            link.ids = "id" in answer
        if not link.ids:
            if not link.pending:
                self.unmatched += 1
                return
            link.pending.pop(next(iter(link.pending))).answered(answer)
            return
        call_id = answer.pop("id", None)
        op, c = answer.pop("op", None), answer.pop("c", None)
        waiter = link.pending.get(call_id) if isinstance(call_id, int) else None
        if waiter is None or op != waiter.op or c != waiter.c:
            self.unmatched += 1
            log.warning("mqtt cluster: an answer of a peer to no call in flight (id %r, op %r, client id %r): dropped",
                        call_id, op, c)
            return
        del link.pending[call_id]
        waiter.answered(answer)

    def in_flight(self, address):
        """Calls to ``address`` sent and not answered yet."""
        link = self._links.get(address)
        return len(link.pending) if link is not None else 0

    def kept(self, address):
        """How many links to ``address`` are open now (one at most: its calls are pipelined)."""
        link = self._links.get(address)
        return int(link is not None and link.dead is None)

    def close(self):
        links, self._links = self._links, {}
        for link in links.values():
            link.fail(OSError("the client closed"))


def serve_calls(sock, parser, call, peer, handlers, admit=None):
    """One link's calls, from its first call ``call`` (a PeerCall whose caller proved the secret), until the caller
    closes it or leaves it idle PEER_IDLE_S (no call in flight). A call naming an ``id`` is answered by a greenlet of
    its own, its answer naming the id and the call's ``op`` and client id ``c`` back (answers go in any order), at
    most MQTT_CLUSTER_CALLS_IN_FLIGHT at once (one past is answered at once with an error saying so); a call with
    none (a caller of the version before) is answered before the next is read. ``handlers``: op -> ``fn(caller
    broker id, request) -> answer dict``; ``admit(caller, request) -> (refusal or None, request)``: what the caller
    may ask (``asks.Asks.admit``; None: all). Every call of the link is the proved broker's: one naming another ends
    it. A ``lease`` call is answered before the next is read (``ANSWERED_AT_ONCE``); the calls of a pipeline read in
    one go share the loop (``turn_after``)."""
    proved = call.broker_id
    writing = Semaphore()
    going = set()

    def reply(answer):
        with writing:
            send_event(sock, rp.PeerReply(_encode(answer)))

    def serve_one(request, call):
        try:
            reply(_echo(request, _answer(handlers, call, admit, request)))
        except OSError as exc:
            log.debug("mqtt cluster: an answer to %s was not sent: %s", peer, exc)
        finally:
            going.discard(gevent.getcurrent())

    turn, polls = time.monotonic(), loop_polls()
    try:
        while True:
            try:
                request = _decode(call.body)
            except errors.RemoteProtocolError as exc:
                request = exc
            if isinstance(request, dict) and "id" in request and request.get("op") in ANSWERED_AT_ONCE:
                reply(_echo(request, _answer(handlers, call, admit, request)))
            elif isinstance(request, dict) and "id" in request:
                if len(going) >= mqttcluster_limits.MQTT_CLUSTER_CALLS_IN_FLIGHT:
                    most = mqttcluster_limits.MQTT_CLUSTER_CALLS_IN_FLIGHT
                    reply(_echo(request, {"error": "broker %d has %d calls in flight on one link: at most %d "
                                                   "(MQTT_CLUSTER_CALLS_IN_FLIGHT)" % (proved, len(going), most)}))
                else:
                    going.add(gevent.spawn(serve_one, request, call))
            else:
                reply(_answer(handlers, call, admit, request))
            turn, polls = turn_after(turn, polls)  # a caller's pipeline of calls answered here shares the loop
            while True:
                try:
                    call = _next(sock, parser, time.monotonic() + PEER_IDLE_S)
                    break
                except TimeoutError:
                    if not going:
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
    # the calls still being answered finish (a registration half made is never left): their answers go nowhere


def _echo(request, answer):
    """``answer`` naming the call it answers: the request's ``id``, ``op`` and client id ``c`` first."""
    head = {"id": request.get("id"), "op": request.get("op")}
    if "c" in request:
        head["c"] = request["c"]
    head.update((k, v) for k, v in answer.items() if k not in head)
    return head


def _answer(handlers, call, admit=None, request=None):
    """The answer to ``call`` (``request``: its body decoded, or the error decoding it) by the handler its ``op``
    names, once ``admit`` let it; a handler's error, or the refusal, as ``{"error": text}``."""
    try:
        if request is None:
            request = _decode(call.body)
        if isinstance(request, errors.RemoteProtocolError):
            raise request
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
