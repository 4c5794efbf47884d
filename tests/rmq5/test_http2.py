"""The gRPC port's HTTP/2 layer (metaq/rmq5/http2.py) alone, sans-IO: frames in, events and frames out. Each frame
type, each protocol error with its code, flow control both ways, SETTINGS changed mid-connection, CONTINUATION and
padding. No socket."""

import struct

import hpack
import pytest

from metaq.rmq5 import http2
from metaq.rmq5.http2 import (ACK, CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY_FRAME, HEADERS, PADDED, PING,
                              PREFACE, PRIORITY, PRIORITY_FLAG, PUSH_PROMISE, RST_STREAM, SETTINGS, WINDOW_UPDATE,
                              ErrorCode, ProtocolError, ServerConnection, StreamClosed)

REQUEST_HEADERS = [(":method", "POST"), (":scheme", "http"), (":path", "/s/M"), (":authority", "x"),
                   ("content-type", "application/grpc")]
WINDOW = 1 << 20


def frame(ftype, flags=0, sid=0, payload=b""):
    return struct.pack(">HBBBI", len(payload) >> 8, len(payload) & 0xFF, ftype, flags, sid) + payload


def settings(**values):
    codes = {"table": 1, "push": 2, "streams": 3, "window": 4, "frame": 5, "list": 6}
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", codes[k], v) for k, v in values.items()))


def frames(data):
    """The frames in ``data``: (type, flags, stream id, payload)."""
    out, pos = [], 0
    while pos < len(data):
        hi, lo, ftype, flags, sid = struct.unpack_from(">HBBBI", data, pos)
        length = hi << 8 | lo
        out.append((ftype, flags, sid & 0x7FFFFFFF, bytes(data[pos + 9:pos + 9 + length])))
        pos += 9 + length
    return out


class Client:
    """A client's side: frames written by hand, HPACK by hpack."""

    def __init__(self, max_streams=4, max_header_bytes=8192, window=WINDOW, connection_window=WINDOW):
        self.server = ServerConnection(hpack.Encoder(), hpack.Decoder(), max_streams, max_header_bytes, window,
                                       connection_window)
        self.server.initiate()
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.preface = frames(self.server.data_to_send())
        self.events = self.send(PREFACE + settings())
        self.answer = self.out()  # what the server answered the preface with

    def send(self, data):
        return self.server.receive(data)

    def block(self, headers=REQUEST_HEADERS):
        return self.encoder.encode(headers)

    def open(self, sid, end=False, headers=REQUEST_HEADERS):
        return self.send(frame(HEADERS, END_HEADERS | (END_STREAM if end else 0), sid, self.block(headers)))

    def out(self):
        return frames(self.server.data_to_send())

    def error(self, data, code):
        """Send ``data``: a connection error ``code``, its GOAWAY queued."""
        with pytest.raises(ProtocolError) as caught:
            self.send(data)
        assert caught.value.code == code
        goaways = [f for f in self.out() if f[0] == GOAWAY_FRAME]
        assert goaways and struct.unpack(">II", goaways[-1][3][:8])[1] == code
        assert self.server.closed and self.send(frame(PING, 0, 0, b"\0" * 8)) == []
        return goaways[-1]

    def rst(self, sid):
        return [struct.unpack(">I", f[3])[0] for f in self.out() if f[0] == RST_STREAM and f[2] == sid]


def kinds(events):
    return [e[0] for e in events]


def test_preface_and_settings_are_exchanged_and_acknowledged():
    c = Client(max_streams=7, max_header_bytes=1000)
    ftype, flags, sid, payload = c.preface[0]
    assert (ftype, flags, sid) == (SETTINGS, 0, 0)
    values = dict(struct.unpack(">HI", payload[i:i + 6]) for i in range(0, len(payload), 6))
    assert values == {3: 7, 4: WINDOW, 6: 1000}
    assert c.preface[1] == (WINDOW_UPDATE, 0, 0, struct.pack(">I", WINDOW))
    assert kinds(c.events) == [http2.SETTINGS_CHANGED] and c.answer == [(SETTINGS, ACK, 0, b"")]
    assert c.send(frame(SETTINGS, ACK)) == [] and c.out() == []  # the client's ACK of ours


def test_a_wrong_preface_is_a_protocol_error():
    server = ServerConnection(hpack.Encoder(), hpack.Decoder(), 4, 8192)
    with pytest.raises(ProtocolError) as caught:
        server.receive(b"GET / HTTP/1.1\r\n\r\n")
    assert caught.value.code == ErrorCode.PROTOCOL_ERROR


