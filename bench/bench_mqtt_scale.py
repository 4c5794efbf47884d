"""MQTT connections at scale (issue 43 point 7).

    python -m bench.bench_mqtt_scale [--connections 19000] [--keep-alive 10] [--subscribers 10000] [--runs 3]
                                     [--fanout-only | --fleet-only | --storm-only] [--fleet-rate 2000]
                                     [--fleet-seconds 10] [--storm-gap 10]
                                     [--no-mosquitto]

Against a real metaq broker process on 127.0.0.1 (MQTT port on, flush async, the real segment sizes), with the load
generator of ``bench/mqtt_load.py`` in processes of its own (the machine's descriptor limit is 20,000 per process:
the broker holds one side of every connection, each generator process at most half of the other), connections
spread over the source addresses 127.0.0.2-127.0.0.9 (the broker caps connections per address):

* **connect rate**: ``--connections`` MQTT 3.1.1 connections opened by two processes at once, each CONNECT answered
  (256 in flight per process), connections per second;
* **keep-alive honoured**: each connection's Keep Alive is ``--keep-alive`` s; each sends a PINGREQ every half of it
  for twice as long, and the broker must answer every one and close none (it closes one silent for 1.5 x);
* **memory per idle connection**: the broker's anonymous resident memory (its heap) with every connection open and
  idle, minus before, divided by their number (target: <= 8 KiB);
* **fan-out latency**: ``--subscribers`` QoS 0 subscribers of one topic; one publisher sends ``--fanout-messages``
  stamped QoS 0 messages 2 s apart; p50 / p99 / max of publish-to-receive over every delivery, and the memory per
  subscribed connection.

* **a fleet's publishes**: ``--connections`` connections held open again, then ``--fleet-rate`` QoS 1 PUBLISHes a
  second for ``--fleet-seconds``, each from the next connection in turn, so each arrives alone on a connection idle
  since its last, as a device fleet's do: the broker's CPU per message (less what the idle fleet costs it over the
  same time) and send-to-PUBACK p50 / p99, against Mosquitto too.

* **a storm of half packets**: ``--connections`` connections held open and parked, then every one sends the first
  byte of a PINGREQ at once and the second ``--storm-gap`` s later (under the request deadline): each wakes and holds
  its reader while it waits inside the packet. The broker's memory per connection so held (above parked) and once
  answered, its CPU per connection woken, a PINGREQ's round trip from another MQTT client (and a text client's
  ``stats`` on metaq: the loop's responsiveness) before and during, the PINGRESPs and any connection closed.

``--fanout-only`` skips the idle connections, the storm and the fleet (then the memory per subscribed connection is
the whole connection's, not what a subscription adds to an idle one); ``--fleet-only`` runs only the fleet,
``--storm-only`` only the storm; ``--no-mosquitto`` skips Mosquitto's runs. Not a test: nothing here asserts;
medians of ``--runs`` runs, a markdown table.
"""

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import mqtt_load as load  # noqa: E402
from bench.bench_backlog import rss  # noqa: E402
from bench.bench_mqtt import Metaq, Mosquitto, cpu_seconds, mosquitto_path  # noqa: E402

TOPIC = "fan/out"
PAYLOAD = 64
SOURCES = ["127.0.0.%d" % i for i in range(2, 10)]
PROCS = 2
FLEET_KEEP_ALIVE = 60  # a device's usual Keep Alive: the fleet's connections stay silent between their messages


def broker_connections(target):
    with target.broker.client() as c:
        return int(c.stats_dict()["mqtt_connections"])


def wait_connections(target, want, timeout=60):
    deadline = time.monotonic() + timeout
    have = broker_connections(target)
    while have != want and time.monotonic() < deadline:
        time.sleep(0.2)
        have = broker_connections(target)
    return have


