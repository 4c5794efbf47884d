"""A WebSocket client's common frames (``metaq.protocol.wsframe``): every case against the Python definition and its
C twin ``ws_frames``; each frame a rule refuses is no common frame, its header's bytes and declared length told."""

import struct

import pytest

from metaq.protocol.wsframe import binary_header, frames_py
from tests.harness.native import both
from tests.harness.websocket import BINARY, CLOSE, CONTINUATION, PING, TEXT, frame

TWINS = both(frames_py, "ws_frames")
BOUND = 1000


def masked(payload, key=b"\x01\x02\x03\x04", head=None):
    """A common frame of ``payload`` masked with ``key``; ``head``: other header bytes (the length's kept)."""
    body = bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    n = len(payload)
    size = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n)
    return (head or b"\x82") + size + key + body


@pytest.mark.parametrize("fn", TWINS)
def test_a_run_of_common_frames_is_unmasked_and_joined(fn):
    payloads = [b"", b"a", b"0123456789abcdef" * 9, b"x" * 300, bytes(range(256)) * 3]
    buf = b"".join(masked(p) for p in payloads) + masked(b"zero key", key=b"\0\0\0\0")
    assert fn(buf, 0, BOUND) == (b"".join(payloads) + b"zero key", len(buf), 0, 0)
    one = masked(b"abc")
    assert fn(b"junk" + one, 4, BOUND) == (b"abc", 4 + len(one), 0, 0)  # from pos
    assert fn(one, -5, BOUND) == (b"abc", len(one), 0, 0) and fn(one, 99, BOUND) == (b"", len(one), 0, 0)


@pytest.mark.parametrize("fn", TWINS)
def test_a_frame_not_yet_whole_needs_more_bytes(fn):
    whole = masked(b"p" * 200)
    before = masked(b"first")
    for cut in range(len(whole)):
        assert fn(before + whole[:cut], 0, BOUND) == (b"first", len(before), 0, 0), cut
    long_len = frame(BINARY, b"", declared=70000)[:10]  # an 8-byte length, its mask key not there
    assert fn(long_len[:9], 0, BOUND) == (b"", 0, 0, 0)
    assert fn(frame(PING, b"p")[:5], 0, BOUND) == (b"", 0, 0, 0)  # a control frame's header cut


@pytest.mark.parametrize("fn", TWINS)
def test_each_frame_the_library_must_see_stops_the_run_with_its_length(fn):
    before = masked(b"ok")
    cases = [(frame(PING, b"hi"), 6, 2), (frame(CLOSE, b"\x03\xe8"), 6, 2), (frame(TEXT, b"txt"), 6, 3),
             (frame(BINARY, b"frag", fin=False), 6, 4), (frame(CONTINUATION, b"more"), 6, 4),
             (frame(BINARY, b"bare", mask=False), 2, 4),  # unmasked
             (bytes([0x82 | 0x40]) + masked(b"rsv")[1:], 6, 3),  # a reserved bit
             (bytes([0x83]) + masked(b"op")[1:], 6, 2),  # an opcode RFC 6455 reserves
             (b"\x82\xfe\x00\x05" + b"\0" * 4 + b"12345", 8, 5),  # 2 length bytes where 1 suffices
             (b"\x82\xff" + struct.pack("!Q", 300) + b"\0" * 4 + b"x" * 300, 14, 300),  # 8 where 2 suffice
             (frame(BINARY, b"", declared=BOUND + 1)[:8], 8, BOUND + 1),  # past the bound: at its header
             (b"\x82\xff" + b"\xff" * 8 + b"\0" * 4, 14, 2 ** 64 - 1)]  # the largest declarable
    for data, head, length in cases:
        assert fn(before + data, 0, BOUND) == (b"ok", len(before), head, length), data
    at_bound = masked(b"b" * BOUND)
    assert fn(at_bound, 0, BOUND) == (b"b" * BOUND, len(at_bound), 0, 0)
    assert fn(masked(b"c"), 0, -1) == (b"", 0, 6, 1)  # a negative bound: none is common (a message under way)


def test_the_servers_header_is_the_fewest_length_bytes():
    assert binary_header(0) == b"\x82\x00" and binary_header(125) == b"\x82\x7d"
    assert binary_header(126) == b"\x82\x7e\x00\x7e" and binary_header(65535) == b"\x82\x7e\xff\xff"
    assert binary_header(65536) == b"\x82\x7f" + struct.pack("!Q", 65536)
    for n in (0, 5, 200, 70000):
        got = frames_py(bytes([0x82, 0x80 | (binary_header(n)[1] & 0x7F)]) + binary_header(n)[2:] + b"\0" * 4
                        + b"y" * n, 0, 10 ** 6)
        assert got == (b"y" * n, len(binary_header(n)) + 4 + n, 0, 0)