def test_the_preface_and_frames_may_arrive_cut_anywhere():
    server = ServerConnection(hpack.Encoder(), hpack.Decoder(), 4, 8192)
    data = PREFACE + settings() + frame(HEADERS, END_HEADERS | END_STREAM, 1, hpack.Encoder().encode(REQUEST_HEADERS))
    events = []
    for i in range(len(data)):
        events += server.receive(data[i:i + 1])
    assert kinds(events) == [http2.SETTINGS_CHANGED, http2.REQUEST, http2.ENDED]
    assert dict(events[1][2])[b":path"] == b"/s/M"


def test_a_request_its_data_and_its_end():
    c = Client()
    events = c.open(1)
    assert events == [(http2.REQUEST, 1, [(n.encode(), v.encode()) for n, v in REQUEST_HEADERS], None)]
    events = c.send(frame(DATA, 0, 1, b"abc") + frame(DATA, END_STREAM, 1, b"de"))
    assert events == [(http2.DATA_RECEIVED, 1, b"abc", 3), (http2.DATA_RECEIVED, 1, b"de", 2),
                      (http2.ENDED, 1, None, None)]
    assert not c.server.remote_open(1)
    c.server.send_headers(1, [(":status", "200")])
    c.server.send_data(1, b"reply")
    c.server.send_headers(1, [("grpc-status", "0")], end_stream=True)
    out = c.out()
    assert [(f[0], f[1], f[2]) for f in out] == [(HEADERS, END_HEADERS, 1), (DATA, 0, 1),
                                                 (HEADERS, END_HEADERS | END_STREAM, 1)]
    assert c.decoder.decode(out[0][3]) == [(":status", "200")] and out[1][3] == b"reply"
    assert 1 not in c.server.streams  # closed both ways
    with pytest.raises(StreamClosed):
        c.server.send_data(1, b"more")


def test_padding_on_data_and_headers_is_removed_and_counted_by_flow_control():
    c = Client()
    block = c.block()
    padded = bytes([3]) + struct.pack(">I", 0) + b"\x10" + block + b"\0\0\0"
    events = c.send(frame(HEADERS, END_HEADERS | PADDED | PRIORITY_FLAG, 1, padded))
    assert kinds(events) == [http2.REQUEST]
    events = c.send(frame(DATA, PADDED | END_STREAM, 1, b"\x04abc\0\0\0\0"))
    assert events[0] == (http2.DATA_RECEIVED, 1, b"abc", 8) and kinds(events)[1:] == [http2.ENDED]
    assert c.server.inbound == 65535 + WINDOW - 8


@pytest.mark.parametrize("ftype,payload", [(DATA, b"\x03ab"), (DATA, b""), (HEADERS, b"\x05abcd")])
def test_padding_not_shorter_than_the_payload_is_a_protocol_error(ftype, payload):
    c = Client()
    if ftype == DATA:
        c.open(1)
    c.error(frame(ftype, PADDED | END_HEADERS, 1, payload), ErrorCode.PROTOCOL_ERROR)


def test_continuation_completes_a_header_block_and_nothing_may_come_between():
    c = Client()
    block = c.block()
    events = c.send(frame(HEADERS, END_STREAM, 1, block[:3]) + frame(CONTINUATION, 0, 1, block[3:5]))
    assert events == []
    events = c.send(frame(CONTINUATION, END_HEADERS, 1, block[5:]))
    assert kinds(events) == [http2.REQUEST, http2.ENDED]
    c.send(frame(HEADERS, 0, 3, c.block()[:2]))
    c.error(frame(PING, 0, 0, b"\0" * 8), ErrorCode.PROTOCOL_ERROR)


@pytest.mark.parametrize("sid", [0, 5])
def test_continuation_without_its_headers_is_a_protocol_error(sid):
    c = Client()
    if sid:
        c.send(frame(HEADERS, 0, 3, c.block()[:2]))  # a block open on another stream
    c.error(frame(CONTINUATION, END_HEADERS, sid or 1, b""), ErrorCode.PROTOCOL_ERROR)


