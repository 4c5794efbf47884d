"""The floor of a gevent MQTT broker for the publish-to-receive rows (issue 43 point 9), beside metaq and Mosquitto.

    python -m bench.mqtt_floor [--runs 5] [--latency-n 2000] [--baseline /path/to/another/metaq/tree]

The same latency load as ``bench_mqtt`` (one QoS 1 publisher stamping a message every millisecond, one QoS 1
subscriber, 128-byte payloads) against three processes on 127.0.0.1, interleaved run by run: **the relay**, a
gevent process that does only what a broker must for that load (a greenlet per connection, the packets split and
routed in Python: CONNACK, SUBACK, the publisher's PUBACK, and its PUBLISH written as is to every subscriber; no
store, no session, no permission, no topic filter), **metaq** (``flush: async``) and **Mosquitto** (in memory). The
relay is what a Python gevent process costs at the least for this path; metaq's distance to it is what storing and
routing the message costs. Beside each, the broker process's CPU time (user and system, every thread) per message
over the run: what one message at a time costs the broker, and its ratio to the relay's and to Mosquitto's (issue
57's targets, printed under the table). Each run begins with ``WARM_UP`` messages of the same
load, not measured (metaq makes the topic's files then). Medians of ``--runs``. With ``--baseline``, a broker of
that source tree (its extensions built) runs in the same turns, and metaq's CPU a message is set against its run by
run: what a change to the path costs, on the same minutes of a busy machine.
Not a test: nothing here asserts.
"""

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import mqtt_load as load  # noqa: E402
from bench.bench_mqtt import Metaq, Mosquitto, cpu_seconds, latencies, mosquitto_path  # noqa: E402

CONNECT, PUBLISH, SUBSCRIBE, PINGREQ = 0x10, 0x30, 0x80, 0xC0
WARM_UP = 200  # messages of the same load sent first, not measured


def _relay(pipe):
    """The relay's process: serves until the pipe says ``close``."""
    from gevent import monkey
    monkey.patch_all()
    import socket

    import gevent
    from gevent.server import StreamServer

    subscribers = []

    def serve(sock, _address):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        rest = b""
        while True:
            data = sock.recv(65536)
            if not data:
                break
            packets, rest = load.split_packets(rest + data)
            for first, body in packets:
                kind = first & 0xF0
                if kind == CONNECT:
                    sock.sendall(b"\x20\x02\x00\x00")
                elif kind == SUBSCRIBE:
                    subscribers.append(sock)
                    sock.sendall(b"\x90\x03" + bytes(body[:2]) + b"\x00")
                elif kind == PUBLISH:
                    qos = (first >> 1) & 3
                    if qos:
                        at = 2 + ((body[0] << 8) | body[1])
                        sock.sendall(b"\x40\x02" + bytes(body[at:at + 2]))
                    packet = bytes([first]) + load._varint(len(body)) + bytes(body)
                    for s in subscribers:
                        s.sendall(packet)
                elif kind == PINGREQ:
                    sock.sendall(b"\xd0\x00")
        if sock in subscribers:
            subscribers.remove(sock)

    server = StreamServer(("127.0.0.1", 0), serve)
    server.start()
    pipe.send(server.address[1])
    gevent.get_hub().threadpool.apply(pipe.recv)
    server.stop()


def metaq_from(tree):
    """A maker of metaq brokers (``flush: async``) whose process imports metaq from source tree ``tree``."""

    def make(root):
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.path.abspath(tree)
        try:
            return Metaq(root, "async")
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH")
            else:
                os.environ["PYTHONPATH"] = saved

    return make


class Relay:
    def __init__(self, _root):
        parent, child = multiprocessing.Pipe()
        self.proc = multiprocessing.Process(target=_relay, args=(child,), daemon=True)
        self.proc.start()
        self.pipe = parent
        self.port = parent.recv()
        self.pid = self.proc.pid

    def stop(self):
        self.pipe.send("close")
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--latency-n", type=int, default=2000)
    p.add_argument("--baseline", default=None, help="another metaq source tree (its extensions built) to run beside")
    args = p.parse_args(argv)
    targets = [("gevent relay", Relay), ("metaq", lambda root: Metaq(root, "async"))]
    if args.baseline:
        targets.append(("baseline", metaq_from(args.baseline)))
    if mosquitto_path():
        targets.append(("mosquitto", Mosquitto))
    p50s, p99s, cpus = ({n: [] for n, _ in targets} for _ in range(3))
    for r in range(args.runs):
        order = targets if r % 2 == 0 else targets[::-1]
        for name, make in order:
            root = tempfile.mkdtemp(prefix="metaq-mqtt-floor-")
            target = make(root)
            try:
                latencies(target.port, WARM_UP)  # the topic made, its files and pages in place, before the measure
                used = cpu_seconds(target.pid)
                p50, p99 = latencies(target.port, args.latency_n)
                used = cpu_seconds(target.pid) - used
            finally:
                target.stop()
                shutil.rmtree(root, ignore_errors=True)
            p50s[name].append(p50)
            p99s[name].append(p99)
            cpus[name].append(used / args.latency_n * 1e6)
            print("run %d %-13s p50 %.3f ms p99 %.3f ms, %.0f us CPU a message" % (r + 1, name, p50, p99,
                                                                                  cpus[name][-1]),
                  file=sys.stderr, flush=True)
    print("QoS 1 publish-to-receive, one message a millisecond, %d a run, medians of %d runs"
          % (args.latency_n, args.runs))
    print("%-14s %10s %10s %14s %16s %14s %18s" % ("", "p50 ms", "p99 ms", "p50 / relay's", "CPU us/message",
                                                   "CPU / relay's", "CPU / mosquitto's"))
    relay = statistics.median(p50s["gevent relay"])
    relay_cpu = statistics.median(cpus["gevent relay"])
    peer_cpu = statistics.median(cpus["mosquitto"]) if "mosquitto" in cpus else None
    for name, _ in targets:
        m50, m99, cpu = statistics.median(p50s[name]), statistics.median(p99s[name]), statistics.median(cpus[name])
        print("%-14s %10.3f %10.3f %13.2fx %16.0f %13.2fx %18s" % (
            name, m50, m99, m50 / relay, cpu, cpu / relay_cpu, "%.2fx" % (cpu / peer_cpu) if peer_cpu else "-"))
    print("targets (issue 57): metaq's p50 within 1.2x the relay's and its CPU within 1.5x; the moonshot, its CPU "
          "within 2x Mosquitto's")
    if args.baseline:
        ratios = [m / b for m, b in zip(cpus["metaq"], cpus["baseline"], strict=True)]
        print("metaq's CPU a message / the baseline's, run by run: median %.3f (%.3f-%.3f)"
              % (statistics.median(ratios), min(ratios), max(ratios)))


if __name__ == "__main__":
    main()
