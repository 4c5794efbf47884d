"""HTTP/2 floods that reconnect after each cut, against a bystander's unary calls on the gRPC port.

    python -m bench.bench_h2flood [--runs 3] [--seconds 5] [--floods one-byte-data,closed-data,unknown]

One real broker process (the gRPC port's default flood budgets and cooldown; ``max_new_streams`` raised so that the
bystander's own calls never pass it) on 127.0.0.1. The bystander is a raw HTTP/2 connection from 127.0.0.2 making
Heartbeat calls one at a time (a request message each, read to its trailers); the attacker, a process of its own,
floods from 127.0.0.1 and connects again at once whenever the broker closes or refuses it:

* ``one-byte-data``: a SendMessage stream begun with a 1 MiB message announced, then 1-byte DATA frames;
* ``closed-data``: a Heartbeat call ended, then 1 KiB DATA frames on its closed stream;
* ``unknown``: frames of a type HTTP/2 does not define (0x42, 8 bytes);
* ``cpu-spin``: no flood, the attacker's process only busy, as busy as a flooder's: on a machine of few cores the
  bystander loses to any such process, so each flood's pace is also given as a share of the pace beside it.

Each run measures the bystander's calls a second alone, then beside each flood, for ``--seconds`` each, and the
broker process's CPU (per cent of one core) meanwhile; the table gives medians of ``--runs`` runs and each flood's
pace as a share of the bystander's alone. Run it from a checkout whose code the broker should run (its modules come
first on the broker's path). Not a test: nothing here asserts.
"""

import argparse
import multiprocessing
import os
import shutil
import socket
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import hpack  # noqa: E402

from bench.run import cpu_seconds  # noqa: E402
from metaq.client.local import BrokerProcess, free_port, small_config  # noqa: E402

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, WINDOW_UPDATE = 0, 1, 4, 8
END_STREAM, END_HEADERS = 0x1, 0x4
SERVICE = "/apache.rocketmq.v2.MessagingService/"
FLOODS = ("one-byte-data", "closed-data", "unknown")
#: The attacker's process busy on its own, sending nothing: what any process as busy costs the bystander on the same
#: machine (the floods' pace is also given as a share of the bystander's pace beside it).
SPIN = "cpu-spin"


def frame(ftype, flags=0, sid=0, payload=b""):
    return len(payload).to_bytes(3, "big") + bytes((ftype, flags)) + sid.to_bytes(4, "big") + payload


def header_block(rpc):
    headers = [(":method", "POST"), (":scheme", "http"), (":path", SERVICE + rpc), (":authority", "x"),
               ("content-type", "application/grpc"), ("te", "trailers"), ("x-mq-client-id", "bench")]
    return hpack.Encoder().encode([hpack.NeverIndexedHeaderTuple(n, v) for n, v in headers])


def flood_bytes(kind):
    """The opening of one flooding connection and the chunk it then sends over and over."""
    opening = PREFACE + frame(SETTINGS)
    if kind == "one-byte-data":
        opening += frame(HEADERS, END_HEADERS, 1, header_block("SendMessage")) + frame(
            DATA, 0, 1, b"\0" + (1 << 20).to_bytes(4, "big"))
        return opening, frame(DATA, 0, 1, b"x") * 6000
    if kind == "closed-data":
        opening += frame(HEADERS, END_HEADERS | END_STREAM, 1, header_block("Heartbeat"))
        return opening, frame(DATA, 0, 1, b"\0" * 1024) * 60
    return opening, frame(0x42, 0, 0, b"whatever") * 3800


def _drop(sock):
    try:
        while sock.recv(65536):
            pass
    except OSError:
        pass


def attack(port, kind, stop):
    """Flood ``kind`` from 127.0.0.1 until ``stop``, connecting again at once whenever the broker closes (``SPIN``:
    only keep a core busy)."""
    if kind == SPIN:
        while not stop.is_set():
            sum(range(1000))
        return
    opening, chunk = flood_bytes(kind)
    while not stop.is_set():
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.1", 0))
        except OSError:
            continue
        reader = threading.Thread(target=_drop, args=(sock,), daemon=True)
        reader.start()
        try:
            sock.sendall(opening)
            while not stop.is_set():
                sock.sendall(chunk)
        except OSError:
            pass
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
        reader.join(5)