def test_trailers_end_the_stream_and_must_carry_end_stream():
    c = Client()
    c.open(1)
    c.send(frame(DATA, 0, 1, b"x"))
    events = c.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, c.block([("x-t", "1")])))
    assert events == [(http2.TRAILERS, 1, [(b"x-t", b"1")], None), (http2.ENDED, 1, None, None)]
    c.open(3)
    c.error(frame(HEADERS, END_HEADERS, 3, c.block([("x-t", "1")])), ErrorCode.PROTOCOL_ERROR)


@pytest.mark.parametrize("sid", [2, 0])
def test_an_even_or_zero_stream_id_is_a_protocol_error(sid):
    c = Client()
    c.error(frame(HEADERS, END_HEADERS, sid, c.block()), ErrorCode.PROTOCOL_ERROR)


def test_a_stream_id_lower_than_one_opened_is_a_protocol_error():
    c = Client()
    c.open(5, end=True)
    c.error(frame(HEADERS, END_HEADERS, 3, c.block()), ErrorCode.PROTOCOL_ERROR)


def test_headers_on_a_stream_the_client_ended_is_a_connection_error_stream_closed():
    c = Client()
    c.open(1, end=True)
    c.server.send_headers(1, [(":status", "200")], end_stream=True)  # closed both ways
    c.out()
    c.error(frame(HEADERS, END_HEADERS | END_STREAM, 1, c.block()), ErrorCode.STREAM_CLOSED)


def test_reset_streams_and_skipped_ids_are_remembered_up_to_their_limit():
    from metaq.rmq5 import limits as rmq5_limits
    kept = rmq5_limits.GRPC_CLOSED_STREAMS_KEPT
    for sid, code in ((3, None), (1, ErrorCode.STREAM_CLOSED)):  # the oldest kept reset; one past: forgotten
        c = Client(max_streams=1000)
        for i in range(kept + 1):  # each opened and reset by the client before it ended
            c.open(2 * i + 1)
            c.send(frame(RST_STREAM, 0, 2 * i + 1, struct.pack(">I", ErrorCode.CANCEL)))
        if code is None:
            assert c.send(frame(HEADERS, END_HEADERS | END_STREAM, sid, c.block())) == [] and c.rst(sid) == [
                ErrorCode.STREAM_CLOSED]
            c.error(frame(HEADERS, END_HEADERS, sid, c.block()), ErrorCode.PROTOCOL_ERROR)  # ends nothing: no trailers
        else:
            c.error(frame(HEADERS, END_HEADERS | END_STREAM, sid, c.block()), code)
    for sid, code in ((7, ErrorCode.PROTOCOL_ERROR), (3, ErrorCode.STREAM_CLOSED)):  # skipped: kept; one past
        c = Client(max_streams=1000)
        for i in range(kept + 2):  # 1, 5, 9, ...: 3, 7, 11, ... skipped, one run more than kept
            c.open(4 * i + 1, end=True)
            c.server.send_headers(4 * i + 1, [(":status", "200")], end_stream=True)
        c.error(frame(HEADERS, END_HEADERS | END_STREAM, sid, c.block()), code)


def test_frames_on_a_half_closed_or_closed_stream_are_stream_closed():
    c = Client()
    c.open(1, end=True)  # half-closed (remote)
    assert c.send(frame(DATA, 0, 1, b"late")) == [(http2.RESET, 1, ErrorCode.STREAM_CLOSED, None)]
    assert c.rst(1) == [ErrorCode.STREAM_CLOSED] and 1 not in c.server.streams
    assert c.server.inbound == 65535 + WINDOW - 4 and c.server.unacked == 4  # counted, and given back with the rest
    assert c.send(frame(DATA, 0, 1, b"later")) == [] and c.rst(1) == [ErrorCode.STREAM_CLOSED]  # closed
    c.open(3)
    c.send(frame(RST_STREAM, 0, 3, struct.pack(">I", ErrorCode.CANCEL)))
    assert c.send(frame(HEADERS, END_HEADERS | END_STREAM, 3, c.block([("x", "y")]))) == [] and c.rst(3) == [
        ErrorCode.STREAM_CLOSED]
    assert c.send(frame(WINDOW_UPDATE, 0, 3, struct.pack(">I", 10))) == []  # a closed stream's update: ignored
    assert c.out() == []
    assert c.send(frame(WINDOW_UPDATE, 0, 3, struct.pack(">I", 0))) == [] and c.rst(3) == [ErrorCode.PROTOCOL_ERROR]


