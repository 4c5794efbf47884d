"""metaq's MQTT port beside Mosquitto (issue 43 point 9).

    python -m bench.bench_mqtt [--runs 3] [--messages 100000] [--fanout-messages 200] [--latency-n 2000]

Every figure against real broker processes on 127.0.0.1, each measured in the same run, with the same load generator
(``bench/mqtt_load.py``: raw-socket MQTT 3.1.1 in worker processes), 128-byte payloads, one MQTT topic:

* **Mosquitto** (Debian's ``mosquitto``, where installed): its own config file, a free port, ``persistence false``
  (messages in memory only; a QoS 1 PUBACK says the broker has it in memory), stopped by its PID;
* **metaq, flush async**: a PUBACK once the message is in the commit log's map (written, not yet fsynced: the
  closest to Mosquitto's promise);
* **metaq, flush sync** (durable): a PUBACK once the message is fsynced (group commit).

Rows: QoS 0 and QoS 1 publish throughput with 1 and 100 publishers (QoS 0: all sent, then a PINGREQ whose PINGRESP
says the broker handled them; QoS 1: at most 32 unacknowledged per publisher); fan-out (one QoS 0 publisher,
``--fanout-messages`` messages to 1,000 QoS 0 subscribers: deliveries/s until the last subscriber has them all);
publish-to-receive latency p50/p99 (QoS 1 publish, one at a time 1 ms apart, one QoS 1 subscriber). The generator's
own ceiling is each throughput row against ``mqtt_load.Sink``, a stand-in broker that only answers. Medians of
``--runs``. Not a test: nothing here asserts.
"""

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import mqtt_load as load  # noqa: E402
from bench.configs import full_size_store  # noqa: E402
from metaq.client.local import BrokerProcess, free_port, small_config  # noqa: E402

TOPIC = "bench/t"
PAYLOAD = 128
WINDOW = 32
FANOUT_SUBSCRIBERS = 1000


def mosquitto_path():
    for path in ("/usr/sbin/mosquitto", shutil.which("mosquitto")):
        if path and os.path.exists(path):
            return path
    return None


