"""A WebSocket stream's send (``metaq.serving.wsio.WsStream.sendall``): what the socket does not take at once (a slow
reader, a full buffer) is sent by the waiting send, so each frame arrives whole and in order."""

import gevent

from tests.harness.websocket import server_frames, upgraded_stream


def test_a_send_the_socket_takes_in_part_arrives_whole_and_in_order():
    ws, theirs = upgraded_stream(sndbuf=4096)
    payloads = [bytes([i]) * n for i, n in enumerate((100, 300_000, 5, 70_000))]
    writers = [gevent.spawn(ws.sendall, p) for p in payloads]
    got = b""
    want = sum(len(p) + (2 if len(p) < 126 else 4 if len(p) < 65536 else 10) for p in payloads)
    while len(got) < want:
        gevent.sleep(0.001)  # a slow reader: the socket's buffer fills
        got += theirs.recv(8192)
    gevent.joinall(writers, raise_error=True)
    assert server_frames(got) == payloads


def test_a_frame_try_send_began_is_finished_before_any_other_frame():
    ws, theirs = upgraded_stream(sndbuf=4096)
    payloads, i = [], 0
    while not ws.unsent:  # nothing reads: the socket's buffer fills and a frame is begun, not finished
        payload = bytes([i % 256]) * 20_000  # more than the buffer holds: the socket takes a part
        n = ws.try_send(payload)
        assert n, "a frame refused before one was begun"
        payloads.append(payload)
        i += 1
    assert 0 < n < len(payloads[-1])
    assert ws.try_send(b"xx") == 0  # the rest goes first: nothing else now
    payloads.append(b"after")
    writer = gevent.spawn(ws.sendall, b"after")
    got = b""
    want = sum(len(p) + (2 if len(p) < 126 else 4) for p in payloads)
    while len(got) < want:
        gevent.sleep(0.001)
        got += theirs.recv(8192)
    writer.get(timeout=5)
    assert server_frames(got) == payloads


def test_a_frame_trickled_in_small_reads_is_kept_in_one_buffer_grown_in_place():
    """A common frame of 1 MiB arriving in 1,460-byte reads: its bytes are kept in one buffer that each read extends
    (never copied again whole, which would cost the square of the frame's size), and the payload comes out whole."""
    ws, theirs = upgraded_stream(2 << 20)
    payload = bytes(range(256)) * 4096
    frame = b"\x82\xff" + len(payload).to_bytes(8, "big") + b"\0\0\0\0" + payload  # masked with a zero key
    kept = set()
    for at in range(0, len(frame) - 1460, 1460):
        ws._frames_in(frame[at:at + 1460])
        kept.add(id(ws._in))
    assert len(kept) == 1, "the frame's bytes were copied into a new buffer %d times" % (len(kept) - 1)
    ws._frames_in(frame[at + 1460:])
    assert b"".join(ws._ready) == payload
