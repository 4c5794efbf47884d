"""The peer in the benchmark: Redis Streams (XADD / XRANGE) with AOF, appendfsync everysec.

A minimal RESP client over a raw socket so the peer pays the same client costs as ours.
"""

import os
import shutil
import socket
import subprocess
import time

from bench import wire

MSG = 1024
KEY = b"bench"


def redis_available():
    return shutil.which("redis-server") is not None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(a), a))
    return b"".join(out)


#: One XADD of a 1 KiB value, pre-encoded as metaq's put frames are.
XADD = command("XADD", KEY, "*", "v", b"p" * MSG)


class Reader:
    """Reads RESP replies; ``skip()`` consumes one whole reply and returns its payload size."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.pos = 0

    def _line(self):
        while True:
            i = self.buf.find(b"\r\n", self.pos)
            if i >= 0:
                line = self.buf[self.pos:i]
                self.pos = i + 2
                return line
            self._more()

    def _more(self):
        self.buf = self.buf[self.pos:] + self.sock.recv(1 << 20)
        self.pos = 0
        if not self.buf:
            raise ConnectionError("redis closed the connection")

    def skip(self):
        line = self._line()
        kind = line[:1]
        if kind == b"$":
            n = int(line[1:])
            if n < 0:
                return 0
            while len(self.buf) - self.pos < n + 2:
                self._more()
            self.pos += n + 2
            return n
        if kind == b"*":
            return sum(self.skip() for _ in range(max(0, int(line[1:]))))
        if kind == b"-":
            raise RuntimeError(line.decode())
        return 0


class RedisBench:
    def __init__(self, root):
        self.dir = os.path.join(root, "redis")
        os.makedirs(self.dir)
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir,
             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--daemonize", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.sock = socket.create_connection(("127.0.0.1", self.port))
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = Reader(self.sock)

    def _reset(self):
        self.sock.sendall(command("DEL", KEY))
        self.reader.skip()

    def pipelined_xadd(self, n, depth=64):
        self._reset()
        replies = wire.RespReplies(self.sock)
        started = time.perf_counter()
        wire.pipeline(self.sock, replies, [XADD], n, depth)
        return n / (time.perf_counter() - started)

    def sequential_xadd(self, n):
        self._reset()
        replies = wire.RespReplies(self.sock)
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            self.sock.sendall(XADD)
            replies.wait(1)
            lat.append(time.perf_counter() - t)
        lat.sort()
        return lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3

    def sequential_xrange(self, n, batch=1000):
        """Write n messages, then read them back ~1 MiB (1000 entries) at a time."""
        self.pipelined_xadd(n, depth=256)
        started = time.perf_counter()
        start, read, nbytes = b"-", 0, 0
        while read < n:
            self.sock.sendall(command("XRANGE", KEY, start, "+", "COUNT", batch))
            ids, size = self._read_entries()
            if not ids:
                break
            read += len(ids)
            nbytes += size
            start = b"(" + ids[-1]
        elapsed = time.perf_counter() - started
        return nbytes / elapsed / 1e6, read / elapsed

    def _read_entries(self):
        r = self.reader
        count = int(r._line()[1:])
        ids, size = [], 0
        for _ in range(count):
            r._line()  # *2
            id_len = int(r._line()[1:])
            while len(r.buf) - r.pos < id_len + 2:
                r._more()
            ids.append(r.buf[r.pos:r.pos + id_len])
            r.pos += id_len + 2
            size += r.skip()
        return ids, size

    def set_fsync(self, policy):
        self.sock.sendall(command("CONFIG", "SET", "appendfsync", policy))
        self.reader.skip()

    def concurrent_xadd(self, producers, per_producer, depth):
        """``producers`` client processes, each with its own connection and ``depth`` XADDs in flight."""
        import multiprocessing

        self._reset()
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(producers) as pool:
            start_at = time.time() + 0.5
            pool.map(_xadd_producer, [(self.port, per_producer, depth, start_at)] * producers)
            elapsed = time.time() - start_at
        return producers * per_producer / elapsed

    def close(self):
        try:
            self.sock.close()
        finally:
            self.proc.terminate()
            self.proc.wait(10)


def _xadd_producer(args):
    port, n, depth, start_at = args
    sock = wire.connect(port)
    replies = wire.RespReplies(sock)
    while time.time() < start_at:
        time.sleep(0.001)
    wire.pipeline(sock, replies, [XADD], n, depth)
    sock.close()
