"""The gRPC port's HTTP/2 connection against raw HTTP/2 peers (hand-built frames, or h2 as a client) and a real broker:
floods of control frames and streams (the loop is shared, the budgets end the connection with ENHANCE_YOUR_CALM),
frames refused from their header, an incomplete frame held to the request deadline, a first call that long-polls
past the login deadline, and a GOAWAY either way ending the connection cleanly (RFC 9113 section 6.8)."""

import socket
import threading
import time

import pytest

from metaq.client.local import BrokerProcess, free_port, small_config
from tests.harness.acl import SECRETS, write_acl
from tests.hostile.common import LoopProbe, hang_up
from tests.rmq5.test_grpc_port import SERVICE, Client, RawH2, _has, code, credentials

grpc = pytest.importorskip("grpc")
pb = pytest.importorskip("metaq.rmq5.messages_pb2")
hpack = pytest.importorskip("hpack")
from h2.events import ConnectionTerminated, DataReceived, StreamEnded, StreamReset, TrailersReceived  # noqa: E402

pytestmark = pytest.mark.integration

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
NO_ERROR, FRAME_SIZE_ERROR, ENHANCE_YOUR_CALM = 0, 6, 11
MAX_CONTROL = 50
MAX_NEW_STREAMS = 20
MAX_FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE: the port advertises HTTP/2's default


def frame(ftype, flags=0, sid=0, payload=b"", length=None):
    n = len(payload) if length is None else length
    return n.to_bytes(3, "big") + bytes((ftype, flags)) + sid.to_bytes(4, "big") + payload


def header_block(rpc, extra=()):
    """A request's header block in literals never indexed: HPACK that changes no table, sent as often as wanted."""
    headers = [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + rpc), (":authority", "x"),
               ("content-type", "application/grpc"), ("te", "trailers"), ("x-mq-client-id", "raw"), *extra]
    return hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in headers])


