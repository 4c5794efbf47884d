"""The second peer in the benchmark: NATS JetStream (Debian's nats-server 2.9) with file storage.

A minimal NATS client over a raw socket, so the peer pays the same client costs as ours and
Redis's (pre-encoded requests, replies counted in one preallocated buffer, ``bench/wire.py``).
The NATS protocol is text: the server opens with ``INFO {json}``, the client answers ``CONNECT
{json}``; ``PUB <subject> [reply-to] <#bytes>`` publishes, ``SUB <subject> <sid>`` subscribes and
deliveries come as ``MSG <subject> <sid> [reply-to] <#bytes>`` (``HMSG`` with headers, which here
only carry status codes); either side may send ``PING`` and the other answers ``PONG``. JetStream
is driven through request subjects: a ``PUB`` to a stream's subject with a reply inbox is
answered on the inbox with ``{"stream":..,"seq":..}`` once the message is stored, and the API
(``$JS.API.STREAM.CREATE.<name>`` and so on) takes and answers JSON.

Durability, and why these settings: the stream uses file storage (``-js -sd <dir>``), one
replica. JetStream 2.9's file store writes each message to its block file (a ``write(2)``, no
fsync) before it acknowledges the publish, and fsyncs the blocks every 2 minutes in the
background; 2.9 can change neither (``sync_interval``, with ``always``, is a 2.10 server
option: 2.9.10 refuses the field). So every NATS row is "acknowledged once in the OS's page
cache": the same as metaq's ``async`` mode and as Redis with ``appendfsync everysec`` (a write
per event-loop turn, an fsync per second), and weaker than metaq's ``sync`` mode and Redis's
``appendfsync always``, which fsync before they answer. ``bench/run.py`` marks the rows where
the others fsync each write and NATS cannot.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import time

from bench import wire

MSG = 1024
STREAM = "BENCH"
SUBJECT = b"bench"
#: Every reply to a connection (publish acks, API answers, pulled messages) comes to its own wildcard
#: inbox ``_INBOX.<random>.>``, sid 1: ``.ack``, ``.api`` and ``.pull`` under it.
INBOX_PREFIX = b"_INBOX."

#: ``MSG <subject> <sid> [reply-to] <#bytes>\r\n`` (the payload and ``\r\n`` follow). Without a reply
#: subject the server may leave two spaces (``MSG _INBOX.x 1  27``).
MSG_HEAD = re.compile(rb"MSG [^ \r\n]+ +\d+ +(?:[^ \r\n]+ +)?(\d+)\r\n")
#: ``HMSG <subject> <sid> [reply-to] <#header bytes> <#total bytes>\r\n``.
HMSG_HEAD = re.compile(rb"HMSG [^ \r\n]+ +\d+ +(?:[^ \r\n]+ +)?(\d+) +(\d+)\r\n")


def nats_server():
    """The ``nats-server`` program, or None. Debian installs it in /usr/sbin, which a user's PATH may lack."""
    return shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/local/sbin")


def nats_available():
    return nats_server() is not None


def pub(subject, payload, reply=None):
    """One ``PUB`` frame (bytes)."""
    if reply is None:
        return b"PUB %s %d\r\n%s\r\n" % (subject, len(payload), payload)
    return b"PUB %s %s %d\r\n%s\r\n" % (subject, reply, len(payload), payload)


def pub_acked(inbox):
    """One publish of a 1 KiB payload to the stream with the ack inbox, pre-encoded as metaq's put frames are."""
    return pub(SUBJECT, b"p" * MSG, inbox + b".ack")


