"""The gRPC port's HTTP/2 connection (metaq/rmq5/port.py) over a Unix socket pair, with a stand-in service: deadlines,
what is no gRPC request, streams the client resets. No listening socket, no network."""

import time

import gevent
import pytest
from gevent import socket
from h2.config import H2Configuration
from h2.connection import H2Connection
from h2.events import (DataReceived, RemoteSettingsChanged, ResponseReceived, StreamEnded, StreamReset,
                       TrailersReceived)

from metaq.rmq5.port import GrpcConnection, PortLimits
from metaq.rmq5.wire import WAITS, GrpcError, Status, frame
from metaq.serving.connections import ConnectionLimits, Strangers
from metaq.server.guard import Session

SERVICE = "/apache.rocketmq.v2.MessagingService/"


class Slow:
    """A service whose unary calls take ``delay`` seconds and echo their request; Telemetry echoes each message."""

    def __init__(self, delay=0.0, waits=False):
        self.delay = delay
        self.waits = waits  # every call may wait: answered from its own greenlet, never on the reader
        self.finished = 0
        self.streams = {}  # Telemetry calls by stream id, while open (for pushes)

    def kind(self, rpc):
        return {"Echo": "unary", "Stream": "unary", "Telemetry": "telemetry", "Later": "later"}.get(rpc)

    def later(self, rpc):
        return "not yet"

    def call(self, rpc, call, data, wait=True):
        if not wait and (self.delay or self.waits or data == b"slow"):  # it may wait: a greenlet of its own
            return WAITS
        gevent.sleep(1.0 if data == b"slow" else self.delay)
        if data == b"fail":
            raise GrpcError(Status.INVALID_ARGUMENT, "asked to fail")
        self.finished += 1
        if rpc == "Stream":  # a server stream's messages (ReceiveMessage's shape): the request three times
            return [data, data, data]
        return data

    def telemetry(self, call, data):
        self.streams[call.stream_id] = call
        return b"re:" + data

    def telemetry_closed(self, call):
        self.streams.pop(call.stream_id, None)


class Peer:
    """The client's side: h2 over one end of the pair, the port's connection served on the other."""

    def __init__(self, service, port_limits=None, request_s=5.0, rules=None):
        ours, theirs = socket.socketpair()
        self.conn = GrpcConnection(theirs, ("127.0.0.1", 40000), 1, rules or ConnectionLimits(5.0, request_s),
                                   service, port_limits or PortLimits())
        self.conn.session = Session("127.0.0.1")
        if rules is not None and rules.strangers is not None:
            rules.strangers.arrive("127.0.0.1")
            self.conn.await_login("127.0.0.1", time.monotonic())
        self.server = gevent.spawn(self.conn.serve)
        self.sock = ours
        self.h2 = H2Connection(H2Configuration(client_side=True, header_encoding="utf-8"))
        self.h2.initiate_connection()
        self.flush()
        with gevent.Timeout(5):  # the port's SETTINGS and connection window first: then a large request fits
            while not any(isinstance(e, RemoteSettingsChanged) for e in self.h2.receive_data(self.sock.recv(65536))):
                pass
        self.flush()

    def flush(self):
        self.sock.sendall(self.h2.data_to_send())

    def call(self, rpc, messages=(), end=True, headers=(), method="POST", content_type="application/grpc"):
        sid = self.h2.get_next_available_stream_id()
        self.h2.send_headers(sid, [(":method", method), (":scheme", "http"), (":path", SERVICE + rpc),
                                   (":authority", "x"), ("content-type", content_type)] + list(headers),
                             end_stream=end and not messages)
        for i, m in enumerate(messages):
            data, size = frame(m), self.h2.max_outbound_frame_size
            for at in range(0, len(data), size):
                last = at + size >= len(data)
                self.h2.send_data(sid, data[at:at + size], end_stream=end and i == len(messages) - 1 and last)
        self.flush()
        return sid

    def until(self, sid, done, timeout=5.0):
        """Events of stream ``sid`` until ``done(events)``."""
        got = []
        with gevent.Timeout(timeout):
            while not done(got):
                data = self.sock.recv(65536)
                if not data:
                    break
                for e in self.h2.receive_data(data):
                    if isinstance(e, DataReceived):  # what was read opens the port's window again
                        self.h2.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
                    if getattr(e, "stream_id", None) == sid:
                        got.append(e)
                self.flush()
        return got

    def close(self):
        self.sock.close()
        self.server.join(5)