class Frames:
    """A raw peer's socket read as frames."""

    def __init__(self, port, timeout=10):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout) if port else None
        self.buf = b""

    @classmethod
    def over(cls, sock):
        frames = cls(None)
        frames.sock = sock
        return frames

    def send(self, data):
        self.sock.sendall(data)

    def read(self, until, timeout=10):
        """Frames ``(type, flags, stream id, payload)`` read until ``until(frames)`` holds or the connection ends
        ("closed" last); the frames."""
        got, deadline = [], time.monotonic() + timeout
        while not until(got) and time.monotonic() < deadline:
            while len(self.buf) >= 9 and len(self.buf) >= 9 + int.from_bytes(self.buf[:3], "big"):
                n = int.from_bytes(self.buf[:3], "big")
                got.append((self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big"), self.buf[9:9 + n]))
                self.buf = self.buf[9 + n:]
            if until(got):
                break
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                break
            except ConnectionResetError:
                data = b""
            if not data:
                got.append("closed")
                break
            self.buf += data
        return got

    def close(self):
        self.sock.close()


def goaway_code(frames):
    """The error code of the first GOAWAY among ``frames`` (None: none)."""
    for f in frames:
        if f != "closed" and f[0] == GOAWAY:
            return int.from_bytes(f[3][4:8], "big")
    return None


def answered(frames):
    """The streams answered to their end among ``frames``."""
    return {f[2] for f in frames if f != "closed" and f[0] == HEADERS and f[1] & END_STREAM}


def ended(frames):
    return "closed" in frames or goaway_code(frames) is not None


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    wd = tmp_path_factory.mktemp("grpcconn")
    # no cooldown here: these tests cut connections from one address and connect again (see the cooldown's own)
    cfg = small_config(wd / "data", grpc={"port": free_port(), "max_control_frames": MAX_CONTROL,
                                          "max_new_streams": MAX_NEW_STREAMS, "flood_penalty_s": 0},
                       store={"flush": "async", "flush_interval_ms": 20})
    b = BrokerProcess(wd, cfg).start()
    yield b
    b.kill()


def grpc_port(b):
    return b.config["grpc"]["port"]


# -- control frames and streams: the loop shared, the budgets ---------------------------------------------------


def flood(kind):
    """64 KiB or so of one flood's frames, stream ids from ``kind``'s counter (a reset flood's streams)."""
    if kind == "ping":
        return frame(PING, 0, 0, b"12345678") * 3800
    if kind == "settings":
        return frame(SETTINGS) * 7200
    block = header_block("SendMessage")
    sid, parts = flood.next_sid, []
    for _ in range(1000):
        parts.append(frame(HEADERS, END_HEADERS, sid, block) + frame(RST_STREAM, 0, sid, b"\0\0\0\x08"))
        sid += 2
    flood.next_sid = sid
    return b"".join(parts)


flood.next_sid = 1


def attacker(port, kind, stop):
    """Flood the port with ``kind`` frames as fast as it takes them, reading and dropping what it answers, connecting
    again whenever the broker closes the connection, until ``stop``."""
    while not stop.is_set():
        flood.next_sid = 1
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            time.sleep(0.01)
            continue
        reader = threading.Thread(target=_drop, args=(s,), daemon=True)
        reader.start()
        try:
            s.sendall(PREFACE + frame(SETTINGS))
            while not stop.is_set():
                s.sendall(flood(kind))
        except OSError:
            pass
        hang_up(s)
        reader.join(5)


def _drop(s):
    try:
        while s.recv(65536):
            pass
    except OSError:
        pass


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ping", "settings", "reset"])
def test_a_flood_of_control_frames_lets_other_clients_in(broker, kind):
    stop = threading.Event()
    thread = threading.Thread(target=attacker, args=(grpc_port(broker), kind, stop), daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        with LoopProbe(broker.port) as probe:
            time.sleep(3)
    finally:
        stop.set()
        thread.join(10)
    assert probe.latencies and not probe.failures
    # one turn of the loop at most (the whole flood, reconnecting as it is closed, before)
    assert probe.worst() < 1.0, (probe.worst(), len(probe.latencies))
    assert len(probe.latencies) >= 20, len(probe.latencies)


def test_control_frames_up_to_grpc_max_control_frames_are_answered_and_one_more_ends_the_connection(broker):
    raw = Frames(grpc_port(broker))
    try:
        # its SETTINGS and the acknowledgement of the port's count: 2 of the budget
        raw.send(PREFACE + frame(SETTINGS) + frame(SETTINGS, ACK))
        pings = MAX_CONTROL - 2
        raw.send(b"".join(frame(PING, 0, 0, i.to_bytes(8, "big")) for i in range(pings)))
        got = raw.read(lambda got: sum(1 for f in got if f != "closed" and f[0] == PING) == pings or ended(got))
        assert sum(1 for f in got if f != "closed" and f[:2] == (PING, ACK)) == pings and not ended(got), got[-3:]
        raw.send(frame(PING, 0, 0, b"one more"))
        got = raw.read(lambda got: "closed" in got)
        assert goaway_code(got) == ENHANCE_YOUR_CALM and "closed" in got, got
    finally:
        raw.close()


def test_streams_up_to_grpc_max_new_streams_are_answered_and_one_more_ends_the_connection(broker):
    raw = Frames(grpc_port(broker))
    block = header_block("Heartbeat")
    try:
        raw.send(PREFACE + frame(SETTINGS))
        # each a whole call (no request message: answered INTERNAL in its trailers), all at once
        raw.send(b"".join(frame(HEADERS, END_HEADERS | END_STREAM, 2 * i + 1, block) for i in range(MAX_NEW_STREAMS)))
        got = raw.read(lambda got: len(answered(got)) == MAX_NEW_STREAMS or ended(got))
        assert len(answered(got)) == MAX_NEW_STREAMS and not ended(got), got[-3:]
        raw.send(frame(HEADERS, END_HEADERS | END_STREAM, 2 * MAX_NEW_STREAMS + 1, block))
        got = raw.read(lambda got: "closed" in got)
        assert goaway_code(got) == ENHANCE_YOUR_CALM and "closed" in got, got
    finally:
        raw.close()


def _budget_then_one_more(broker, opening, counted, spent=2):
    """After ``opening`` (the preface, the SETTINGS and their ACK: 2 of the control budget; else ``spent``),
    ``counted`` frames to the last of the budget with a PING (answered: the connection goes on), then one more
    (GOAWAY ENHANCE_YOUR_CALM)."""
    raw = Frames(grpc_port(broker))
    try:
        raw.send(opening)
        raw.send(counted * (MAX_CONTROL - 1 - spent) + frame(PING, 0, 0, b"in stock"))  # the budget, to the last
        got = raw.read(lambda got: any(f != "closed" and f[0] == PING for f in got) or ended(got))
        assert not ended(got) and any(f[:2] == (PING, ACK) for f in got if f != "closed"), got[-3:]
        raw.send(counted)  # one more
        got = raw.read(lambda got: "closed" in got)
        assert goaway_code(got) == ENHANCE_YOUR_CALM and "closed" in got, got
    finally:
        raw.close()


def test_empty_data_frames_count_as_control_frames_and_one_past_the_budget_ends_the_connection(broker):
    opening = PREFACE + frame(SETTINGS) + frame(SETTINGS, ACK) + frame(HEADERS, END_HEADERS, 1,
                                                                       header_block("Heartbeat"))
    _budget_then_one_more(broker, opening, frame(DATA, 0, 1))  # empty, the stream goes on


def test_window_updates_for_no_data_sent_count_as_control_frames_and_one_past_the_budget_ends_the_connection(broker):
    update = frame(WINDOW_UPDATE, 0, 0, (1).to_bytes(4, "big"))  # window the port never used, returned
    _budget_then_one_more(broker, PREFACE + frame(SETTINGS) + frame(SETTINGS, ACK), update)


def test_window_updates_answering_data_sent_are_free_up_to_their_credit():
    from metaq.rmq5.port import FloodBudget, PortLimits
    from metaq.rmq5.http2 import WINDOW_UPDATE as WU
    budget = FloodBudget(PortLimits(max_control_frames=10))
    budget.tick(0.0)
    for _ in range(3):
        budget.sent_data()  # three DATA frames: six updates free
    assert all(budget.begun(WU, 0, 4, 1) is None for _ in range(6)) and budget.controls == 0
    assert all(budget.begun(WU, 0, 4, 0) is None for _ in range(10)) and budget.controls == 10  # then counted
    assert "WINDOW_UPDATE" in budget.begun(WU, 0, 4, 0)  # one past the control budget
    for _ in range(100):
        budget.sent_data()
    assert budget.credit == 10  # held to the control budget: no hoard of free updates


def test_a_header_block_is_bounded_as_it_comes_and_one_byte_past_ends_the_connection(broker):
    from metaq.rmq5 import limits as rmq5_limits
    bound = rmq5_limits.GRPC_HEADER_BLOCK_FACTOR * rmq5_limits.GRPC_MAX_HEADER_BYTES
    raw = Frames(grpc_port(broker))
    try:
        raw.send(PREFACE + frame(SETTINGS))
        # a block up to the bound, END_HEADERS never sent: held, the connection open
        raw.send(frame(HEADERS, 0, 1, b"\0" * (MAX_FRAME - 100)) +
                 frame(CONTINUATION, 0, 1, b"\0" * (bound - (MAX_FRAME - 100) - MAX_FRAME)) +
                 frame(CONTINUATION, 0, 1, b"\0" * MAX_FRAME))
        got = raw.read(ended, timeout=1)
        assert not ended(got), got
        raw.send(frame(CONTINUATION, 0, 1, b"\0"))  # one byte past: refused before h2 buffers more
        got = raw.read(lambda got: "closed" in got)
        assert goaway_code(got) == ENHANCE_YOUR_CALM and "closed" in got, got
    finally:
        raw.close()
    # a client's ordinary calls go on meanwhile and after
    ok = Frames(grpc_port(broker))
    try:
        ok.send(PREFACE + frame(SETTINGS) + frame(HEADERS, END_HEADERS | END_STREAM, 1, header_block("Heartbeat")))
        got = ok.read(lambda got: 1 in answered(got) or ended(got))
        assert 1 in answered(got), got
    finally:
        ok.close()


# -- HTTP/2's protocol errors, each with RFC 9113's code ----------------------------------------------------------


@pytest.mark.parametrize("breach,code", [
    (frame(HEADERS, END_HEADERS | END_STREAM, 2, b""), 1),  # a client's stream with an even id: PROTOCOL_ERROR
    (frame(DATA, 0, 9, b"x"), 1),  # DATA on a stream never opened
    (frame(WINDOW_UPDATE, 0, 0, (0).to_bytes(4, "big")), 1),  # an increment of 0
    (frame(5, END_HEADERS, 1, b"\0\0\0\2"), 1),  # PUSH_PROMISE from a client
    (frame(SETTINGS, 0, 0, (4).to_bytes(2, "big") + (1 << 31).to_bytes(4, "big")), 3),  # FLOW_CONTROL_ERROR
    (frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff"), 9),  # a block that does not decode: COMPRESSION_ERROR
], ids=["even-stream", "idle-data", "zero-window-update", "push-promise", "initial-window", "hpack"])
def test_http2_protocol_errors_end_the_connection_with_their_code(broker, breach, code):
    raw = Frames(grpc_port(broker))
    try:
        raw.send(PREFACE + frame(SETTINGS) + frame(HEADERS, END_HEADERS | END_STREAM, 1, header_block("Heartbeat")))
        got = raw.read(lambda got: 1 in answered(got) or ended(got))
        assert 1 in answered(got) and not ended(got), got
        raw.send(breach)
        got = raw.read(lambda got: "closed" in got)
        assert goaway_code(got) == code and "closed" in got, got
    finally:
        raw.close()


def test_a_frame_on_a_closed_stream_is_reset_stream_closed_and_the_connection_goes_on(broker):
    raw = Frames(grpc_port(broker))
    try:
        raw.send(PREFACE + frame(SETTINGS) + frame(HEADERS, END_HEADERS | END_STREAM, 1, header_block("Heartbeat")))
        got = raw.read(lambda got: 1 in answered(got) or ended(got))
        assert 1 in answered(got), got
        raw.send(frame(DATA, 0, 1, b"late"))  # stream 1 is over
        got = raw.read(lambda got: any(f != "closed" and f[0] == RST_STREAM for f in got) or ended(got))
        assert [(f[2], int.from_bytes(f[3], "big")) for f in got if f[0] == RST_STREAM] == [(1, 5)], got
        raw.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, header_block("Heartbeat")))
        got = raw.read(lambda got: 3 in answered(got) or ended(got))
        assert 3 in answered(got) and not ended(got), got
    finally:
        raw.close()


# -- every frame budgeted by its cost: the floods of frames that do no work are cut ----------------------------


def _after_the_cut_a_bystander_is_answered(broker, bystander):
    """A call on ``bystander`` (a connection opened before the flood) is answered once the flood was cut."""
    bystander.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, header_block("Heartbeat")))
    got = bystander.read(lambda got: 3 in answered(got) or ended(got))
    assert 3 in answered(got) and not ended(got), got