class Bystander:
    """Heartbeat calls one at a time on one raw HTTP/2 connection from 127.0.0.2."""

    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=("127.0.0.2", 0))
        self.sock.sendall(PREFACE + frame(SETTINGS))
        self.buf = b""
        self.unacked = 0  # DATA bytes received and not yet given back to the connection's window
        self.sid = 1
        self.block = header_block("Heartbeat")

    def call(self):
        sid = self.sid
        self.sid += 2
        self.sock.sendall(frame(HEADERS, END_HEADERS, sid, self.block) + frame(DATA, END_STREAM, sid, b"\0" * 5))
        while True:
            while len(self.buf) >= 9 and len(self.buf) >= 9 + int.from_bytes(self.buf[:3], "big"):
                n = int.from_bytes(self.buf[:3], "big")
                ftype, flags, stream = self.buf[3], self.buf[4], int.from_bytes(self.buf[5:9], "big") & 0x7FFFFFFF
                self.buf = self.buf[9 + n:]
                if ftype == DATA:
                    self.unacked += n
                    if self.unacked >= 1 << 15:
                        self.sock.sendall(frame(WINDOW_UPDATE, 0, 0, self.unacked.to_bytes(4, "big")))
                        self.unacked = 0
                if ftype == HEADERS and flags & END_STREAM and stream == sid:
                    return
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the bystander's connection ended")
            self.buf += data

    def pace(self, seconds):
        """Calls a second over ``seconds``."""
        n, started = 0, time.monotonic()
        while time.monotonic() - started < seconds:
            self.call()
            n += 1
        return n / (time.monotonic() - started)

    def close(self):
        self.sock.close()


def measure(broker, port, kind, seconds):
    """(the bystander's calls a second, the broker's CPU in per cent of one core) beside ``kind`` (None: alone)."""
    stop, attacker = multiprocessing.Event(), None
    bystander = Bystander(port)
    try:
        bystander.pace(0.3)  # warm
        if kind is not None:
            attacker = multiprocessing.Process(target=attack, args=(port, kind, stop), daemon=True)
            attacker.start()
            time.sleep(0.5)
        cpu, at = cpu_seconds(broker.pid), time.monotonic()
        pace = bystander.pace(seconds)
        cpu = 100.0 * (cpu_seconds(broker.pid) - cpu) / (time.monotonic() - at)
    finally:
        stop.set()
        if attacker is not None:
            attacker.join(10)
            if attacker.is_alive():
                attacker.kill()
        bystander.close()
    time.sleep(0.5)
    return pace, cpu


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--floods", default=",".join(FLOODS))
    args = ap.parse_args()
    floods = [SPIN] + [f for f in args.floods.split(",") if f]
    results = {k: [] for k in [None] + floods}
    for run in range(args.runs):
        root = tempfile.mkdtemp(prefix="h2flood-")
        try:
            port = free_port()
            cfg = small_config(os.path.join(root, "data"), grpc={"port": port, "max_new_streams": 1 << 24},
                               store={"flush": "async"})
            broker = BrokerProcess(root, cfg).start()
            try:
                for kind in [None] + floods:
                    results[kind].append(measure(broker.proc, port, kind, args.seconds))
                    print("run %d %-14s %8.0f calls/s  broker CPU %3.0f %%" % ((run + 1, kind or "alone")
                                                                            + results[kind][-1]), flush=True)
            finally:
                broker.kill()
        finally:
            shutil.rmtree(root, ignore_errors=True)
    alone = statistics.median(p for p, _ in results[None])
    spun = statistics.median(p for p, _ in results[SPIN])
    print("\n| flood (reconnecting) | bystander calls/s | of its pace alone | of its pace beside a busy process "
          "| broker CPU |")
    print("|---|---|---|---|---|")
    for kind in [None] + floods:
        pace = statistics.median(p for p, _ in results[kind])
        cpu = statistics.median(c for _, c in results[kind])
        print("| %s | %.0f | %.0f %% | %.0f %% | %.0f %% |" % (kind or "none (alone)", pace, 100.0 * pace / alone,
                                                              100.0 * pace / spun, cpu))


if __name__ == "__main__":
    main()