def test_full_data_in_flight_on_a_stream_the_server_reset_is_ignored_up_to_its_window_and_no_work_wasted():
    """The client could not know of the reset: its full frames up to the stream's window left are ignored, not
    counted by ``on_wasted``; a frame past the window, or a dribble of small ones, is a stream error as before."""
    c = Client(window=3 * 16384)
    wasted = []
    c.server.on_wasted = lambda: wasted.append(1)
    c.open(1)
    c.send(frame(DATA, 0, 1, b"d" * 100))
    c.server.reset_stream(1, ErrorCode.CANCEL)
    assert c.rst(1) == [ErrorCode.CANCEL]
    for size in (16384, 16384, 16384 - 100):  # full frames, the last filling the window
        assert c.send(frame(DATA, 0, 1, b"d" * size)) == [] and c.out() == []
    assert wasted == []
    assert c.send(frame(DATA, 0, 1, b"d" * 16384)) == [] and c.rst(1) == [ErrorCode.STREAM_CLOSED]  # past it
    c.open(3)
    c.server.reset_stream(3)
    c.out()
    assert c.send(frame(DATA, 0, 3, b"d")) == [] and c.rst(3) == [ErrorCode.STREAM_CLOSED]  # a sliver: counted
    assert wasted == [1, 1]


def test_data_on_a_stream_never_opened_is_a_protocol_error():
    c = Client()
    c.error(frame(DATA, 0, 9, b"x"), ErrorCode.PROTOCOL_ERROR)


def test_a_stream_past_max_concurrent_streams_is_refused_and_the_goaway_names_only_streams_taken():
    c = Client(max_streams=2)
    c.open(1)
    c.open(3)
    c.send(frame(RST_STREAM, 0, 3, struct.pack(">I", 8)))  # one ends: room for one more
    c.open(5)
    c.out()
    assert c.open(7) == [] and c.rst(7) == [ErrorCode.REFUSED_STREAM]  # refused; the connection goes on
    assert c.send(frame(DATA, END_STREAM, 7, b"x")) == [] and c.rst(7) == [ErrorCode.STREAM_CLOSED]
    assert kinds(c.send(frame(RST_STREAM, 0, 5, struct.pack(">I", 8)) + frame(HEADERS, END_HEADERS, 9, c.block()))
                 ) == [http2.RESET, http2.REQUEST]  # room again: the next stream taken
    assert c.open(11) == [] and c.rst(11) == [ErrorCode.REFUSED_STREAM]
    c.server.close()
    goaway = [f for f in c.out() if f[0] == GOAWAY_FRAME][0]
    assert struct.unpack(">II", goaway[3][:8]) == (9, 0)  # the last stream taken, not the one refused


def test_a_later_goaway_names_no_higher_stream():
    c = Client()
    c.open(1)
    c.server.goaway(1)
    c.open(3)
    c.server.close()
    assert [struct.unpack(">I", f[3][:4])[0] for f in c.out() if f[0] == GOAWAY_FRAME] == [1, 1]


def test_rst_stream_reports_the_reset_and_refuses_stream_zero_idle_and_bad_sizes():
    c = Client()
    c.open(1)
    assert c.send(frame(RST_STREAM, 0, 1, struct.pack(">I", 8))) == [(http2.RESET, 1, 8, None)]
    assert c.send(frame(RST_STREAM, 0, 1, struct.pack(">I", 8))) == []  # already closed
    Client().error(frame(RST_STREAM, 0, 0, b"\0" * 4), ErrorCode.PROTOCOL_ERROR)
    Client().error(frame(RST_STREAM, 0, 9, b"\0" * 4), ErrorCode.PROTOCOL_ERROR)
    c.error(frame(RST_STREAM, 0, 1, b"\0" * 3), ErrorCode.FRAME_SIZE_ERROR)


def test_ping_is_answered_and_checked():
    c = Client()
    assert c.send(frame(PING, 0, 0, b"12345678")) == [] and c.out() == [(PING, ACK, 0, b"12345678")]
    assert c.send(frame(PING, ACK, 0, b"12345678")) == [] and c.out() == []
    Client().error(frame(PING, 0, 1, b"12345678"), ErrorCode.PROTOCOL_ERROR)
    c.error(frame(PING, 0, 0, b"1234567"), ErrorCode.FRAME_SIZE_ERROR)