def idle_phase(target, n, keep_alive):
    """Connect rate, memory per idle connection, the keep-alive round; ``dict`` of figures."""
    time.sleep(1)
    before = rss(target.pid)[0]
    halves = [SOURCES[i::PROCS] for i in range(PROCS)]
    started = time.perf_counter()
    workers = [load.spawn(load.hold, target.port, n // PROCS + (i < n % PROCS), "idle%d" % i, keep_alive, halves[i])
               for i in range(PROCS)]
    try:
        [pipe.recv() for _, pipe in workers]
        connect_s = time.perf_counter() - started
        seen = wait_connections(target, n)
        time.sleep(2)
        after = rss(target.pid)[0]
        for _, pipe in workers:
            pipe.send(("ping", 2 * keep_alive, keep_alive / 2))
        pings = [pipe.recv() for _, pipe in workers]
        still = broker_connections(target)
        for _, pipe in workers:
            pipe.send("close")
    finally:
        for proc, _ in workers:
            proc.join(30)
    wait_connections(target, 0)
    return {"connect_rate": n / connect_s, "seen": seen, "per_conn_kib": (after - before) * 1024 / n,
            "pings_sent": sum(p[0] for p in pings), "pings_answered": sum(p[1] for p in pings),
            "closed_by_broker": sum(p[2] for p in pings), "open_after_pings": still}


def fanout_phase(target, subscribers, messages):
    """Publish-to-receive over ``subscribers`` QoS 0 subscribers of ``target`` (metaq or Mosquitto); ``dict`` of
    figures."""
    time.sleep(1)
    before = rss(target.pid)[0]
    size = load.delivered_size(TOPIC, PAYLOAD, 0)
    halves = [SOURCES[i::PROCS] for i in range(PROCS)]
    subs = [load.spawn(load.subscribe, target.port, subscribers // PROCS + (i < subscribers % PROCS), "fan%d" % i,
                       TOPIC, 0, halves[i], size) for i in range(PROCS)]
    pub = load.spawn(load.publish, target.port, 1, "fanpub", TOPIC, 0, PAYLOAD, None)
    settled = []
    lat = load.stamped_round(subs, pub, messages, 2.0, lambda: settled.append(rss(target.pid)[0]))
    after = settled[0]
    if isinstance(target, Metaq):
        wait_connections(target, 0)
    ms = sorted(x / 1e6 for x in lat)
    return {"delivered": len(ms) / (subscribers * messages), "p50": ms[len(ms) // 2],
            "p99": ms[min(len(ms) - 1, int(len(ms) * 0.99))], "max": ms[-1],
            "per_sub_kib": (after - before) * 1024 / subscribers}


def fleet_phase(target, n, keep_alive, rate, seconds):
    """A device fleet's traffic: ``n`` connections held open (as ``idle_phase``), then ``rate`` QoS 1 PUBLISHes a
    second for ``seconds``, each from the next connection in turn, so each arrives alone on a connection idle since
    its last (on metaq, parked); the broker's CPU per message over that window (less what the same window costs
    idle, measured just before) and send-to-PUBACK p50 / p99; ``dict`` of figures."""
    halves = [SOURCES[i::PROCS] for i in range(PROCS)]
    workers = [load.spawn(load.hold, target.port, n // PROCS + (i < n % PROCS), "fleet%d" % i, keep_alive,
                          halves[i]) for i in range(PROCS)]
    try:
        [pipe.recv() for _, pipe in workers]
        time.sleep(2)
        used = cpu_seconds(target.pid)
        time.sleep(seconds)
        idle = cpu_seconds(target.pid) - used
        count = int(rate * seconds)
        used = cpu_seconds(target.pid)
        for i, (_, pipe) in enumerate(workers):
            pipe.send(("fleet", rate / PROCS, count // PROCS + (i < count % PROCS), TOPIC, PAYLOAD))
        replies = [pipe.recv() for _, pipe in workers]
        used = cpu_seconds(target.pid) - used
        for _, pipe in workers:
            pipe.send("close")
    finally:
        for proc, _ in workers:
            proc.join(30)
    acked = sum(r[0] for r in replies)
    ms = sorted(x / 1e6 for r in replies for x in r[1])
    return {"fleet_acked": acked / count, "fleet_cpu_us": max(0.0, used - idle) / count * 1e6,
            "fleet_p50": ms[len(ms) // 2] if ms else float("nan"),
            "fleet_p99": ms[min(len(ms) - 1, int(len(ms) * 0.99))] if ms else float("nan")}


class Probe(threading.Thread):
    """Round trips of ``ask()`` one after another, ``every`` s apart, in a thread of their own, each with when it
    began: what another client of the broker sees while the storm's connections take the loop."""

    def __init__(self, ask, every=0.02):
        super().__init__(daemon=True)
        self.ask, self.every = ask, every
        self.samples = []  # (perf_counter when sent, seconds to the answer)
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            t = time.perf_counter()
            try:
                self.ask()
            except Exception:  # noqa: BLE001 - a probe that failed shows as an infinite round trip, and ends
                self.samples.append((t, float("inf")))
                return
            self.samples.append((t, time.perf_counter() - t))
            self.done.wait(self.every)

    def between(self, start, end):
        return sorted(x for t, x in self.samples if start <= t < end)

    def stop(self):
        self.done.set()
        self.join(10)


def ping_probe(port):
    """A probe's ``ask``: a PINGREQ and its PINGRESP on an MQTT connection of its own (from 127.0.0.1, an address the
    held connections do not use); returns ``(ask, close)``."""
    sock = load.open_connections(port, 1, "probe", 600)[0]

    def ask():
        sock.sendall(load.PINGREQ)
        if load.recv_exact(sock, 2) != load.PINGRESP:
            raise ConnectionError("expected PINGRESP")
    return ask, sock.close


def _quantile(xs, q):
    return xs[min(len(xs) - 1, int(len(xs) * q))] if xs else float("nan")


#: The gap of the storm run again on the same connections (``storm_phase``): only its memory after is measured.
AGAIN_GAP_S = 3


def storm_phase(target, n, gap, wait=60):
    """``n`` connections held open and parked (Keep Alive 60 s), then each sends the first byte of a PINGREQ at once
    and its second ``gap`` seconds later: the broker's memory per connection so held (above parked) and after they
    are answered, its CPU per connection to wake them, a PINGREQ's round trip from another MQTT connection (and on
    metaq a text client's ``stats``) before and during, the PINGRESPs received and the connections closed; then the
    storm once more on the same connections, and what the broker's memory grew by over the first's; ``dict`` of
    figures."""
    halves = [SOURCES[i::PROCS] for i in range(PROCS)]
    workers = [load.spawn(load.hold, target.port, n // PROCS + (i < n % PROCS), "storm%d" % i, FLEET_KEEP_ALIVE,
                          halves[i]) for i in range(PROCS)]
    probes, closers = [], []
    try:
        [pipe.recv() for _, pipe in workers]
        if isinstance(target, Metaq):
            wait_connections(target, n)
            stats = target.broker.client()
            probes.append(("stats", Probe(lambda: stats.stats_dict())))
            closers.append(stats.close)
        ask, close = ping_probe(target.port)
        probes.append(("ping", Probe(ask)))
        closers.append(close)
        time.sleep(2)  # every held connection parked (metaq: idle for MQTT_PARK_AFTER_S)
        for _, probe in probes:
            probe.start()
        cpu0, t0 = cpu_seconds(target.pid), time.perf_counter()
        time.sleep(2)
        idle_cpu_s = (cpu_seconds(target.pid) - cpu0) / (time.perf_counter() - t0)
        before = rss(target.pid)[0]
        started, cpu0 = time.perf_counter(), cpu_seconds(target.pid)
        for _, pipe in workers:
            pipe.send(("storm", gap, wait))
        firsts = [pipe.recv() for _, pipe in workers]
        peak = before
        while time.perf_counter() < started + gap - 0.3:
            peak = max(peak, rss(target.pid)[0])
            time.sleep(0.25)
        woke_cpu = cpu_seconds(target.pid) - cpu0 - idle_cpu_s * (time.perf_counter() - started)
        ended = time.perf_counter()
        replies = [pipe.recv() for _, pipe in workers]
        time.sleep(2)
        after = rss(target.pid)[0]
        for _, probe in probes:
            probe.stop()
        # a second storm on the same connections: what the first left behind is reused, not added to
        for _, pipe in workers:
            pipe.send(("storm", AGAIN_GAP_S, wait))
        [pipe.recv() for _, pipe in workers]
        again = [pipe.recv() for _, pipe in workers]
        time.sleep(2)
        after_again = rss(target.pid)[0]
        for _, pipe in workers:
            pipe.send("close")
    finally:
        for close in closers:
            close()
        for proc, _ in workers:
            proc.join(30)
    if isinstance(target, Metaq):
        wait_connections(target, 0)
    first, second, answered, early, late, answer_s, early_bytes = (sum(r[i] for r in replies) for i in range(7))
    figures = {"storm_first": sum(firsts), "storm_second": second, "storm_answered": answered / n,
               "storm_closed_early": early, "storm_closed_late": late, "storm_early_bytes": early_bytes,
               "storm_answer_s": max(r[5] for r in replies), "storm_held_kib": (peak - before) * 1024 / n,
               "storm_after_kib": (after - before) * 1024 / n, "storm_cpu_us": max(0.0, woke_cpu) / n * 1e6,
               "storm_again_kib": (after_again - after) * 1024 / n,
               "storm_again_answered": sum(r[2] for r in again) / n}
    for name, probe in probes:
        quiet = probe.between(0, started)
        during = probe.between(started, ended)
        figures.update({"storm_%s_before_p50" % name: _quantile(quiet, 0.5) * 1e3,
                        "storm_%s_p50" % name: _quantile(during, 0.5) * 1e3,
                        "storm_%s_max" % name: (during[-1] if during else float("nan")) * 1e3})
    return figures


def one_run(args):
    root = tempfile.mkdtemp(prefix="metaq-mqtt-scale-", dir=args.dir)
    target = Metaq(root, "async")
    try:
        figures = {}
        if args.storm_only:
            figures.update(storm_phase(target, args.connections, args.storm_gap))
        if not args.fanout_only and not args.fleet_only and not args.storm_only:
            figures.update(idle_phase(target, args.connections, args.keep_alive))
            figures.update(storm_phase(target, args.connections, args.storm_gap))
        if not args.fanout_only and not args.storm_only:
            figures.update(fleet_phase(target, args.connections, FLEET_KEEP_ALIVE, args.fleet_rate, args.fleet_seconds))
        if not args.fleet_only and not args.storm_only:
            figures.update(fanout_phase(target, args.subscribers, args.fanout_messages))
    finally:
        target.stop()
    # the same fan-out and fleet against Mosquitto, in the same run: the floor the kernel's sends set
    if mosquitto_path() and not args.no_mosquitto:
        peer = Mosquitto(root)
        try:
            if not args.fanout_only and not args.fleet_only:
                figures.update({"mosquitto_" + k: v for k, v in storm_phase(
                    peer, args.connections, args.storm_gap).items()})
            if not args.fanout_only and not args.storm_only:
                figures.update({"mosquitto_" + k: v for k, v in fleet_phase(
                    peer, args.connections, FLEET_KEEP_ALIVE, args.fleet_rate, args.fleet_seconds).items()})
            if not args.fleet_only and not args.storm_only:
                figures.update({"mosquitto_" + k: v for k, v in fanout_phase(peer, args.subscribers,
                                                                               args.fanout_messages).items()})
        finally:
            peer.stop()
    shutil.rmtree(root, ignore_errors=True)
    print("run: " + ", ".join("%s %.4g" % kv for kv in figures.items()), file=sys.stderr, flush=True)
    return figures


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=19_000)
    ap.add_argument("--keep-alive", type=int, default=10)
    ap.add_argument("--subscribers", type=int, default=10_000)
    ap.add_argument("--fanout-messages", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--fanout-only", action="store_true", help="skip the idle connections' part")
    ap.add_argument("--fleet-only", action="store_true", help="only the fleet's publishes")
    ap.add_argument("--fleet-rate", type=int, default=2000, help="the fleet's PUBLISHes a second")
    ap.add_argument("--fleet-seconds", type=int, default=10)
    ap.add_argument("--storm-only", action="store_true",
                    help="only the storm: every parked connection sends half a PINGREQ at once")
    ap.add_argument("--storm-gap", type=float, default=10.0,
                    help="seconds between the storm's first bytes and their second (under request_timeout_s)")
    ap.add_argument("--no-mosquitto", action="store_true", help="skip Mosquitto's runs")
    ap.add_argument("--dir", default=None, help="where to put the data (default: $TMPDIR)")
    args = ap.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < args.connections // PROCS + 200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, args.connections // PROCS + 400), hard))
    runs = [one_run(args) for _ in range(args.runs)]

    def med(key):
        return statistics.median(r[key] for r in runs)

    print("\nMQTT at scale: one metaq broker (flush async), generator in %d processes, medians of %d runs\n"
          % (PROCS, args.runs))
    if not args.fanout_only and not args.fleet_only and not args.storm_only:
        print("| measurement | figure | unit |")
        print("|---|---:|---|")
        print("| connections open at once (seen by the broker) | %d | connections |" % med("seen"))
        print("| connect rate (CONNECT to CONNACK, 2 x 256 in flight) | %.0f | conn/s |" % med("connect_rate"))
        print("| broker memory per idle connection (target <= 8) | %.1f | KiB |" % med("per_conn_kib"))
        print("| keep-alive %d s: PINGREQs sent / answered over %d s | %d / %d | pings |"
              % (args.keep_alive, 2 * args.keep_alive, med("pings_sent"), med("pings_answered")))
        print("| connections the broker closed during the pings / open after | %d / %d | connections |"
              % (med("closed_by_broker"), med("open_after_pings")))
    peer = any(k in runs[0] for k in ("mosquitto_p50", "mosquitto_fleet_p50", "mosquitto_storm_answered"))

    def beside(key, form):
        theirs = "mosquitto_" + key
        return (form % med(key)) + (" | " + (form % med(theirs) if theirs in runs[0] else "-") if peer else "")

    def pair(key, other, form, other_form):
        theirs = "mosquitto_" + key
        mine = (form % med(key)) + " / " + (other_form % med(other))
        if not peer:
            return mine
        return mine + " | " + ((form % med(theirs)) + " / " + (other_form % med("mosquitto_" + other))
                               if theirs in runs[0] else "-")

    if not args.fanout_only and not args.fleet_only:
        print("\n| a storm: %d parked connections each send a PINGREQ's first byte at once, the second %g s later "
              "| metaq |%s unit |" % (args.connections, args.storm_gap, " Mosquitto |" if peer else ""))
        print("|---|---:|%s---|" % ("---:|" if peer else ""))
        print("| broker memory per connection held inside a packet (above parked) | %s | KiB |"
              % beside("storm_held_kib", "%.1f"))
        print("| broker memory per connection once answered (above parked) | %s | KiB |"
              % beside("storm_after_kib", "%.1f"))
        print("| the same storm again on the same connections: memory per connection after, above the first's | %s "
              "| KiB |" % beside("storm_again_kib", "%.1f"))
        print("| broker CPU per connection woken by its first byte (less idle) | %s | us |"
              % beside("storm_cpu_us", "%.0f"))
        print("| another client's PINGREQ round trip before, p50 | %s | ms |" % beside("storm_ping_before_p50", "%.2f"))
        print("| the same during the storm, p50 / max | %s | ms |"
              % pair("storm_ping_p50", "storm_ping_max", "%.2f", "%.1f"))
        print("| a text client's `stats` round trip before, p50 | %s | ms |"
              % beside("storm_stats_before_p50", "%.2f"))
        print("| the same during the storm, p50 / max | %s | ms |"
              % pair("storm_stats_p50", "storm_stats_max", "%.2f", "%.1f"))
        print("| share answered with a PINGRESP once whole, first storm / second | %s | |"
              % pair("storm_answered", "storm_again_answered", "%.3f", "%.3f"))
        print("| second byte to the last PINGRESP | %s | s |" % beside("storm_answer_s", "%.2f"))
        print("| connections closed before their second byte / after it | %s | connections |"
              % pair("storm_closed_early", "storm_closed_late", "%d", "%d"))
    if args.storm_only:
        return

    if not args.fanout_only and not args.storm_only:
        print("\n| a fleet: %d connections, %d QoS 1 PUBLISHes a second, each from the next connection | metaq |%s "
              "unit |" % (args.connections, args.fleet_rate, " Mosquitto |" if peer else ""))
        print("|---|---:|%s---|" % ("---:|" if peer else ""))
        print("| broker CPU per message (less the idle fleet's) | %s | us |" % beside("fleet_cpu_us", "%.0f"))
        print("| send-to-PUBACK p50 | %s | ms |" % beside("fleet_p50", "%.3f"))
        print("| send-to-PUBACK p99 | %s | ms |" % beside("fleet_p99", "%.3f"))
        print("| share acknowledged | %s | |" % beside("fleet_acked", "%.3f"))
    if args.fleet_only:
        return
    print("\n| fan-out to %d QoS 0 subscribers (one publisher, %d messages 2 s apart) | metaq |%s unit |"
          % (args.subscribers, args.fanout_messages, " Mosquitto |" if peer else ""))
    print("|---|---:|%s---|" % ("---:|" if peer else ""))
    print("| publish-to-receive p50 | %s | ms |" % beside("p50", "%.1f"))
    print("| publish-to-receive p99 | %s | ms |" % beside("p99", "%.1f"))
    print("| publish-to-receive max | %s | ms |" % beside("max", "%.1f"))
    print("| share delivered | %s | |" % beside("delivered", "%.3f"))
    print("| broker memory per subscribed connection | %s | KiB |" % beside("per_sub_kib", "%.1f"))


if __name__ == "__main__":
    main()
