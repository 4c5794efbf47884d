"""WebSocket frames (RFC 6455 §5.2) in their common case, read and written without a frame object per frame.

A client's frame is **common** when it is one whole message of MQTT bytes: FIN set, no reserved bit, opcode binary,
masked, its length in the fewest bytes that hold it, at most the listener's bound. ``frames`` takes the run of
such frames at a position and unmasks their payloads in one call; it stops at the first frame that is not common
(a control frame, a fragment, a text frame, and every frame a rule refuses) and says how long that frame is, so
its bytes, exactly, go to the WebSocket library, which answers or refuses it as it does any frame
(``metaq.serving.wsio``). ``metaq.native._bytes``'s ``ws_frames`` is ``frames_py`` in C (the tests hold the two
equal). ``binary_header`` is the server's unmasked binary frame's header.
"""

import struct

from metaq.speedups import load

__all__ = ["frames", "frames_py", "binary_header"]


def frames_py(buf, pos, max_frame):
    """The common frames whole in ``buf`` from ``pos`` (clamped to ``0..len(buf)``), each at most ``max_frame``
    payload bytes (negative: no frame is common): ``(their payloads unmasked and joined, the position after them,
    head, length)``. ``head`` is 0 when the bytes at that position are no whole header, or a common frame not yet
    whole (more bytes are needed); else the frame there is not common and ``head`` and ``length`` are its header's
    bytes and the payload length it declares (which may be anything up to 2**64 - 1)."""
    end = len(buf)
    pos = min(max(pos, 0), end)
    out = []
    while True:
        if end - pos < 2:
            return b"".join(out), pos, 0, 0
        first, second = buf[pos], buf[pos + 1]
        n = second & 0x7F
        at = pos + 2
        minimal = True
        if n == 126:
            if end - at < 2:
                return b"".join(out), pos, 0, 0
            n = (buf[at] << 8) | buf[at + 1]
            at += 2
            minimal = n > 125
        elif n == 127:
            if end - at < 8:
                return b"".join(out), pos, 0, 0
            n = int.from_bytes(buf[at:at + 8], "big")
            at += 8
            minimal = n > 0xFFFF
        masked = second & 0x80
        if masked:
            at += 4
            if at > end:
                return b"".join(out), pos, 0, 0
        if first != 0x82 or not masked or not minimal or max_frame < 0 or n > max_frame:
            return b"".join(out), pos, at - pos, n
        if end - at < n:
            return b"".join(out), pos, 0, 0
        key = bytes(buf[at - 4:at])
        data = bytes(buf[at:at + n])
        if key != b"\0\0\0\0" and n:
            mask = (key * (n // 4 + 1))[:n]
            data = (int.from_bytes(data, "little") ^ int.from_bytes(mask, "little")).to_bytes(n, "little")
        out.append(data)
        pos = at + n


def binary_header(n):
    """The header of the server's binary frame (final, unmasked) of ``n`` payload bytes."""
    if n < 126:
        return bytes((0x82, n))
    if n < 65536:
        return struct.pack("!BBH", 0x82, 126, n)
    return struct.pack("!BBQ", 0x82, 127, n)


frames = load("ws_frames", frames_py)