def test_priority_and_unknown_frames_are_ignored():
    c = Client()
    c.open(1)
    assert c.send(frame(PRIORITY, 0, 1, b"\0\0\0\0\x10") + frame(PRIORITY, 0, 11, b"\0\0\0\0\x10")) == []
    assert c.send(frame(0x42, 0xFF, 0, b"whatever") + frame(0x42, 0, 1, b"")) == []
    assert c.out() == []
    assert c.send(frame(PRIORITY, 0, 1, b"\0" * 4)) == [(http2.RESET, 1, ErrorCode.FRAME_SIZE_ERROR, None)]
    c.error(frame(PRIORITY, 0, 0, b"\0" * 5), ErrorCode.PROTOCOL_ERROR)


def test_a_stream_depending_on_itself_is_reset():
    c = Client()
    payload = struct.pack(">I", 1) + b"\x10" + c.block()
    assert c.send(frame(HEADERS, END_HEADERS | PRIORITY_FLAG, 1, payload)) == []
    assert c.rst(1) == [ErrorCode.PROTOCOL_ERROR]
    c.open(3)
    assert c.send(frame(PRIORITY, 0, 3, struct.pack(">I", 3) + b"\x10")) == [(http2.RESET, 3, ErrorCode.PROTOCOL_ERROR,
                                                                              None)]
    assert c.rst(3) == [ErrorCode.PROTOCOL_ERROR]
    c.error(frame(PRIORITY, 0, 9, struct.pack(">I", 9) + b"\x10"), ErrorCode.PROTOCOL_ERROR)  # an idle stream


@pytest.mark.parametrize("length,data,trailers", [
    (b"1", [b"test"], False),  # more than announced
    (b"8", [b"test", b"te"], False),  # less, the stream ended by DATA
    (b"5", [b"test"], True),  # less, ended by trailers
    (b"x1", [], False),  # no length
])
def test_data_that_does_not_add_up_to_the_content_length_is_a_stream_error(length, data, trailers):
    c = Client()
    headers = REQUEST_HEADERS + [("content-length", length.decode())]
    out = c.send(frame(HEADERS, END_HEADERS, 1, c.block(headers)))
    for i, chunk in enumerate(data):
        out += c.send(frame(DATA, END_STREAM if i == len(data) - 1 and not trailers else 0, 1, chunk))
    if trailers:
        out += c.send(frame(HEADERS, END_HEADERS | END_STREAM, 1, c.block([("x-t", "1")])))
    assert c.rst(1) == [ErrorCode.PROTOCOL_ERROR] and 1 not in c.server.streams
    assert http2.ENDED not in kinds(out)
    assert kinds(c.open(3)) == [http2.REQUEST]  # the connection goes on
    ok = Client()  # DATA that adds up: served
    ok.send(frame(HEADERS, END_HEADERS, 1, ok.block(REQUEST_HEADERS + [("content-length", "6")])))
    assert kinds(ok.send(frame(DATA, 0, 1, b"tes") + frame(DATA, END_STREAM, 1, b"tin"))) == [
        http2.DATA_RECEIVED, http2.DATA_RECEIVED, http2.ENDED]


def test_the_first_frame_after_the_preface_must_be_settings():
    for first in (frame(PING, 0, 0, b"\0" * 8), frame(SETTINGS, ACK)):
        server = ServerConnection(hpack.Encoder(), hpack.Decoder(), 4, 8192)
        server.receive(PREFACE[:10])
        with pytest.raises(ProtocolError) as caught:
            server.receive(PREFACE[10:] + first[:5])  # the type and flags known from the header's first five bytes
        assert caught.value.code == ErrorCode.PROTOCOL_ERROR


def test_push_promise_from_a_client_is_a_protocol_error():
    Client().error(frame(PUSH_PROMISE, END_HEADERS, 1, b"\0\0\0\x02"), ErrorCode.PROTOCOL_ERROR)


def test_goaway_is_reported_and_the_streams_go_on():
    c = Client()
    c.open(1)
    events = c.send(frame(GOAWAY_FRAME, 0, 0, struct.pack(">II", 1, 0) + b"bye"))
    assert events == [(http2.GOAWAY, 0, 1, 0)]
    assert kinds(c.send(frame(DATA, END_STREAM, 1, b"x"))) == [http2.DATA_RECEIVED, http2.ENDED]
    Client().error(frame(GOAWAY_FRAME, 0, 1, b"\0" * 8), ErrorCode.PROTOCOL_ERROR)
    Client().error(frame(GOAWAY_FRAME, 0, 0, b"\0" * 7), ErrorCode.FRAME_SIZE_ERROR)


