"""Cheap raw-socket benchmark clients for metaq's text protocol (and the RESP twin for Redis).

Client and broker share the machine's cores, so a client that spends 10 µs per
reply in a general parser takes that time from the broker and the figure says
more about the client than the broker. These clients send pre-encoded
requests, receive with ``recv_into`` into one preallocated buffer and only
find where each reply ends (one compiled regex match per reply, no event
objects). ``RespReplies`` does the same for Redis, so both columns of the
benchmark pay the same client costs.
"""

import re
import socket

from metaq.protocol.checksum import metaq_checksum

#: ``result <code> <len> <opaque>\r\n`` (the body follows).
RESULT = re.compile(rb"result (\d+) (\d+) (-?\d+)\r\n")
#: RESP bulk string header ``$<len>\r\n`` (the body and ``\r\n`` follow); simple strings ``+...\r\n``.
RESP_BULK = re.compile(rb"\$(-?\d+)\r\n|\+[^\r]*\r\n")

BUFFER = 4 << 20


def connect(port, host="127.0.0.1", ssl_context=None, auth=None):
    """A connected socket; ``ssl_context``: over TLS; ``auth``: ``(user, secret)`` proved first (the text
    ``auth`` handshake, through ``TextClient``)."""
    if auth is not None:
        from metaq.client.raw import TextClient

        client = TextClient(host, port, ssl_context=ssl_context)
        r = client.auth(*auth)
        if r.code != 200:
            raise RuntimeError("auth refused: %r" % (r,))
        return client.sock  # nothing past the auth reply is buffered: one request at a time
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if ssl_context is not None:
        sock = ssl_context.wrap_socket(sock, server_hostname=host)
    return sock


def put_block(topic, payload, count, partition=0, first_opaque=0):
    """``count`` put frames (bytes) for ``payload`` with opaques ``first_opaque…``."""
    crc = metaq_checksum(payload)
    head = "put %s %d %d 0 %d " % (topic, partition, len(payload), crc)
    frames = [b"%s%d\r\n%s" % (head.encode(), first_opaque + i, payload) for i in range(count)]
    return frames


class _Replies:
    """Counts whole replies arriving on ``sock``; subclasses say how long one reply is."""

    def __init__(self, sock, size=BUFFER):
        self.sock = sock
        self.buf = bytearray(size)
        self.view = memoryview(self.buf)
        self.start = 0
        self.end = 0

    def receive(self):
        """Receive once; returns how many whole replies were completed (raises on an error reply)."""
        start, end = self.start, self.end
        if start == end:
            start = end = 0
        elif end > len(self.buf) // 2:  # keep room: move the partial reply to the front
            self.buf[:end - start] = self.buf[start:end]
            start, end = 0, end - start
        n = self.sock.recv_into(self.view[end:])
        if not n:
            raise ConnectionError("the server closed the connection")
        end += n
        count, self.start = self._scan(start, end)
        self.end = end
        return count

    def wait(self, count):
        """Receive until ``count`` more replies are complete."""
        done = 0
        while done < count:
            done += self.receive()
        return done


class ResultReplies(_Replies):
    """metaq ``result`` replies; anything but ``result 200`` raises."""

    def _scan(self, pos, end):
        buf, match, count = self.buf, RESULT.match, 0
        while True:
            m = match(buf, pos, end)
            if m is None:
                if end - pos >= 7 and buf[pos:pos + 7] != b"result ":
                    raise RuntimeError("unexpected reply: %r" % bytes(buf[pos:pos + 80]))
                return count, pos
            stop = m.end() + int(m.group(2))
            if stop > end:
                return count, pos
            if m.group(1) != b"200":
                raise RuntimeError("reply %r" % bytes(buf[pos:stop]))
            pos = stop
            count += 1


class RespReplies(_Replies):
    """Redis replies to XADD (bulk strings) or simple strings; an error reply raises."""

    def _scan(self, pos, end):
        buf, match, count = self.buf, RESP_BULK.match, 0
        while True:
            m = match(buf, pos, end)
            if m is None:
                if pos < end and buf[pos:pos + 1] == b"-":
                    raise RuntimeError("redis error: %r" % bytes(buf[pos:pos + 200]))
                return count, pos
            if m.group(1) is None:
                stop = m.end()
            else:
                stop = m.end() + max(0, int(m.group(1))) + 2
            if stop > end:
                return count, pos
            pos = stop
            count += 1


def pipeline(sock, replies, frames, n, depth):
    """Send ``n`` requests cycling through ``frames`` keeping ``depth`` in flight; returns when all are answered.

    Like a pipelining producer: once half the window is answered, the answered
    half is sent again in one ``sendall``.
    """
    nframes = len(frames)
    sent = min(depth, n)
    sock.sendall(b"".join(frames[i % nframes] for i in range(sent)))
    done = 0
    while done < n:
        done += replies.receive()
        if sent < n and sent - done <= depth // 2:
            more = min(depth - (sent - done), n - sent)
            sock.sendall(b"".join(frames[(sent + i) % nframes] for i in range(more)))
            sent += more
    return done