def ended(got):
    return any(isinstance(e, (StreamEnded, StreamReset)) for e in got)


def status_of(got):
    for e in got:
        if isinstance(e, (TrailersReceived, ResponseReceived)):
            h = dict(e.headers)
            if "grpc-status" in h:
                return int(h["grpc-status"]), h.get("grpc-message", "")
    return None


@pytest.fixture
def peer_factory():
    made = []

    def make(*args, **kw):
        made.append(Peer(*args, **kw))
        return made[-1]

    yield make
    for p in made:
        p.close()


def test_a_unary_call_echoes_and_ends_ok(peer_factory):
    p = peer_factory(Slow())
    sid = p.call("Echo", [b"hello"])
    got = p.until(sid, ended)
    assert b"".join(e.data for e in got if isinstance(e, DataReceived)) == frame(b"hello")
    assert status_of(got) == (0, "")


def test_a_call_answered_on_the_reader_is_answered_as_one_from_its_greenlet(peer_factory):
    def answer(service, payload):
        p = peer_factory(service)
        got = p.until(p.call("Echo", [payload]), ended)
        return [(type(e).__name__, getattr(e, "data", None), getattr(e, "headers", None)) for e in got]

    for payload in (b"hello", b"fail", b"x" * 20000):  # an answer, a refusal, one larger than a DATA frame
        assert answer(Slow(), payload) == answer(Slow(waits=True), payload)


def test_a_streamed_answer_on_the_reader_is_answered_as_one_from_its_greenlet(peer_factory, monkeypatch):
    """A server stream's messages answered on the reader (ReceiveMessage's): small, past one DATA frame, past the
    client's window (sent from a greenlet then, as it opens): the same frames and trailers as from its greenlet, and
    no greenlet for one the window takes whole."""
    spawned = []
    spawn = gevent.spawn

    def counting(fn, *args):
        spawned.append(getattr(fn, "__name__", ""))
        return spawn(fn, *args)

    def answer(service, payload):
        p = peer_factory(service)
        spawned.clear()
        got = p.until(p.call("Stream", [payload]), ended, timeout=10)
        data = b"".join(e.data for e in got if isinstance(e, DataReceived))
        return data, status_of(got), spawned.count("_unary")

    monkeypatch.setattr(gevent, "spawn", counting)
    for payload, on_reader in ((b"hello", True), (b"fail", True), (b"x" * 10000, True), (b"y" * 40000, False)):
        inline, waited = answer(Slow(), payload), answer(Slow(waits=True), payload)
        assert inline[:2] == waited[:2]
        assert inline[:2] == ((b"", (3, "asked to fail")) if payload == b"fail" else (frame(payload) * 3, (0, "")))
        assert (inline[2], waited[2]) == (0 if on_reader else 1, 1)


def test_a_call_that_waits_stalls_no_other_call_of_its_connection(peer_factory):
    p = peer_factory(Slow())
    slow = p.call("Echo", [b"slow"])  # a second in its own greenlet
    started = time.monotonic()
    assert status_of(p.until(p.call("Echo", [b"now"]), ended, timeout=0.8)) == (0, "")
    assert time.monotonic() - started < 0.8
    assert status_of(p.until(slow, ended)) == (0, "")


def test_a_call_past_its_grpc_timeout_or_max_call_s_is_deadline_exceeded(peer_factory):
    service = Slow(delay=1.0)
    p = peer_factory(service, PortLimits(max_call_s=0.3))
    sid = p.call("Echo", [b"x"], headers=[("grpc-timeout", "100m")])  # 0.1 s asked
    got = p.until(sid, ended)
    assert status_of(got)[0] == Status.DEADLINE_EXCEEDED and "0.100 s" in status_of(got)[1]
    sid = p.call("Echo", [b"x"])  # none asked: grpc.max_call_s
    got = p.until(sid, ended)
    assert status_of(got)[0] == Status.DEADLINE_EXCEEDED and "0.300 s" in status_of(got)[1]
    assert service.finished == 0
    sid = p.call("Echo", [b"x"], headers=[("grpc-timeout", "soon")])
    assert status_of(p.until(sid, ended))[0] == Status.INVALID_ARGUMENT