def _bystander(broker):
    raw = Frames(grpc_port(broker))
    raw.send(PREFACE + frame(SETTINGS) + frame(HEADERS, END_HEADERS | END_STREAM, 1, header_block("Heartbeat")))
    got = raw.read(lambda got: 1 in answered(got) or ended(got))
    assert 1 in answered(got), got
    return raw


def test_one_byte_data_frames_on_an_open_stream_count_past_the_streams_credit_and_one_past_the_budget_ends_it(
        broker):
    """A stream pays for GRPC_SMALL_FRAMES_PER_STREAM small frames (its 5-byte message prefix takes one); past
    them each 1-byte DATA frame counts against the control budget; one past it ends the connection, and another
    client is answered."""
    from metaq.rmq5 import limits as rmq5_limits
    bystander = _bystander(broker)
    try:
        prefix = frame(DATA, 0, 1, b"\0" + (1 << 20).to_bytes(4, "big"))  # a message of 1 MiB begun
        opening = PREFACE + frame(SETTINGS) + frame(SETTINGS, ACK) + frame(HEADERS, END_HEADERS, 1,
                                                                           header_block("SendMessage")) + prefix
        _budget_then_one_more(broker, opening, frame(DATA, 0, 1, b"x"),
                              spent=2 - (rmq5_limits.GRPC_SMALL_FRAMES_PER_STREAM
                                                                                     - 1))
        _after_the_cut_a_bystander_is_answered(broker, bystander)
    finally:
        bystander.close()