class NatsReplies(wire._Replies):
    """Counts ``MSG`` deliveries (publish acks, API answers, pulled messages) arriving on ``sock``.

    ``nbytes`` adds up their payload sizes; with ``keep`` each payload is appended to ``payloads``.
    A ``PING`` is answered with ``PONG``; ``PONG``, ``+OK`` and ``INFO`` lines are skipped. An
    ``-ERR``, a JetStream error ack (``{"error":..}``), a status message (``HMSG``, such as 503 no
    responders or 404 no messages: this client never expects one) or anything else raises.
    """

    def __init__(self, sock, size=wire.BUFFER, keep=False):
        super().__init__(sock, size)
        self.nbytes = 0
        self.pongs = 0
        self.keep = keep
        self.payloads = []

    def _scan(self, pos, end):
        buf, match, count, nbytes = self.buf, MSG_HEAD.match, 0, 0
        try:
            while pos < end:
                m = match(buf, pos, end)
                if m is not None:
                    size = int(m.group(1))
                    body = m.end()
                    stop = body + size + 2
                    if stop > end:
                        break
                    if buf[body:body + 8] == b'{"error"':
                        raise RuntimeError("jetstream error: %r" % bytes(buf[body:body + size]))
                    if self.keep:
                        self.payloads.append(bytes(buf[body:body + size]))
                    nbytes += size
                    count += 1
                    pos = stop
                    continue
                line_end = buf.find(b"\r\n", pos, end)
                if line_end < 0:
                    break
                line = bytes(buf[pos:line_end])
                if line == b"PING":
                    self.sock.sendall(b"PONG\r\n")
                elif line == b"PONG":
                    self.pongs += 1
                elif line == b"+OK" or line.startswith(b"INFO "):
                    pass
                elif line.startswith(b"-ERR"):
                    raise RuntimeError("nats error: %s" % line.decode(errors="replace"))
                elif line.startswith(b"HMSG "):
                    h = HMSG_HEAD.match(line + b"\r\n")
                    shown = bytes(buf[line_end + 2:line_end + 2 + (int(h.group(1)) if h else 80)])
                    raise RuntimeError("nats status message: %r" % shown.strip())
                else:
                    raise RuntimeError("unexpected from nats: %r" % bytes(buf[pos:pos + 80]))
                pos = line_end + 2
        finally:
            self.nbytes += nbytes
        return count, pos


def new_inbox():
    return INBOX_PREFIX + os.urandom(8).hex().encode()


def handshake(sock, inbox):
    """Read the server's ``INFO``, send ``CONNECT`` and subscribe ``inbox.>``; returns the INFO dict."""
    buf = b""
    while b"\r\n" not in buf:
        more = sock.recv(65536)
        if not more:
            raise ConnectionError("nats closed the connection")
        buf += more
    line, _ = buf.split(b"\r\n", 1)
    if not line.startswith(b"INFO "):
        raise RuntimeError("not a nats server: %r" % line[:80])
    connect = {"verbose": False, "pedantic": False, "lang": "python-raw", "version": "bench",
               "protocol": 1, "headers": True, "no_responders": True}
    sock.sendall(b"CONNECT %s\r\nSUB %s.> 1\r\nPING\r\n" % (json.dumps(connect).encode(), inbox))
    return json.loads(line[5:])


def connect(port):
    """A connected socket, its CONNECT and SUB accepted; returns (socket, its inbox)."""
    sock = wire.connect(port)
    inbox = new_inbox()
    handshake(sock, inbox)
    replies = NatsReplies(sock)
    while not replies.pongs:  # the PONG to our PING: CONNECT and SUB were accepted (an -ERR raises)
        replies.receive()
    return sock, inbox