def test_what_is_no_grpc_request_gets_http_or_grpc_answers_and_the_connection_goes_on(peer_factory):
    p = peer_factory(Slow())
    got = p.until(p.call("Echo", [b"x"], content_type="application/json"), ended)
    assert dict(next(e for e in got if isinstance(e, ResponseReceived)).headers)[":status"] == "415"
    got = p.until(p.call("Echo", method="GET"), ended)
    assert dict(next(e for e in got if isinstance(e, ResponseReceived)).headers)[":status"] == "405"
    assert status_of(p.until(p.call("Nope", [b""]), ended))[0] == Status.UNIMPLEMENTED
    later = status_of(p.until(p.call("Later", [b""], end=False), ended))
    assert later == (Status.UNIMPLEMENTED, "Later: not yet")
    assert status_of(p.until(p.call("Echo"), ended))[0] == Status.INTERNAL  # no request message
    assert status_of(p.until(p.call("Echo", [b"a", b"b"]), ended))[0] == Status.INTERNAL  # two
    assert status_of(p.until(p.call("Echo", [b"x"], headers=[("grpc-encoding", "gzip")]), ended))[0] == \
        Status.UNIMPLEMENTED
    assert status_of(p.until(p.call("Echo", [b"fail"]), ended)) == (Status.INVALID_ARGUMENT, "asked to fail")
    assert status_of(p.until(p.call("Echo", [b"ok"]), ended)) == (0, "")


def test_telemetry_answers_each_message_and_ends_when_the_client_half_closes(peer_factory):
    service = Slow()
    p = peer_factory(service)
    sid = p.call("Telemetry", [b"one"], end=False)
    got = p.until(sid, lambda got: any(isinstance(e, DataReceived) for e in got))
    assert b"".join(e.data for e in got if isinstance(e, DataReceived)) == frame(b"re:one")
    assert service.streams[sid].push(b"from-the-server")  # the service's own message on the open stream
    got = p.until(sid, lambda got: any(isinstance(e, DataReceived) for e in got))
    assert b"".join(e.data for e in got if isinstance(e, DataReceived)) == frame(b"from-the-server")
    p.h2.send_data(sid, frame(b"two"))
    p.flush()
    got = p.until(sid, lambda got: any(isinstance(e, DataReceived) for e in got))
    assert b"".join(e.data for e in got if isinstance(e, DataReceived)) == frame(b"re:two")
    p.h2.end_stream(sid)
    p.flush()
    assert status_of(p.until(sid, ended)) == (0, "")
    assert service.streams == {}  # the service was told the stream ended


def test_a_stream_the_client_resets_is_forgotten_and_its_answer_never_sent(peer_factory):
    service = Slow(delay=0.2)
    p = peer_factory(service)
    sid = p.call("Echo", [b"x"])
    gevent.sleep(0.05)
    p.h2.reset_stream(sid)
    p.flush()
    gevent.sleep(0.4)
    assert service.finished == 1 and p.conn.calls == {} and p.conn.running == 0
    assert status_of(p.until(p.call("Echo", [b"y"]), ended)) == (0, "")


def test_a_large_answer_waits_for_the_clients_window(peer_factory):
    p = peer_factory(Slow())
    big = b"z" * 200_000  # past the default 64 KiB window: sent as the client opens it
    sid = p.call("Echo", [big])
    got = p.until(sid, ended, timeout=10)
    assert b"".join(e.data for e in got if isinstance(e, DataReceived)) == frame(big)
    assert status_of(got) == (0, "")


def test_an_incomplete_frame_counts_in_the_strangers_budget_until_it_is_whole(peer_factory):
    strangers = Strangers(10.0, 100, 16)
    p = peer_factory(Slow(), rules=ConnectionLimits(5.0, 5.0, strangers=strangers))
    sid = p.h2.get_next_available_stream_id()
    p.h2.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + "Echo"),
                            (":authority", "x"), ("content-type", "application/grpc")])
    p.h2.send_data(sid, frame(b"m" * 995), end_stream=True)  # one DATA frame of 1,000 bytes (9 of header)
    data = p.h2.data_to_send()
    p.sock.sendall(data[:-500])  # all but the last 500 bytes of that frame
    with gevent.Timeout(5):
        while strangers.partial_bytes != 509:
            gevent.sleep(0.01)
    assert p.conn.in_request and p.conn.buffered == 509
    p.sock.sendall(data[-500:])  # whole: the call is answered, the budget given back
    got = p.until(sid, ended)
    assert b"".join(e.data for e in got if isinstance(e, DataReceived)) == frame(b"m" * 995)
    with gevent.Timeout(5):
        while strangers.partial_bytes:
            gevent.sleep(0.01)