def test_data_on_a_closed_stream_counts_each_frame_and_one_past_the_budget_ends_the_connection(broker):
    """Full DATA frames on a stream already answered are reset STREAM_CLOSED, each counted as a frame that did no
    work; one past the budget ends the connection, and another client is answered."""
    bystander = _bystander(broker)
    try:
        opening = PREFACE + frame(SETTINGS) + frame(SETTINGS, ACK) + frame(HEADERS, END_HEADERS | END_STREAM, 1,
                                                                           header_block("Heartbeat"))
        _budget_then_one_more(broker, opening, frame(DATA, 0, 1, b"\0" * 1024))
        _after_the_cut_a_bystander_is_answered(broker, bystander)
    finally:
        bystander.close()


def test_frames_of_an_unknown_type_count_and_one_past_the_budget_ends_the_connection(broker):
    _budget_then_one_more(broker, PREFACE + frame(SETTINGS) + frame(SETTINGS, ACK), frame(0x42, 0, 0, b"whatever"))


@pytest.mark.parametrize("opening,flood", [
    # HEADERS again and again on a stream the client reset: each a stream error STREAM_CLOSED
    (frame(HEADERS, END_HEADERS, 1, header_block("Heartbeat")) + frame(RST_STREAM, 0, 1, b"\0\0\0\x08"),
     frame(HEADERS, END_HEADERS | END_STREAM, 1, header_block("Heartbeat"))),
    # a header block of 1-byte CONTINUATION frames (gathered in linear time, and each counted)
    (frame(HEADERS, 0, 1, header_block("Heartbeat")[:1]), frame(CONTINUATION, 0, 1, b"\0")),
    # a GOAWAY over and over
    (b"", frame(GOAWAY, 0, 0, b"\0" * 8)),
    # PRIORITY making an open stream depend on itself: each a stream error
    (frame(HEADERS, END_HEADERS, 1, header_block("Heartbeat")), frame(2, 0, 1, b"\0\0\0\1\x10")),
    # a WINDOW_UPDATE of 0 on a closed stream: each a stream error
    (frame(HEADERS, END_HEADERS | END_STREAM, 1, header_block("Heartbeat")), frame(WINDOW_UPDATE, 0, 1, b"\0" * 4)),
], ids=["headers-on-reset-stream", "tiny-continuation", "goaway", "priority-on-itself", "zero-update-closed"])
def test_a_flood_of_frames_that_do_no_work_is_cut_with_enhance_your_calm(broker, opening, flood):
    raw = Frames(grpc_port(broker))
    try:
        raw.send(PREFACE + frame(SETTINGS) + opening)
        try:
            raw.send(flood * (2 * MAX_CONTROL))
        except OSError:  # closed while sending: read what came before
            pass
        got = raw.read(lambda got: "closed" in got)
        assert goaway_code(got) == ENHANCE_YOUR_CALM and "closed" in got, got[-3:]
    finally:
        raw.close()


# -- RFC 9113's cases (those h2spec checks), each as raw frames -------------------------------------------------


@pytest.mark.parametrize("breach,code", [
    (frame(HEADERS, END_HEADERS | END_STREAM, 1, header_block("Heartbeat")), 5),  # on a closed stream: STREAM_CLOSED
    (frame(HEADERS, END_HEADERS | END_STREAM, 5, header_block("Heartbeat")) +
     frame(HEADERS, END_HEADERS | END_STREAM, 3, header_block("Heartbeat")), 1),  # a lower stream id: PROTOCOL_ERROR
    (frame(HEADERS, END_HEADERS, 1, header_block("Heartbeat")), 1),  # ending nothing, so no trailers: PROTOCOL_ERROR
], ids=["closed-stream", "lower-stream-id", "not-ending-closed-stream"])
def test_headers_on_a_closed_stream_or_a_lower_id_is_a_connection_error(broker, breach, code):
    test_http2_protocol_errors_end_the_connection_with_their_code(broker, breach, code)


@pytest.mark.parametrize("first", [frame(PING, 0, 0, b"\0" * 8), frame(SETTINGS, ACK),
                                   frame(HEADERS, END_HEADERS | END_STREAM, 1, header_block("Heartbeat"))],
                         ids=["ping", "settings-ack", "headers"])
def test_the_first_frame_after_the_preface_must_be_settings(broker, first):
    raw = Frames(grpc_port(broker))
    try:
        raw.send(PREFACE + first)
        got = raw.read(lambda got: "closed" in got)
        assert goaway_code(got) == 1 and "closed" in got and not answered(got), got
    finally:
        raw.close()


def _content_length(n):
    return header_block("Heartbeat", [("content-length", str(n))])


REFUSED_STREAM, RST_PRIORITY = 7, 2