class NatsBench:
    def __init__(self, root):
        self.dir = os.path.join(root, "nats")
        os.makedirs(self.dir)
        self.port = free_port()
        self.log = open(os.path.join(self.dir, "nats-server.log"), "wb")
        self.proc = subprocess.Popen(
            [nats_server(), "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", os.path.join(self.dir, "js")],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while True:
            try:
                self.sock, self.inbox = connect(self.port)
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.05)
        self.api = NatsReplies(self.sock, keep=True)
        self.frame = pub_acked(self.inbox)
        # the server enables JetStream before it opens the client port: no wait for it here
        created = self.request("$JS.API.STREAM.CREATE." + STREAM, {
            "name": STREAM, "subjects": [SUBJECT.decode()], "storage": "file", "retention": "limits",
            "discard": "old", "num_replicas": 1, "max_msgs": -1, "max_bytes": -1, "max_age": 0,
            "max_msg_size": -1, "max_consumers": -1})
        if "error" in created:
            raise RuntimeError("stream: %r" % created)

    def request(self, subject, body=None):
        """One JetStream API request on the main connection; returns the decoded answer."""
        payload = b"" if body is None else json.dumps(body).encode()
        self.sock.sendall(pub(subject.encode(), payload, self.inbox + b".api"))
        del self.api.payloads[:]
        self.api.wait(1)
        return json.loads(self.api.payloads[0])

    def _reset(self):
        r = self.request("$JS.API.STREAM.PURGE." + STREAM)
        if not r.get("success"):
            raise RuntimeError("purge: %r" % r)

    def _check(self, n):
        """The stream holds the ``n`` messages just acknowledged (checked outside the timed part)."""
        state = self.request("$JS.API.STREAM.INFO." + STREAM)["state"]
        if state["messages"] != n or state["bytes"] < n * MSG:
            raise RuntimeError("expected %d messages in the stream: %r" % (n, state))

    def pipelined_publish(self, n, depth=64):
        self._reset()
        replies = NatsReplies(self.sock)
        started = time.perf_counter()
        wire.pipeline(self.sock, replies, [self.frame], n, depth)
        rate = n / (time.perf_counter() - started)
        self._check(n)
        return rate

    def sequential_publish(self, n):
        self._reset()
        replies = NatsReplies(self.sock)
        lat = []
        for _ in range(n):
            t = time.perf_counter()
            self.sock.sendall(self.frame)
            replies.wait(1)
            lat.append(time.perf_counter() - t)
        self._check(n)
        lat.sort()
        return lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3

    def concurrent_publish(self, producers, per_producer, depth):
        """``producers`` client processes, each with its own connection and ``depth`` publishes in flight."""
        import multiprocessing

        self._reset()
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(producers) as pool:
            start_at = time.time() + 0.5
            pool.map(_pub_producer, [(self.port, per_producer, depth, start_at)] * producers)
            elapsed = time.time() - start_at
        self._check(producers * per_producer)
        return producers * per_producer / elapsed

    def sequential_pull(self, n, batch=1000):
        """Write n messages, then read them back through a pull consumer, ~1 MiB (1000 messages) a request.

        The consumer acknowledges nothing (``ack_policy: none``: a reader of a log, as metaq's gets and
        Redis's XRANGE are). As metaq's reader does, the next request goes out as soon as the first
        message of the current batch arrives. Returns (MB/s, msgs/s) of payload.
        """
        self.pipelined_publish(n, depth=256)
        name = "reader"
        created = self.request("$JS.API.CONSUMER.DURABLE.CREATE.%s.%s" % (STREAM, name), {
            "stream_name": STREAM,
            "config": {"durable_name": name, "deliver_policy": "all", "ack_policy": "none",
                       "replay_policy": "instant", "max_waiting": 512}})
        if "error" in created:
            raise RuntimeError("consumer: %r" % created)
        next_subject = ("$JS.API.CONSUMER.MSG.NEXT.%s.%s" % (STREAM, name)).encode()
        replies = NatsReplies(self.sock)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)

        def ask(first):
            want = min(batch, n - first)
            self.sock.sendall(pub(next_subject, b'{"batch":%d}' % want, self.inbox + b".pull"))
            return first + want

        started = time.perf_counter()
        read, newest, asked = 0, 0, ask(0)  # newest: where the newest batch asked for starts
        while read < n:
            read += replies.receive()
            if read > newest and asked < n:  # its first message is here: ask for the next one
                newest, asked = asked, ask(asked)
        elapsed = time.perf_counter() - started
        if read != n or replies.nbytes != n * MSG:
            raise RuntimeError("pulled %d messages, %d bytes of %d" % (read, replies.nbytes, n))
        self.request("$JS.API.CONSUMER.DELETE.%s.%s" % (STREAM, name))
        return replies.nbytes / elapsed / 1e6, read / elapsed

    def close(self):
        try:
            self.sock.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.log.close()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pub_producer(args):
    port, n, depth, start_at = args
    sock, inbox = connect(port)
    replies = NatsReplies(sock)
    while time.time() < start_at:
        time.sleep(0.001)
    wire.pipeline(sock, replies, [pub_acked(inbox)], n, depth)
    sock.close()