class Unsent(Slow):
    """A Slow service that notes the calls whose answers did not reach the connection (``Call.unsent``)."""

    def __init__(self, delay):
        super().__init__(delay)
        self.unsent = []

    def call(self, rpc, call, data, wait=True):
        if not wait:
            return WAITS
        call.unsent = lambda: self.unsent.append(call.stream_id)
        return super().call(rpc, call, data)


def test_a_call_answered_after_the_connection_ended_gives_back_what_it_took(peer_factory):
    """The connection ends (a protocol error: GOAWAY) while a call is being answered; when the answer is ready the
    call stops quietly and the service is told its answer was not sent."""
    service = Unsent(delay=0.3)
    p = peer_factory(service)
    sid = p.call("Echo", [b"x"])
    gevent.sleep(0.05)  # the call under way
    p.sock.sendall(b"\0\0\0\x01\x05\0\0\0\x02")  # HEADERS on an even stream: PROTOCOL_ERROR, the last GOAWAY
    with gevent.Timeout(5):
        while sid not in service.unsent:
            gevent.sleep(0.05)
    assert service.finished == 1 and service.unsent == [sid]


def test_each_frame_costs_by_its_kind():
    """FloodBudget's costs: frames that do no work count, full DATA frames are free and pay for a small frame, a stream
    opened pays for GRPC_SMALL_FRAMES_PER_STREAM small ones, tiny header-block parts that end nothing always count."""
    from metaq.rmq5 import limits as rmq5_limits
    from metaq.rmq5 import http2 as h
    from metaq.rmq5.port import FloodBudget

    small, per_stream = rmq5_limits.GRPC_SMALL_FRAME_BYTES, rmq5_limits.GRPC_SMALL_FRAMES_PER_STREAM
    budget = FloodBudget(PortLimits(max_control_frames=100))
    budget.tick(0.0)
    for head in ((h.PING, 0, 8, 0), (h.SETTINGS, h.ACK, 0, 0), (h.RST_STREAM, 0, 4, 1), (h.PRIORITY, 0, 5, 1),
                 (h.GOAWAY_FRAME, 0, 8, 0), (0x42, 0, 3, 0), (h.DATA, 0, 0, 1), (h.WINDOW_UPDATE, 0, 4, 0)):
        before = budget.controls
        assert budget.begun(*head) is None and budget.controls == before + 1, head  # each work for nothing
    assert budget.begun(h.HEADERS, h.END_HEADERS, 40, 1) is None and budget.paid == per_stream  # a stream opened
    for _ in range(per_stream):  # its small frames (a 1-byte DATA, an empty one ending it): paid
        assert budget.begun(h.DATA, h.END_STREAM, 1, 1) is None
    assert budget.controls == 8 and budget.paid == 0
    assert budget.begun(h.DATA, 0, 1, 1) is None and budget.controls == 9  # past the credit: counted
    assert budget.begun(h.DATA, 0, small, 1) is None and budget.paid == 1  # a full frame: free, pays for one
    assert budget.begun(h.DATA, 0, 1, 1) is None and budget.controls == 9 and budget.paid == 0
    assert budget.begun(h.HEADERS, h.END_HEADERS | h.END_STREAM, 10, 1) is None and budget.controls == 10  # trailers
    budget.begun(h.HEADERS, 0, small, 3)  # a large part that does not end its block: free
    assert budget.controls == 10
    budget.begun(h.CONTINUATION, 0, small - 1, 3)  # a tiny one: counted
    assert budget.controls == 11 and budget.begun(h.CONTINUATION, h.END_HEADERS, 1, 3) is None and budget.controls == 11
    assert budget.wasted() is None and budget.controls == 12  # a frame refused on its stream
    budget.controls = 100
    assert "grpc.max_control_frames" in budget.begun(h.DATA, 0, 0, 3)  # one past the budget