@pytest.mark.parametrize("opening,probe,code", [
    # PRIORITY making stream 1 depend on itself: PROTOCOL_ERROR
    (frame(HEADERS, END_HEADERS, 1, header_block("Heartbeat")), frame(RST_PRIORITY, 0, 1, b"\0\0\0\1\x10"), 1),
    # content-length 1, 4 bytes of DATA; content-length 9, 4 bytes and the end: PROTOCOL_ERROR
    (frame(HEADERS, END_HEADERS, 1, _content_length(1)), frame(DATA, END_STREAM, 1, b"\0\0\0\0\0"), 1),
    (frame(HEADERS, END_HEADERS, 1, _content_length(9)), frame(DATA, 0, 1, b"\0\0\0") + frame(DATA, END_STREAM, 1,
                                                                                             b"\0\0"), 1),
    # a WINDOW_UPDATE of 0 on a stream answered and closed: PROTOCOL_ERROR
    (frame(HEADERS, END_HEADERS | END_STREAM, 1, header_block("Heartbeat")), frame(WINDOW_UPDATE, 0, 1, b"\0" * 4), 1),
], ids=["priority-on-itself", "content-length-short", "content-length-long", "zero-update-closed"])
def test_a_stream_error_resets_its_stream_and_the_connection_goes_on(broker, opening, probe, code):
    raw = Frames(grpc_port(broker))
    try:
        raw.send(PREFACE + frame(SETTINGS) + opening)
        if opening[4] & END_STREAM:  # answered first: the stream is closed
            got = raw.read(lambda got: 1 in answered(got) or ended(got))
            assert 1 in answered(got), got
        raw.send(probe)
        got = raw.read(lambda got: any(f != "closed" and f[0] == RST_STREAM and f[2] == 1 for f in got) or ended(got))
        assert [int.from_bytes(f[3], "big") for f in got if f != "closed" and f[0] == RST_STREAM] == [code], got
        raw.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, header_block("Heartbeat")))
        got = raw.read(lambda got: 3 in answered(got) or ended(got))
        assert 3 in answered(got) and not ended(got), got
    finally:
        raw.close()


def test_a_stream_past_max_concurrent_streams_is_refused_and_the_goaway_names_the_last_stream_taken(roomy):
    """One stream more than SETTINGS_MAX_CONCURRENT_STREAMS is reset REFUSED_STREAM (a gRPC client retries it), the
    connection going on; a GOAWAY after names the last stream taken, not the refused one."""
    from metaq.rmq5 import limits as rmq5_limits
    most = rmq5_limits.GRPC_MAX_STREAMS_PER_CONNECTION
    raw = Frames(grpc_port(roomy))
    block = header_block("Heartbeat")
    try:
        raw.send(PREFACE + frame(SETTINGS))
        raw.send(b"".join(frame(HEADERS, END_HEADERS, 2 * i + 1, block) for i in range(most)))  # each left open
        refused = 2 * most + 1
        raw.send(frame(HEADERS, END_HEADERS | END_STREAM, refused, block))
        got = raw.read(lambda got: any(f != "closed" and f[0] == RST_STREAM for f in got) or ended(got))
        assert [(f[2], int.from_bytes(f[3], "big")) for f in got if f[0] == RST_STREAM] == [(refused,
                                                                                            REFUSED_STREAM)], got
        raw.send(frame(DATA, END_STREAM, 1, b""))  # a call ends (answered INTERNAL: no message): room for one
        got = raw.read(lambda got: 1 in answered(got) or ended(got))
        assert 1 in answered(got) and not ended(got), got
        raw.send(frame(HEADERS, END_HEADERS | END_STREAM, refused + 2, block))  # taken and answered
        got = raw.read(lambda got: refused + 2 in answered(got) or ended(got))
        assert refused + 2 in answered(got) and not ended(got), got
        raw.send(frame(PING, 0, 1, b"\0" * 8))  # a PING on a stream: the connection ends, its GOAWAY says how far
        got = raw.read(lambda got: "closed" in got)
        goaway = [f for f in got if f != "closed" and f[0] == GOAWAY][0]
        assert int.from_bytes(goaway[3][:4], "big") == refused + 2 and goaway_code(got) == 1, goaway
    finally:
        raw.close()