class Mosquitto:
    """``mosquitto -c <its own file>`` on 127.0.0.1 and a free port, in memory only; stopped by its PID."""

    def __init__(self, root):
        self.port = free_port()
        self.root = root
        conf = os.path.join(root, "mosquitto.conf")
        with open(conf, "w") as f:
            f.write("listener %d 127.0.0.1\nallow_anonymous true\npersistence false\nmax_inflight_messages %d\n"
                    "max_queued_messages 0\nset_tcp_nodelay true\nlog_dest file %s\n"
                    % (self.port, WINDOW, os.path.join(root, "mosquitto.log")))
        self.proc = subprocess.Popen([mosquitto_path(), "-c", conf], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError("mosquitto did not listen on %d" % self.port)

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class Metaq:
    """A metaq broker process with its MQTT port, ``flush`` ``async`` or ``sync``; the real segment sizes."""

    def __init__(self, root, flush, **mqtt):
        self.port = free_port()
        cfg = small_config(os.path.join(root, "data"), store=full_size_store(flush=flush),
                           topics=[{"name": "bench*", "partitions": 4}, {"name": "*", "partitions": 2}],
                           mqtt=dict({"port": self.port}, **mqtt))
        self.broker = BrokerProcess(root, cfg)
        self.broker.start(timeout=60)

    @property
    def pid(self):
        return self.broker.proc.pid

    def stop(self):
        self.broker.stop(timeout=60)


def cpu_seconds(pid):
    """User and system CPU seconds process ``pid`` (a broker) has used so far, every thread's."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def publish_rate(port, publishers, qos, messages):
    """Messages/s of ``publishers`` connections publishing ``messages`` in all at ``qos``; and the generator's CPU
    seconds per second."""
    proc, pipe = load.spawn(load.publish, port, publishers, "pub%d" % qos, TOPIC, qos, PAYLOAD, None)
    try:
        if pipe.recv() != "ready":
            raise RuntimeError("publishers did not connect")
        each = max(1, messages // publishers)
        pipe.send(("go", each, WINDOW))
        seconds, cpu = pipe.recv()
        pipe.send("close")
    finally:
        proc.join(10)
    return each * publishers / seconds, cpu / seconds


def fanout_rate(port, messages, subscribers=FANOUT_SUBSCRIBERS, procs=2, push=None):
    """Deliveries/s of ``messages`` QoS 0 PUBLISHes to ``subscribers`` QoS 0 subscribers (``procs`` processes), until
    the last has them all; the fraction delivered; the generator's CPU seconds per second. ``push``: the sink's push
    instead of a publisher (the generator's ceiling)."""
    size = load.delivered_size(TOPIC, PAYLOAD, 0)
    subs = [load.spawn(load.subscribe, port, subscribers // procs, "sub%d" % i, TOPIC, 0, None, size)
            for i in range(procs)]
    pub = None
    try:
        for _, pipe in subs:
            if pipe.recv() != "ready":
                raise RuntimeError("subscribers did not subscribe")
        if push is None:
            pub = load.spawn(load.publish, port, 1, "fanpub", TOPIC, 0, PAYLOAD, None)
            pub[1].recv()
        time.sleep(0.5)
        started = time.perf_counter()
        for _, pipe in subs:
            pipe.send(("count", messages, 60))
        if push is None:
            pub[1].send(("go", messages, WINDOW))
            pub_cpu = pub[1].recv()[1]
        else:
            push(messages)
            pub_cpu = 0
        results = [pipe.recv() for _, pipe in subs]
        for _, pipe in subs:
            pipe.send("close")
        if pub is not None:
            pub[1].send("close")
    finally:
        for proc, _ in subs + ([pub] if pub else []):
            proc.join(10)
    elapsed = max(r[1] for r in results) or (time.perf_counter() - started)
    delivered = sum(r[0] for r in results)
    cpu = sum(r[2] for r in results) + pub_cpu
    return delivered / elapsed, delivered / (messages * subscribers), cpu / elapsed


def latencies(port, n):
    """p50 and p99 (ms) of QoS 1 publish-to-receive, one message at a time, 1 ms apart."""
    size = load.delivered_size(TOPIC, PAYLOAD, 1)
    sub = load.spawn(load.subscribe, port, 1, "latsub", TOPIC, 1, None, size)
    pub = load.spawn(load.publish, port, 1, "latpub", TOPIC, 1, PAYLOAD, None)
    try:
        sub[1].recv()
        pub[1].recv()
        sub[1].send(("time", n, 60))
        pub[1].send(("stamped", n, 0.001))
        pub[1].recv()
        lat, _ = sub[1].recv()
        for _, pipe in (sub, pub):
            pipe.send("close")
    finally:
        sub[0].join(10)
        pub[0].join(10)
    ms = sorted(x / 1e6 for x in lat)
    if not ms:
        return float("nan"), float("nan")
    return ms[len(ms) // 2], ms[min(len(ms) - 1, int(len(ms) * 0.99))]


ROWS = [("QoS 0 publish, 1 publisher", "msg/s"), ("QoS 0 publish, 100 publishers", "msg/s"),
        ("QoS 1 publish, 1 publisher", "msg/s"), ("QoS 1 publish, 100 publishers", "msg/s"),
        ("fan-out QoS 0 to 1,000 subscribers", "msg/s"), ("publish-to-receive p50 (QoS 1)", "ms"),
        ("publish-to-receive p99 (QoS 1)", "ms")]
FANOUT_ROW = ROWS[4][0]


def measure(port, args):
    """``{row: figure}`` and ``{row: generator CPU s/s}`` against the broker on ``port``."""
    figures, cpu = {}, {}
    for qos in (0, 1):
        for publishers in (1, 100):
            name = "QoS %d publish, %d publisher%s" % (qos, publishers, "s" if publishers > 1 else "")
            figures[name], cpu[name] = publish_rate(port, publishers, qos, args.messages)
    name = FANOUT_ROW
    rate, share, cpu[name] = fanout_rate(port, args.fanout_messages, args.subscribers)
    figures[name] = rate
    figures["fan-out delivered"] = share
    figures[ROWS[5][0]], figures[ROWS[6][0]] = latencies(port, args.latency_n)
    return figures, cpu


def ceiling(args):
    """The generator's own throughput against the stand-in broker, per throughput row."""
    out = {}
    for qos in (0, 1):
        sink = load.Sink(len(load.publish_packet(TOPIC, b"p" * PAYLOAD, qos)), qos)
        try:
            for publishers in (1, 100):
                name = "QoS %d publish, %d publisher%s" % (qos, publishers, "s" if publishers > 1 else "")
                out[name] = publish_rate(sink.port, publishers, qos, args.messages)[0]
        finally:
            sink.stop()
    sink = load.Sink(load.delivered_size(TOPIC, PAYLOAD, 0), 0)
    try:
        out[FANOUT_ROW] = fanout_rate(sink.port, args.fanout_messages, args.subscribers, push=sink.push)[0]
    finally:
        sink.stop()
    return out


def run(args):
    targets = [("metaq", lambda root: Metaq(root, "async")), ("metaq durable", lambda root: Metaq(root, "sync"))]
    if mosquitto_path():
        targets.insert(1, ("mosquitto", Mosquitto))
    results = {name: {} for name, _ in targets}
    cpus = {name: {} for name, _ in targets}
    ceilings = {}
    for r in range(args.runs):
        for name, make in targets:
            root = tempfile.mkdtemp(prefix="metaq-mqtt-bench-", dir=args.dir)
            target = make(root)
            try:
                figures, cpu = measure(target.port, args)
            finally:
                target.stop()
                shutil.rmtree(root, ignore_errors=True)
            for row, value in figures.items():
                results[name].setdefault(row, []).append(value)
            for row, value in cpu.items():
                cpus[name].setdefault(row, []).append(value)
            print("run %d %-14s %s" % (r + 1, name, " ".join("%.4g" % figures[row] for row, _ in ROWS)),
                  file=sys.stderr, flush=True)
        for row, value in ceiling(args).items():
            ceilings.setdefault(row, []).append(value)
    print_table(results, cpus, ceilings, [name for name, _ in targets], args)


def print_table(results, cpus, ceilings, names, args):
    med = statistics.median
    print()
    print("MQTT: metaq beside Mosquitto, %d-byte payloads, median of %d runs, brokers and generator on 127.0.0.1"
          % (PAYLOAD, args.runs))
    peer = "mosquitto" if "mosquitto" in names else None
    head = "%-38s %12s  %-6s" % ("measurement", "metaq", "unit")
    if peer:
        head += " %12s %7s" % (peer, "ratio")
    head += " %14s %7s %12s" % ("metaq durable", "ratio", "generator")
    print(head)
    print("-" * len(head))

    def ratio(mine, theirs, unit):
        return theirs / mine if unit == "ms" else mine / theirs

    for row, unit in ROWS:
        shown = row.replace("1,000", "{:,}".format(args.subscribers))
        ours, durable = med(results["metaq"][row]), med(results["metaq durable"][row])
        base = med(results[peer][row]) if peer else ours
        line = "%-38s %12s  %-6s" % (shown, fmt(ours), unit)
        if peer:
            line += " %12s %6.2fx" % (fmt(base), ratio(ours, base, unit))
        line += " %14s %6.2fx" % (fmt(durable), ratio(durable, base, unit))
        line += " %12s" % (fmt(med(ceilings[row])) if row in ceilings else "-")
        print(line)
    print("ratio: metaq (flush async; durable: flush sync) against %s in the same runs; < 1 means metaq is slower"
          % (peer or "metaq flush async"))
    print("generator: the load generator's own ceiling (against a stand-in broker that only answers)")
    print("fan-out share delivered: " + ", ".join("%s %.3f" % (n, med(results[n]["fan-out delivered"]))
                                                  for n in names))
    print("generator CPU s per s (2 = both cores) per row: " + "; ".join(
        "%s %s" % (n, " ".join("%.2f" % med(v) for v in cpus[n].values())) for n in names))


def fmt(x):
    if x != x:
        return "nan"
    if x >= 100:
        return "{:,.0f}".format(x)
    if x >= 1:
        return "%.2f" % x
    return "%.3f" % x


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--fanout-messages", type=int, default=200)
    p.add_argument("--latency-n", type=int, default=2000)
    p.add_argument("--subscribers", type=int, default=FANOUT_SUBSCRIBERS, help="the fan-out row's subscribers")
    p.add_argument("--dir", default=None, help="where to put metaq's data (default: $TMPDIR)")
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
