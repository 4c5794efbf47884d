"""What the hostile tests share: a broker's memory, a probe of its loop, raw sockets that misbehave."""

import socket
import statistics
import threading
import time
from contextlib import contextmanager
from typing import NamedTuple

from metaq.client.raw import TextClient
from metaq.protocol import events as ev


def rss_bytes(pid):
    """The resident set of process ``pid`` (VmRSS), in bytes."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for %d" % pid)


def settled_rss_bytes(pid, steady=1 << 20, wait_s=5.0):
    """``rss_bytes`` once two readings 0.25 s apart differ by less than ``steady`` (a broker just started still maps
    its first segments and warms its loops: growth a test measures from here is its own), or the last after
    ``wait_s``."""
    last = rss_bytes(pid)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = rss_bytes(pid)
        if abs(now - last) < steady:
            return now
        last = now
    return last


def quiet_socket(port, host="127.0.0.1", source=None, rcvbuf=4096):
    """A connection to the broker with a small receive buffer (its replies back up fast), optionally from
    ``source`` (another loopback address: another "host")."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    if source is not None:
        s.bind((source, 0))
    s.connect((host, port))
    return s


def hang_up(sock):
    """Close a socket another thread may be blocked sending on (``close`` alone would not wake it)."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def send_in_background(sock, data):
    """Send ``data`` from a thread (the broker stops reading it: the send may block for good); returns the
    thread, which ends when the socket is hung up (``hang_up``)."""

    def run():
        try:
            sock.sendall(data)
        except OSError:
            pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


class LoopProbe:
    """Another client asking ``version`` over and over from a thread: how long the broker's loop takes to
    answer while something else goes on."""

    def __init__(self, port):
        self.port = port
        self.latencies = []
        self.failures = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(30)

    def _run(self):
        with TextClient("127.0.0.1", self.port, timeout=10) as c:
            i = 0
            while not self._stop.is_set():
                i += 1
                t0 = time.perf_counter()
                r = c.call(ev.Version(i))
                self.latencies.append(time.perf_counter() - t0)
                if getattr(r, "code", None) != 200:
                    self.failures.append(r)
                time.sleep(0.005)

    def p99(self):
        return statistics.quantiles(self.latencies, n=100)[98]

    def worst(self):
        return max(self.latencies)


class Flood(NamedTuple):
    """What an unread flood did: the broker's RSS growth (bytes) and a probe of its loop meanwhile."""

    grown: int
    probe: LoopProbe


@contextmanager
def unread_flood(broker, port, data, seconds=4.0):
    """A client sends ``data`` to ``port`` and never reads a reply; after ``seconds`` (another client probing the
    loop meanwhile) yields a Flood while the attacker is still connected, then hangs it up."""
    rss_before = rss_bytes(broker.proc.pid)
    attacker = quiet_socket(port)
    sender = send_in_background(attacker, data)
    try:
        with LoopProbe(broker.port) as probe:
            time.sleep(seconds)
        yield Flood(rss_bytes(broker.proc.pid) - rss_before, probe)
    finally:
        hang_up(attacker)
        sender.join(10)