def test_a_plain_http_answer_is_sent_as_the_clients_window_takes_it(broker):
    """A GET (no gRPC call) is answered 405 with a line of text; with the client's initial window 0 the stream stays
    open until a WINDOW_UPDATE lets part of the text through, then the rest, the last frame ending the stream."""
    raw = Frames(grpc_port(broker))
    get = hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in (
        (":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "x"))])
    try:
        raw.send(PREFACE + frame(SETTINGS, 0, 0, (4).to_bytes(2, "big") + (0).to_bytes(4, "big")) +
                 frame(HEADERS, END_HEADERS | END_STREAM, 1, get))
        got = raw.read(lambda got: any(f != "closed" and f[0] == HEADERS for f in got) or ended(got))
        heads = [f for f in got if f != "closed" and f[0] == HEADERS]
        assert heads and not heads[0][1] & END_STREAM and not ended(got), got  # the text waits for the window
        raw.send(frame(WINDOW_UPDATE, 0, 1, (1).to_bytes(4, "big")))
        got = raw.read(lambda got: any(f != "closed" and f[0] == DATA for f in got) or ended(got))
        assert [(f[1], f[3]) for f in got if f != "closed" and f[0] == DATA] == [(0, b"t")], got  # one byte
        raw.send(frame(WINDOW_UPDATE, 0, 1, (1000).to_bytes(4, "big")))
        got = raw.read(lambda got: any(f != "closed" and f[0] == DATA for f in got) or ended(got))
        data = [f for f in got if f != "closed" and f[0] == DATA]
        assert len(data) == 1 and data[0][1] & END_STREAM and data[0][3].startswith(b"he gRPC port takes POST"), got
    finally:
        raw.close()


def test_a_plain_answer_lets_the_request_finish_and_its_content_length_is_still_checked(broker):
    """A GET announcing content-length 1 is answered 405 at once without a reset (the client may finish its
    request); its 4 bytes of DATA that follow are then a stream error PROTOCOL_ERROR, the connection going on."""
    raw = Frames(grpc_port(broker))
    get = hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in (
        (":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "x"), ("content-length", "1"))])
    try:
        raw.send(PREFACE + frame(SETTINGS) + frame(HEADERS, END_HEADERS, 1, get))
        got = raw.read(lambda got: any(f != "closed" and f[0] == DATA and f[1] & END_STREAM for f in got) or ended(got))
        assert not [f for f in got if f != "closed" and f[0] == RST_STREAM] and not ended(got), got  # no reset
        raw.send(frame(DATA, END_STREAM, 1, b"test"))
        got = raw.read(lambda got: any(f != "closed" and f[0] == RST_STREAM for f in got) or ended(got))
        assert [(f[2], int.from_bytes(f[3], "big")) for f in got if f[0] == RST_STREAM] == [(1, 1)], got
        raw.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, header_block("Heartbeat")))
        got = raw.read(lambda got: 3 in answered(got) or ended(got))
        assert 3 in answered(got) and not ended(got), got
    finally:
        raw.close()


# -- header checks (h2's, run by the port once for a repeated list) -----------------------------------------------


PROTOCOL_ERROR = 1
GOOD = [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + "Heartbeat"), (":authority", "x"),
        ("content-type", "application/grpc"), ("te", "trailers"), ("x-mq-client-id", "raw")]


def literal_block(headers):
    return hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in headers])


@pytest.mark.parametrize("bad", [
    [(n.upper() if n == "x-mq-client-id" else n, v) for n, v in GOOD],  # an upper-case name
    GOOD + [("connection", "keep-alive")],  # a connection-specific field
    [h for h in GOOD if h[0] != ":path"],  # a pseudo-header missing
    [("te", "gzip") if n == "te" else (n, v) for n, v in GOOD],  # te other than trailers
    GOOD[:1] + GOOD,  # a repeated pseudo-header
    [(n, v + "\r\nx: y") if n == "x-mq-client-id" else (n, v) for n, v in GOOD],  # a CR LF in a value
], ids=["uppercase", "connection", "no-path", "te", "repeated-pseudo", "crlf"])
def test_a_header_list_failing_h2s_checks_ends_the_connection_after_the_same_good_list_was_served(broker, bad):
    """A client repeating one good header list is served each time (checked once); a list that fails h2's checks
    then ends the connection with GOAWAY PROTOCOL_ERROR, as h2 itself refuses it."""
    raw = Frames(grpc_port(broker))
    good = literal_block(GOOD)
    try:
        raw.send(PREFACE + frame(SETTINGS))
        raw.send(b"".join(frame(HEADERS, END_HEADERS | END_STREAM, sid, good) for sid in (1, 3, 5)))
        got = raw.read(lambda got: len(answered(got)) == 3 or ended(got))
        assert answered(got) == {1, 3, 5} and not ended(got), got[-3:]
        raw.send(frame(HEADERS, END_HEADERS | END_STREAM, 7, literal_block(bad)))
        got = raw.read(lambda got: "closed" in got)
        assert goaway_code(got) == PROTOCOL_ERROR and "closed" in got and 7 not in answered(got), got
    finally:
        raw.close()


def test_trailers_from_a_client_failing_h2s_checks_end_the_connection(broker):
    """A client's trailers are checked as h2 checks them: a pseudo-header among them ends the connection."""
    raw = Frames(grpc_port(broker))
    try:
        raw.send(PREFACE + frame(SETTINGS) + frame(HEADERS, END_HEADERS, 1, literal_block(GOOD)))
        raw.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, literal_block([(":path", "/x")])))
        got = raw.read(lambda got: "closed" in got)
        assert goaway_code(got) == PROTOCOL_ERROR and "closed" in got, got
    finally:
        raw.close()


# -- frame sizes and incomplete frames -----------------------------------------------------------------------


def test_a_frame_at_max_frame_size_is_served_and_one_byte_more_is_refused_from_its_header(broker):
    raw = Frames(grpc_port(broker))
    try:
        raw.send(PREFACE + frame(SETTINGS) + frame(HEADERS, END_HEADERS, 1, header_block("Heartbeat")))
        body = b"\0" + (MAX_FRAME - 5).to_bytes(4, "big") + b"\0" * (MAX_FRAME - 5)  # not a HeartbeatRequest
        raw.send(frame(DATA, END_STREAM, 1, body))
        got = raw.read(lambda got: any(f != "closed" and f[0] == HEADERS and f[1] & END_STREAM for f in got)
                       or ended(got))
        assert not ended(got), got  # answered (its grpc-status says what the request was)
        raw.send(frame(HEADERS, END_HEADERS, 3, length=MAX_FRAME + 1) + b"\0" * 100)  # its body never comes
        got = raw.read(lambda got: "closed" in got, timeout=5)
        assert goaway_code(got) == FRAME_SIZE_ERROR and "closed" in got, got
    finally:
        raw.close()


