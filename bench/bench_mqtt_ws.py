"""MQTT over WebSocket against the TCP port of the same broker (issue 71 point 6).

    python -m bench.bench_mqtt_ws [--runs 5] [--messages 40000] [--publishers 4] [--held 2000]

One metaq broker (flush async: a PUBACK once the message is in the commit log's map) with its MQTT port and its
``mqtt.ws_port``; the runs alternate TCP and WebSocket, so both see the same machine:

* **broker CPU per QoS 1 message**: ``--publishers`` raw MQTT 3.1.1 publishers (one process each), 128-byte payloads,
  at most 32 unacknowledged each, ``--messages`` in all; the broker's CPU (``/proc``) over the run divided by the
  messages. Over WebSocket each PUBLISH is one masked binary frame (mask key zero: the generator's cost is TCP's);
  the broker's frames are read for their PUBACKs;
* **memory per connection held**: ``--held`` connected, idle clients (CONNECT, CONNACK, then quiet) on each
  transport, each on a broker of its own just started; the broker's RSS growth divided by them.

Medians of ``--runs``; the ratio WebSocket / TCP is the row to watch. Not a test: nothing here asserts.
"""

import argparse
import base64
import multiprocessing
import os
import socket
import statistics
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.bench_mqtt import Metaq, cpu_seconds  # noqa: E402
from metaq.client.local import free_port  # noqa: E402
from metaq.mqtt import wire  # noqa: E402

PAYLOAD = b"x" * 128
WINDOW = 32
TOPIC = "bench/ws"
PUBACK_BYTES = 4  # MQTT 3.1.1: 0x40 0x02 and the packet id


def ws_frame(payload):
    """A client's binary frame, masked with the key 0 (the payload as it is)."""
    n = len(payload)
    if n < 126:
        return bytes([0x82, 0x80 | n]) + b"\0\0\0\0" + payload
    if n < 65536:
        return bytes([0x82, 0x80 | 126]) + struct.pack("!H", n) + b"\0\0\0\0" + payload
    return bytes([0x82, 0x80 | 127]) + struct.pack("!Q", n) + b"\0\0\0\0" + payload


class Unframer:
    """The MQTT bytes of the broker's frames (unmasked binary frames), as they arrive."""

    def __init__(self):
        self.buf = b""

    def feed(self, data):
        self.buf += data
        out = []
        while len(self.buf) >= 2:
            n, at = self.buf[1] & 0x7F, 2
            if n == 126:
                if len(self.buf) < 4:
                    break
                n, at = struct.unpack("!H", self.buf[2:4])[0], 4
            elif n == 127:
                if len(self.buf) < 10:
                    break
                n, at = struct.unpack("!Q", self.buf[2:10])[0], 10
            if len(self.buf) < at + n:
                break
            out.append(self.buf[at:at + n])
            self.buf = self.buf[at + n:]
        return b"".join(out)


