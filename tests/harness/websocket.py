"""A raw WebSocket client for the MQTT port's WebSocket listener: the upgrade request and frames built byte by byte,
so a test can send what no real client would (unmasked frames, huge declared lengths, floods)."""

import base64
import os
import socket
import struct

BINARY, TEXT, CONTINUATION, CLOSE, PING, PONG = 0x2, 0x1, 0x0, 0x8, 0x9, 0xA


def upgrade_request(path="/mqtt", protocols="mqtt", origin=None, host="127.0.0.1", extra=()):
    """The upgrade request's bytes; ``extra``: more header lines ("Name: value")."""
    lines = ["GET %s HTTP/1.1" % path, "Host: %s" % host, "Upgrade: websocket", "Connection: Upgrade",
             "Sec-WebSocket-Key: %s" % base64.b64encode(os.urandom(16)).decode(), "Sec-WebSocket-Version: 13"]
    if protocols is not None:
        lines.append("Sec-WebSocket-Protocol: %s" % protocols)
    if origin is not None:
        lines.append("Origin: %s" % origin)
    lines.extend(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def frame(opcode, payload=b"", fin=True, mask=True, declared=None):
    """One frame; ``declared``: the length its header says (default: the payload's)."""
    n = len(payload) if declared is None else declared
    head = bytes([(0x80 if fin else 0) | opcode])
    bit = 0x80 if mask else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 65536:
        head += bytes([bit | 126]) + struct.pack("!H", n)
    else:
        head += bytes([bit | 127]) + struct.pack("!Q", n)
    if not mask:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


class RawWs:
    """A socket to the WebSocket port: ``upgrade`` sends the request and returns the HTTP answer's head and body."""

    def __init__(self, port, host="127.0.0.1", timeout=10.0, source=None):
        self.sock = socket.create_connection((host, port), timeout=timeout,
                                             source_address=None if source is None else (source, 0))
        self.buf = b""

    def upgrade(self, **request):
        self.sock.sendall(upgrade_request(**request))
        return self.answer()

    def answer(self):
        """``(status, head, rest)`` of the HTTP answer (rest: what followed the head, read until the socket closed for
        a refusal)."""
        while b"\r\n\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            self.buf += chunk
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1]) if head else None
        if status != 101:
            self.buf += self.read_to_end()
        return status, head.decode("latin-1"), self.buf

    def read_to_end(self):
        out = b""
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return out
                out += chunk
        except OSError:
            return out

    def send(self, data):
        self.sock.sendall(data)

    def frames(self, until_close=True):
        """The server's frames ``[(opcode, payload)]`` until it closes (or the socket ends)."""
        data = self.buf + self.read_to_end()
        self.buf = b""
        out = []
        while len(data) >= 2:
            op, n, at = data[0] & 0x0F, data[1] & 0x7F, 2
            if n == 126:
                n, at = struct.unpack("!H", data[2:4])[0], 4
            elif n == 127:
                n, at = struct.unpack("!Q", data[2:10])[0], 10
            out.append((op, data[at:at + n]))
            data = data[at + n:]
        return out

    def close_code(self):
        """The code of the server's close frame (None: none came)."""
        for op, payload in self.frames():
            if op == CLOSE:
                return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
        return None

    def close(self):
        self.sock.close()


def upgraded_stream(max_frame=1 << 20, sndbuf=None):
    """``(WsStream, peer socket)``: the broker's side of a WebSocket (``metaq.serving.wsio``) over a socket pair,
    upgraded by the peer's request and one empty common frame, in this process; ``sndbuf``: the stream's socket's
    send buffer, to make it take a send in part."""
    import time

    import gevent
    from gevent import socket as gsocket

    from metaq.serving.wsio import WsRules, WsStream
    ours, theirs = gsocket.socketpair()
    if sndbuf is not None:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
    ws = WsStream(ours, WsRules("/mqtt", ("mqtt",), None, max_frame), ("127.0.0.1", 1), time.monotonic())
    ws.settimeout(5)
    theirs.sendall(upgrade_request() + b"\x82\x80\0\0\0\0")
    reader = gevent.spawn(ws.recv, 10)
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += theirs.recv(4096)
    reader.kill()
    assert answer.startswith(b"HTTP/1.1 101"), answer
    return ws, theirs


def server_frames(got):
    """The payloads of the broker's binary frames (unmasked, final) in ``got``, in order."""
    frames, at = [], 0
    while at < len(got):
        n, head = got[at + 1] & 0x7F, 2
        if n == 126:
            n, head = int.from_bytes(got[at + 2:at + 4], "big"), 4
        elif n == 127:
            n, head = int.from_bytes(got[at + 2:at + 10], "big"), 10
        assert got[at] == 0x82
        frames.append(got[at + head:at + head + n])
        at += head + n
    return frames