def test_an_incomplete_frame_is_held_to_the_request_deadline(tmp_path):
    cfg = small_config(tmp_path / "data", grpc={"port": free_port()},
                       limits={"idle_timeout_s": 60, "request_timeout_s": 2})
    b = BrokerProcess(tmp_path, cfg).start()
    raw = Frames(cfg["grpc"]["port"])
    try:
        raw.send(PREFACE + frame(SETTINGS) + frame(HEADERS, END_HEADERS, 1, length=1000))
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < 10 and not closed:  # a byte every 0.5 s: never idle
            try:
                raw.send(b"\0")
            except OSError:
                closed = True
                break
            closed = "closed" in raw.read(lambda got: "closed" in got, timeout=0.5)
        took = time.monotonic() - started
        assert closed and took < 6, took
        assert "a partial request for 2 s; closing" in b.log_text()
    finally:
        raw.close()
        b.kill()


# -- logging in ----------------------------------------------------------------------------------------------


def test_a_first_call_that_long_polls_outlives_the_login_deadline(tmp_path):
    cfg = small_config(tmp_path / "data", grpc={"port": free_port()}, limits={"login_timeout_s": 1},
                       security={"acl_file": write_acl(tmp_path / "acl.yaml")})
    b = BrokerProcess(tmp_path, cfg).start()
    c = Client(cfg["grpc"]["port"])
    try:
        request = pb.ReceiveMessageRequest(group=pb.Resource(name="billing"), batch_size=1,
                                           message_queue=pb.MessageQueue(topic=pb.Resource(name="orders"), id=-1))
        request.invisible_duration.FromSeconds(10)
        request.long_polling_timeout.FromSeconds(3)
        call = c.channel.unary_stream(SERVICE + "ReceiveMessage", request_serializer=lambda m: m.SerializeToString(),
                                      response_deserializer=pb.ReceiveMessageResponse.FromString)
        started = time.monotonic()
        responses = list(call(request, metadata=credentials("alice", SECRETS["alice"]), timeout=20))
        took = time.monotonic() - started
        assert code(responses[0].status) == "MESSAGE_NOT_FOUND" and took > 2.5, (responses, took)
        assert "not logged in" not in b.log_text() and "no request for" not in b.log_text()
    finally:
        c.close()
        b.kill()


# -- GOAWAY ----------------------------------------------------------------------------------------------------


def test_after_the_clients_goaway_its_open_streams_are_served_and_the_connection_ends_cleanly(broker):
    logged = len(broker.log_text())  # the module's broker: earlier tests' protocol errors are logged before this
    raw = RawH2(grpc_port(broker))
    try:
        telemetry, _h = raw.open("Telemetry")
        settings = pb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing()))
        body = settings.SerializeToString()
        raw.conn.send_data(telemetry, b"\0" + len(body).to_bytes(4, "big") + body)
        raw.flush()
        assert _has(DataReceived)(raw.events(_has(DataReceived)))
        heartbeat, _h = raw.open("Heartbeat")
        raw.sock.sendall(frame(GOAWAY, 0, 0, b"\0\0\0\0" + NO_ERROR.to_bytes(4, "big")))  # h2 would send no more
        raw.conn.send_data(heartbeat, b"\0\0\0\0\0", end_stream=True)  # the call's request, after the GOAWAY
        raw.flush()
        got = raw.events(lambda got: any(isinstance(e, TrailersReceived) and e.stream_id == heartbeat for e in got))
        trailers = [e for e in got if isinstance(e, TrailersReceived) and e.stream_id == heartbeat]
        assert trailers and dict(trailers[0].headers)["grpc-status"] == "0", got
        raw.conn.send_data(telemetry, b"", end_stream=True)  # its Telemetry stream half-closed: the last one
        raw.flush()
        got += raw.events(lambda got: "closed" in got)
        assert any(isinstance(e, StreamEnded) and e.stream_id == telemetry for e in got), got
        terminated = [e for e in got if isinstance(e, ConnectionTerminated)]
        assert terminated and terminated[0].error_code == NO_ERROR and "closed" in got, got
        assert not [e for e in got if isinstance(e, StreamReset) and e.error_code != NO_ERROR], got
    finally:
        raw.close()
    assert "HTTP/2 protocol error" not in broker.log_text()[logged:]


def test_at_shutdown_the_port_sends_goaway_finishes_the_open_call_then_closes(tmp_path):
    """The GOAWAY names the last stream; the long poll is answered; the Telemetry stream ends with its trailers;
    the last GOAWAY; the close; a clean exit."""
    cfg = small_config(tmp_path / "data", grpc={"port": free_port()})
    b = BrokerProcess(tmp_path, cfg).start()
    raw = RawH2(cfg["grpc"]["port"])
    try:
        request = pb.ReceiveMessageRequest(group=pb.Resource(name="g"), batch_size=1,
                                           message_queue=pb.MessageQueue(topic=pb.Resource(name="t"), id=-1))
        request.invisible_duration.FromSeconds(10)
        request.long_polling_timeout.FromSeconds(3)
        telemetry, _h = raw.open("Telemetry")
        settings = pb.TelemetryCommand(settings=pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing()))
        command = settings.SerializeToString()
        raw.conn.send_data(telemetry, b"\0" + len(command).to_bytes(4, "big") + command)
        raw.flush()
        assert _has(DataReceived)(raw.events(_has(DataReceived)))
        body = request.SerializeToString()
        sid, _h = raw.open("ReceiveMessage")
        raw.conn.send_data(sid, b"\0" + len(body).to_bytes(4, "big") + body, end_stream=True)
        raw.flush()
        time.sleep(0.5)  # the receive long-polls
        b.proc.send_signal(15)
        raw.conn = None  # h2 would take nothing after the GOAWAY: the frames are read as they come
        got = Frames.over(raw.sock).read(lambda got: "closed" in got, timeout=20)
        heads = [f[:3] for f in got if f != "closed"]
        goaways = [i for i, f in enumerate(heads) if f[0] == GOAWAY]
        trailers = [i for i, f in enumerate(heads) if f[0] == HEADERS and f[1] & END_STREAM and f[2] == sid]
        assert goaways and trailers and "closed" in got, got
        first = got[goaways[0]]
        assert int.from_bytes(first[3][:4], "big") == sid and goaway_code([first]) == NO_ERROR, first
        assert goaways[0] < trailers[0] < goaways[-1], heads  # the GOAWAY, the call's end, the last GOAWAY
        ends = [i for i, f in enumerate(heads) if f[0] == HEADERS and f[1] & END_STREAM and f[2] == telemetry]
        assert ends and trailers[0] < ends[0] < goaways[-1], heads  # its Telemetry stream ended (trailers) too
        assert b.wait_exit(30) == 0
    finally:
        raw.close()
        b.kill()