def dial(ports, websocket, client_id):
    """A connected MQTT 3.1.1 client socket (CONNACK read), over TCP or WebSocket."""
    tcp_port, ws_port = ports
    sock = socket.create_connection(("127.0.0.1", ws_port if websocket else tcp_port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    unframer = None
    if websocket:
        key = base64.b64encode(os.urandom(16)).decode()
        sock.sendall(("GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: mqtt\r\n\r\n"
                      % key).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 101"), head
        unframer = Unframer()
    connect = wire.encode(wire.Connect(wire.MQTT_311, client_id, keep_alive=0), wire.MQTT_311)
    sock.sendall(ws_frame(connect) if websocket else connect)
    got = b""
    while len(got) < 4:
        data = sock.recv(4096)
        assert data, "closed before its CONNACK"
        got += unframer.feed(data) if unframer else data
    return sock, unframer


def publisher(ports, websocket, index, messages):
    """``messages`` QoS 1 PUBLISHes, at most ``WINDOW`` unacknowledged; returns when all are acknowledged."""
    sock, unframer = dial(ports, websocket, "bench-%s-%d" % ("ws" if websocket else "tcp", index))
    packets = [wire.encode(wire.Publish(TOPIC, PAYLOAD, qos=1, packet_id=1 + i % 65000), wire.MQTT_311)
               for i in range(WINDOW * 2)]
    if websocket:
        packets = [ws_frame(p) for p in packets]
    sent = acked = 0
    pending = b""
    while acked < messages:
        burst = min(WINDOW - (sent - acked), messages - sent)
        if burst > 0:
            sock.sendall(b"".join(packets[(sent + i) % len(packets)] for i in range(burst)))
            sent += burst
        data = sock.recv(65536)
        assert data, "closed"
        pending += unframer.feed(data) if unframer else data
        acked += len(pending) // PUBACK_BYTES
        pending = pending[len(pending) - len(pending) % PUBACK_BYTES:]
    sock.close()


def cpu_per_message(broker, ports, websocket, publishers, messages):
    each = messages // publishers
    procs = [multiprocessing.Process(target=publisher, args=(ports, websocket, i, each)) for i in range(publishers)]
    before = cpu_seconds(broker.pid)
    started = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    assert all(p.exitcode == 0 for p in procs), "a publisher failed"
    return (cpu_seconds(broker.pid) - before) / (each * publishers), time.monotonic() - started


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def memory_per_connection(broker, ports, websocket, held):
    time.sleep(0.5)
    before = rss_bytes(broker.pid)
    socks = [dial(ports, websocket, "held-%s-%d" % ("ws" if websocket else "tcp", i))[0] for i in range(held)]
    time.sleep(2.0)  # parked
    grown = rss_bytes(broker.pid) - before
    for s in socks:
        s.close()
    time.sleep(1.0)
    return grown / held


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--messages", type=int, default=40_000)
    p.add_argument("--publishers", type=int, default=4)
    p.add_argument("--held", type=int, default=2000)
    p.add_argument("--dir", default=None, help="where to put metaq's data (default: $TMPDIR)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        ws_port = free_port()
        broker = Metaq(root, "async", ws_port=ws_port)
        ports = (broker.port, ws_port)
        try:
            cpu_per_message(broker, ports, False, args.publishers, args.messages // 4)  # warm-up
            cpu_per_message(broker, ports, True, args.publishers, args.messages // 4)
            cpu = {False: [], True: []}
            rate = {False: [], True: []}
            for _ in range(args.runs):
                for websocket in (False, True):
                    used, seconds = cpu_per_message(broker, ports, websocket, args.publishers, args.messages)
                    cpu[websocket].append(used)
                    rate[websocket].append(args.messages / seconds)
        finally:
            broker.stop()
        memory = {False: [], True: []}
        for i in range(max(1, args.runs // 2)):
            for websocket in (False, True):  # a fresh broker each: no heap another transport's connections freed
                where = os.path.join(root, "m%d%d" % (i, websocket))
                os.makedirs(where)
                fresh_ws = free_port()
                fresh = Metaq(where, "async", ws_port=fresh_ws)
                try:
                    memory[websocket].append(memory_per_connection(fresh, (fresh.port, fresh_ws), websocket,
                                                                   args.held))
                finally:
                    fresh.stop()
    tcp, ws = statistics.median(cpu[False]), statistics.median(cpu[True])
    print("| measurement | TCP | WebSocket | WebSocket / TCP |")
    print("|---|---:|---:|---:|")
    print("| broker CPU per QoS 1 message | %.1f µs | %.1f µs | %.2fx |" % (tcp * 1e6, ws * 1e6, ws / tcp))
    print("| QoS 1 messages/s (%d publishers) | %.0f | %.0f | %.2fx |" % (
        args.publishers, statistics.median(rate[False]), statistics.median(rate[True]),
        statistics.median(rate[True]) / statistics.median(rate[False])))
    mt, mw = statistics.median(memory[False]), statistics.median(memory[True])
    print("| broker memory per idle connection held | %.1f KiB | %.1f KiB | %.2fx |" % (mt / 1024, mw / 1024,
                                                                                       mw / mt if mt else 0))
    print("runs: TCP %s; WebSocket %s (µs)" % (" ".join("%.1f" % (x * 1e6) for x in cpu[False]),
                                              " ".join("%.1f" % (x * 1e6) for x in cpu[True])))


if __name__ == "__main__":
    main()