def test_the_servers_goaway_announced_then_closing():
    c = Client()
    c.open(1)
    c.open(3)
    c.server.goaway(3)
    assert c.out() == [(GOAWAY_FRAME, 0, 0, struct.pack(">II", 3, 0))]
    c.server.send_headers(1, [(":status", "200")])  # the streams named go on
    assert c.out()[0][0] == HEADERS
    c.server.close(ErrorCode.NO_ERROR)
    assert c.out() == [(GOAWAY_FRAME, 0, 0, struct.pack(">II", 3, 0))]
    with pytest.raises(StreamClosed):
        c.server.send_headers(3, [(":status", "200")])
    assert c.send(frame(PING, 0, 0, b"\0" * 8)) == [] and c.out() == []


def test_a_frame_past_max_frame_size_is_a_frame_size_error():
    c = Client()
    c.open(1)
    c.send(frame(DATA, 0, 1, b"x" * (1 << 14)))  # at the size
    c.error(frame(DATA, 0, 1, b"x" * ((1 << 14) + 1)), ErrorCode.FRAME_SIZE_ERROR)


# -- flow control -------------------------------------------------------------------------------------------------


def test_receive_windows_are_given_back_as_the_port_consumes():
    c = Client(window=100, connection_window=0)  # the connection's window: 65535
    c.open(1)
    c.send(frame(DATA, 0, 1, b"x" * 40))
    c.server.acknowledge(1, 40)
    assert c.out() == []  # less than half of either window
    c.send(frame(DATA, 0, 1, b"x" * 20))
    c.server.acknowledge(1, 20)
    assert c.out() == [(WINDOW_UPDATE, 0, 1, struct.pack(">I", 60))]  # the stream's: half of 100 consumed
    c.send(frame(DATA, 0, 1, b"x" * 100))
    assert c.server.streams[1].inbound == 0
    assert c.send(frame(DATA, 0, 1, b"x")) == [(http2.RESET, 1, ErrorCode.FLOW_CONTROL_ERROR, None)]


def test_data_past_the_connections_window_is_a_flow_control_error():
    c = Client(window=1 << 20, connection_window=0)
    c.open(1)
    c.open(3)
    for _ in range(3):
        c.send(frame(DATA, 0, 1, b"x" * 16384))
    c.send(frame(DATA, 0, 1, b"x" * (65535 - 3 * 16384)))
    assert c.server.inbound == 0
    c.server.acknowledge(1, 2000)  # the window shut: a little consumed opens it
    assert c.out() == [(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2000))]
    c.send(frame(DATA, 0, 3, b"x" * 2000))
    c.error(frame(DATA, 0, 3, b"x"), ErrorCode.FLOW_CONTROL_ERROR)