# -- the port's cache of decoded request header blocks ------------------------------------------------------------


def _statuses(frames, decoder):
    """Each answered stream's grpc-status, the server's header blocks decoded in order (HPACK is stateful)."""
    out = {}
    for f in frames:
        if f != "closed" and f[0] == HEADERS:
            headers = dict(decoder.decode(f[3]))
            if f[1] & END_STREAM:
                out[f[2]] = headers.get("grpc-status")
    return out


def _path_block(index_or_path, client_id):
    """A request block whose :path is the dynamic table's entry at ``index_or_path`` (an int: the block depends on the
    table) or a literal that inserts it (bytes: the block changes the table); its other fields static or literals
    never indexed (they depend on nothing)."""
    if isinstance(index_or_path, int):
        path = bytes((0x80 | index_or_path,))
    else:
        path = bytes((0x40 | 4, len(index_or_path))) + index_or_path  # :path is the static table's name 4
    tail = hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in (
        (":authority", "x"), ("content-type", "application/grpc"), ("te", "trailers"), ("x-mq-client-id", client_id))])
    return b"\x83\x86" + path + tail  # :method POST, :scheme http


@pytest.fixture(scope="module")
def roomy(tmp_path_factory):
    """A broker with the port's default budget of new streams (a connection here opens a few dozen)."""
    wd = tmp_path_factory.mktemp("grpcroomy")
    b = BrokerProcess(wd, small_config(wd / "data", grpc={"port": free_port()})).start()
    yield b
    b.kill()


def test_kept_header_blocks_are_served_at_the_limit_and_one_past_and_never_after_the_table_changed(roomy):
    """A client alternating GRPC_CACHED_HEADER_BLOCKS + 1 distinct request blocks that change nothing on one
    connection is answered for each as its headers say (past the limit the oldest kept block goes and is decoded
    again); then a block inserts another :path, so the same bytes as the kept blocks now name a method the port does
    not have: they are answered as a fresh decoder reads them (UNIMPLEMENTED), not as the kept lists say."""
    from metaq.rmq5 import limits as rmq5_limits
    n = rmq5_limits.GRPC_CACHED_HEADER_BLOCKS + 1
    blocks = [_path_block(62, "raw-%d" % i) for i in range(n)]  # :path = the newest entry of the table
    dec = hpack.Decoder()
    raw = Frames(grpc_port(roomy))
    try:
        raw.send(PREFACE + frame(SETTINGS))
        raw.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, _path_block((SERVICE + "Heartbeat").encode(), "raw")))
        # the limit's blocks alternating, then one past it (the oldest goes), then the oldest again
        sent = [blocks[k % (n - 1)] for k in range(3 * (n - 1))] + [blocks[n - 1], blocks[0]]
        sids = list(range(3, 3 + 2 * len(sent), 2))
        raw.send(b"".join(frame(HEADERS, END_HEADERS | END_STREAM, sid, b) for sid, b in zip(sids, sent, strict=True)))
        got = raw.read(lambda got: len(answered(got)) == 1 + len(sids) or ended(got))
        statuses = _statuses(got, dec)
        assert len(statuses) == 1 + len(sids) and not ended(got), got[-3:]
        assert len(set(statuses.values())) == 1 and statuses[1] != "12", statuses  # Heartbeat's answer each time
        inserting = _path_block((SERVICE + "NoSuchMethod").encode(), "raw")  # the newest entry is now this :path
        last = sids[-1] + 2
        again = [frame(HEADERS, END_HEADERS | END_STREAM, last + 2 + 2 * k, b) for k, b in enumerate(blocks[::-1])]
        raw.send(frame(HEADERS, END_HEADERS | END_STREAM, last, inserting) + b"".join(again))
        want = {last + 2 * k for k in range(n + 1)}
        got = raw.read(lambda got: want <= answered(got) or ended(got))
        statuses = _statuses(got, dec)
        assert not ended(got) and {statuses[sid] for sid in want} == {"12"}, statuses
        fresh = hpack.Decoder()  # what a decoder that read the same blocks gives for the kept ones now
        fresh.decode(_path_block((SERVICE + "Heartbeat").encode(), "raw"))
        fresh.decode(inserting)
        assert dict(fresh.decode(blocks[0]))[":path"] == SERVICE + "NoSuchMethod"
    finally:
        raw.close()