def test_send_windows_follow_window_updates_and_refuse_overflow():
    c = Client()
    c.open(1)
    assert c.server.local_flow_control_window(1) == 65535
    c.server.send_headers(1, [(":status", "200")])
    c.server.send_data(1, b"x" * 16384)
    assert c.server.local_flow_control_window(1) == 65535 - 16384
    with pytest.raises(ValueError):
        c.server.send_data(1, b"x" * 16385)  # past the client's frame size
    events = c.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1000)) +
                    frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 500)))
    assert events == [(http2.WINDOW, 1, 1000, None), (http2.WINDOW, 0, 500, None)]
    assert c.server.local_flow_control_window(1) == 65535 - 16384 + 500  # the connection's is the smaller
    assert c.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 0))) == [(http2.RESET, 1, ErrorCode.PROTOCOL_ERROR,
                                                                           None)]
    c.open(3)
    assert c.send(frame(WINDOW_UPDATE, 0, 3, struct.pack(">I", (1 << 31) - 1))) == [
        (http2.RESET, 3, ErrorCode.FLOW_CONTROL_ERROR, None)]
    Client().error(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0)), ErrorCode.PROTOCOL_ERROR)
    Client().error(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", (1 << 31) - 1)), ErrorCode.FLOW_CONTROL_ERROR)
    Client().error(frame(WINDOW_UPDATE, 0, 0, b"\0" * 3), ErrorCode.FRAME_SIZE_ERROR)
    Client().error(frame(WINDOW_UPDATE, 0, 9, struct.pack(">I", 1)), ErrorCode.PROTOCOL_ERROR)


def test_a_new_initial_window_applies_to_open_streams_and_new_ones():
    c = Client()
    c.open(1)
    c.server.send_headers(1, [(":status", "200")])
    c.server.send_data(1, b"x" * 1000)
    c.out()
    events = c.send(settings(window=10000))
    assert kinds(events) == [http2.SETTINGS_CHANGED] and events[0][2] == {4: 10000}
    assert c.out() == [(SETTINGS, ACK, 0, b"")]
    assert c.server.streams[1].outbound == 9000  # 65535 - 1000 + (10000 - 65535)
    c.open(3)
    assert c.server.streams[3].outbound == 10000
    c.send(settings(window=0))
    assert c.server.streams[1].outbound == -1000 and c.server.local_flow_control_window(1) == -1000
    c.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", (1 << 31) - 1)))  # -1000 + 2^31-1: within the bound
    c.error(settings(window=2000), ErrorCode.FLOW_CONTROL_ERROR)  # that stream's window past 2^31-1


@pytest.mark.parametrize("values,code", [({"push": 2}, ErrorCode.PROTOCOL_ERROR),
                                         ({"window": 1 << 31}, ErrorCode.FLOW_CONTROL_ERROR),
                                         ({"frame": (1 << 14) - 1}, ErrorCode.PROTOCOL_ERROR),
                                         ({"frame": 1 << 24}, ErrorCode.PROTOCOL_ERROR)])
def test_settings_values_out_of_range_are_refused(values, code):
    Client().error(settings(**values), code)


def test_settings_frames_malformed_are_refused():
    Client().error(frame(SETTINGS, 0, 1, b""), ErrorCode.PROTOCOL_ERROR)
    Client().error(frame(SETTINGS, 0, 0, b"\0" * 5), ErrorCode.FRAME_SIZE_ERROR)
    Client().error(frame(SETTINGS, ACK, 0, b"\0" * 6), ErrorCode.FRAME_SIZE_ERROR)


def test_max_frame_size_and_header_table_size_change_what_is_sent():
    c = Client()
    c.open(1)
    c.send(settings(frame=20000, table=0))
    c.out()
    c.server.send_headers(1, [(":status", "200"), ("x-big", "v" * 30000)])
    out = c.out()
    assert [(f[0], f[1]) for f in out] == [(HEADERS, 0), (CONTINUATION, END_HEADERS)]
    assert len(out[0][3]) == 20000
    assert c.decoder.decode(out[0][3] + out[1][3]) == [(":status", "200"), ("x-big", "v" * 30000)]
    assert c.server.encoder.header_table.maxsize == 0
    c.server.send_data(1, b"x" * 20000)  # a DATA frame up to the new size
    assert len(c.out()[0][3]) == 20000


def test_a_whole_answer_goes_at_once_or_not_at_all():
    c = Client()
    c.open(1, end=True)
    c.open(3, end=True)
    c.out()
    assert c.server.send_answer(1, [(":status", "200")], b"x" * 100, [("grpc-status", "0")]) == 1
    out = c.out()
    assert [(f[0], f[1], f[2]) for f in out] == [(HEADERS, END_HEADERS, 1), (DATA, 0, 1),
                                                 (HEADERS, END_HEADERS | END_STREAM, 1)]
    assert c.decoder.decode(out[0][3]) == [(":status", "200")] and out[1][3] == b"x" * 100
    assert c.decoder.decode(out[2][3]) == [("grpc-status", "0")]
    assert 1 not in c.server.streams  # both sides over: closed
    with pytest.raises(StreamClosed):
        c.server.send_answer(1, [(":status", "200")], b"x", [("grpc-status", "0")])
    # past the client's frame size: DATA frames of that size; past a send window: nothing sent
    assert c.server.send_answer(3, [(":status", "200")], b"y" * 65536, [("grpc-status", "0")]) is None
    assert c.out() == [] and c.server.local_flow_control_window(3) == 65535 - 100  # (the connection's is the smaller)
    assert c.server.send_answer(3, [(":status", "200")], b"y" * 40000, [("grpc-status", "0")]) == 3
    out = c.out()
    assert [(f[0], len(f[3])) for f in out[1:4]] == [(DATA, 16384), (DATA, 16384), (DATA, 40000 - 2 * 16384)]
    assert b"".join(f[3] for f in out[1:4]) == b"y" * 40000 and out[4][1] == END_HEADERS | END_STREAM
    assert c.server.outbound == 65535 - 40100  # the connection's window spent


def test_header_blocks_past_the_list_size_or_not_decoding_are_refused():
    c = Client(max_header_bytes=200)
    c.error(frame(HEADERS, END_HEADERS, 1, c.block(REQUEST_HEADERS + [("x-pad", "p" * 200)])),
            ErrorCode.ENHANCE_YOUR_CALM)
    c = Client()
    c.error(frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff"), ErrorCode.COMPRESSION_ERROR)


def test_the_server_resets_and_answers_a_stream_still_open():
    c = Client()
    c.open(1)
    assert c.server.remote_open(1)
    c.server.send_headers(1, [(":status", "200")], end_stream=True)  # half-closed (local)
    assert c.server.remote_open(1)
    with pytest.raises(StreamClosed):
        c.server.local_flow_control_window(1)
    c.server.reset_stream(1, ErrorCode.NO_ERROR)
    assert c.rst(1) == [ErrorCode.NO_ERROR] and not c.server.remote_open(1)
    with pytest.raises(StreamClosed):
        c.server.reset_stream(1)


# -- limits before work: the frame size from the header, each frame shown once to the port's budgets ------------


def test_each_frame_is_shown_once_as_its_header_arrives_whatever_the_chunks_and_partial_counts_its_bytes():
    block = hpack.Encoder().encode(REQUEST_HEADERS)
    frames_in = (frame(HEADERS, END_HEADERS, 1, block) + frame(DATA, END_STREAM, 1, b"d" * 100) +
                 frame(GOAWAY_FRAME, 0, 0, struct.pack(">II", 1, 0) + b"debug") + frame(PING, 0, 0, b"12345678"))
    stream = PREFACE + settings() + frames_in
    ping_at = len(stream) - 17
    for size in (1, 7, 9, 64, len(stream)):
        server = ServerConnection(hpack.Encoder(), hpack.Decoder(), 4, 8192)
        shown, events = [], []
        server.on_frame = lambda *head, shown=shown: shown.append(head)
        for at in range(0, len(stream), size):
            events += server.receive(stream[at:at + size])
            if ping_at < at + size < len(stream):
                assert server.partial == at + size - ping_at, size  # the PING's bytes so far
            if at + size == ping_at + 9:
                assert shown[-1] == (PING, 0, 8, 0)  # shown from its header, its body still to come
        assert server.partial == 0
        assert shown == [(SETTINGS, 0, 0, 0), (HEADERS, END_HEADERS, len(block), 1), (DATA, END_STREAM, 100, 1),
                         (GOAWAY_FRAME, 0, 13, 0), (PING, 0, 8, 0)], size
        assert kinds(events) == [http2.SETTINGS_CHANGED, http2.REQUEST, http2.DATA_RECEIVED, http2.ENDED,
                                 http2.GOAWAY], size
        assert frames(server.data_to_send()) == [(SETTINGS, ACK, 0, b""), (PING, ACK, 0, b"12345678")]


def test_a_reason_from_on_frame_ends_the_connection_before_the_frame_is_served():
    c = Client()
    c.server.on_frame = lambda ftype, flags, length, sid: "too many" if ftype == PING else None
    goaway = c.error(frame(PING, 0, 0, b"12345678"), ErrorCode.ENHANCE_YOUR_CALM)
    assert goaway[3][8:] == b"too many"


def test_a_frame_past_max_frame_size_is_refused_from_its_header_alone():
    c = Client()
    c.open(1)
    c.send(frame(DATA, 0, 1, b"x" * (1 << 14))[:10])  # at the limit: its body may come
    assert c.server.partial == 10
    c.send(b"x" * ((1 << 14) - 1))
    assert c.server.partial == 0
    c.error(frame(DATA, 0, 1, b"x" * ((1 << 14) + 1))[:9], ErrorCode.FRAME_SIZE_ERROR)


def test_a_header_block_of_many_continuations_is_gathered_as_parts_and_joined_once():
    c = Client()
    block = c.block()
    c.send(frame(HEADERS, END_STREAM, 1, block[:1]))
    for n, at in enumerate(range(1, len(block), 2), 2):  # two bytes a frame
        assert c.send(frame(CONTINUATION, 0, 1, block[at:at + 2])) == []
        assert len(c.server._block[3]) == n  # each part kept as it came, none copied into a growing block
    events = c.send(frame(CONTINUATION, END_HEADERS, 1, b""))
    assert kinds(events) == [http2.REQUEST, http2.ENDED] and dict(events[0][2])[b":path"] == b"/s/M"
