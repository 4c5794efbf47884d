"""The MQTT cluster as it grows: 1, 2 and 4 brokers of one ZooKeeper root on this machine (issue 56 point 7).

    .venv/bin/python -m bench.bench_cluster [--brokers 1 2 4] [--runs 3] [--devices 2000]
                                            [--seconds 5] [--subscribers 2000] [--messages 20]
    .venv/bin/python -m bench.bench_cluster --paths-only --brokers 2 [--messages 200] [--cpu-messages 5000]
    .venv/bin/python -m bench.bench_cluster --fanout-only --brokers 1 2 4 --subscribers 10000 [--messages 10]
    .venv/bin/python -m bench.bench_cluster --held 100000 [--held-brokers 8] [--held-keep-alive 300]
                                            [--held-seconds 60] [--held-every 30]
    .venv/bin/python -m bench.bench_cluster --reconnect 100000 --brokers 1 4 [--runs 3]

Each cluster is N broker processes (broker ids 0..N-1, ``flush: async``, the real segment sizes) registered under
one ZooKeeper (Debian's package, started by ``tests/harness/zookeeper.py`` as ``bench_failover`` does). Rows, each
the median of ``--runs`` runs, in one markdown table:

* **device publishes/s**: ``--devices`` MQTT connections spread evenly over the brokers, one generator process per
  broker, each connection a device publishing QoS 1 messages one at a time (its next once the last is
  acknowledged, so each arrives alone in a read, as a fleet's do, however busy the broker is); enough devices to
  keep the brokers busy. The figure is the messages acknowledged over ``--seconds`` (no more than the brokers'
  ``stats`` ``total_messages`` grew) per second, and its ratio to the smallest cluster of the same run.
* **publish-to-receive p50 / p99 (ms)**: one QoS 1 subscriber of ``lat/#`` on broker 0; ``--messages`` stamped QoS 1
  publishes on broker 0 (same broker), then on the last broker (across brokers: the cluster's routes).
* **fan-out**: ``--subscribers`` QoS 0 subscribers of one topic spread over the brokers, one publisher on broker 0:
  the share delivered and publish-to-receive p50 / p99.

``--paths-only`` runs a message's path alone, on one broker and across two: publish-to-receive p50 / p99 (as
above) and the brokers' CPU per message (``--cpu-messages`` QoS 1 publishes, 64 in flight, to one QoS 1 subscriber on
broker 0; all brokers' CPU together, divided by the messages delivered).

``--fanout-only`` runs the fan-out alone over each cluster size (its own table): the latency on the publisher's
broker and on the others apart, and the brokers' CPU with no client at all (each broker's timers and its links to
every other: N x (N - 1) links).

``--held`` holds that many connections (Keep Alive ``--held-keep-alive`` s) over ``--held-brokers`` brokers, one
generator process per broker (the open-file cap is 20,000 per process: 100,000 over 8 brokers is 12,500 a
process on each side), each from eight source addresses of its own (127.0.<10+i>.2-9, so that no address runs out
of ephemeral ports): the connect rate (a CONNECT registers its client id with its home broker, 7 in 8 of them a
call to another broker), the connections each broker saw, its heap before and with them, and the brokers' CPU
with no client, while every connection sends a PINGREQ every ``--held-every`` s for ``--held-seconds``, and held
idle after.

``--reconnect`` has that many devices with persistent sessions (Clean Start 0) connect once, spread evenly over the
brokers (their client ids' homes spread over them by the hash), leave, and come back at once to the same broker,
each cluster size of ``--brokers`` in turn in every run: the connects a second of the whole wave back (its last
CONNACK), each wave from ``RECONNECT_PROCS`` generator processes (more for a larger cluster or past
``RECONNECT_PER_PROC`` each, a multiple of the brokers), the connections each broker held once the wave was back,
and its ratio to the smallest cluster of the run; how many of the wave's CONNACKs said Session Present (each
device's session kept: ``mqtt.max_offline_sessions`` is raised to the devices), and how many connections a broker
closed in the ``RECONNECT_HELD_S`` after the wave (a client id's home not reached in time closes them). A broker
holds at most its open-files limit's connections: 100,000 devices need a hard limit past 100,000 for one broker
alone, past 25,000 a broker over 4 (``ulimit -Hn``).

``--leave`` has that many devices with persistent sessions connect, spread evenly over the brokers, and half of each
broker's leave at once while the other half stays ``RECONNECT_HELD_S``: how many of those that stayed a broker
closed, and the closes for a client id's home not reached (``mqtt_cluster_lease_closed``): a broker whose loop the
leaving devices held up past its lease's slack closes the connections of the ids homed elsewhere; and the worst
``loop_lag_ms`` of the brokers at the end (how late a loop ran queued work, over the last minute). ``--lease`` sets
the brokers' ``mqtt.cluster_id_lease_s``.

The generator runs on the same cores as the brokers: each row also gives the generators' CPU seconds a second, so
a ratio that a busy generator held down can be told apart. Not a test: nothing here asserts.
"""

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import mqtt_load as load  # noqa: E402
from bench.bench_backlog import rss  # noqa: E402
from bench.bench_mqtt import cpu_seconds  # noqa: E402
from bench.configs import full_size_store  # noqa: E402
from metaq.client.local import BrokerProcess, free_port, small_config  # noqa: E402
from tests.harness.zookeeper import ZooKeeperProcess  # noqa: E402

PAYLOAD = 64
#: Seconds a broker is given to stop (SIGTERM) before it is killed.
STOP_S = 120
FLEET_KEEP_ALIVE = 60
SOURCES = ["127.0.0.%d" % i for i in range(2, 10)]
#: Subscriber processes of a fan-out at least (one per broker past it), so that the generator's share of the cores
#: is alike for every cluster size.
FANOUT_PROCS = 4


class Cluster:
    """``n`` brokers of one ZooKeeper root, each with its MQTT and replication ports."""

    def __init__(self, root, zk_connect, n, mqtt=None):
        self.brokers = []
        for i in range(n):
            wd = os.path.join(root, "b%d" % i)
            os.makedirs(wd, exist_ok=True)
            cfg = small_config(os.path.join(wd, "data"), broker={"id": i}, store=full_size_store(flush="async"),
                               topics=[{"name": "*", "partitions": 4}],
                               mqtt={"port": free_port(), **(mqtt or {})}, replication={"port": free_port()},
                               zk={"connect": zk_connect, "root": "/metaq-bench-%d-%d-%s" % (
                                   n, os.getpid(), os.path.basename(root))})  # a root each: no epoch of the last
            self.brokers.append(BrokerProcess(wd, cfg))
        for b in self.brokers:
            b.start(timeout=120)

    def mqtt_port(self, i):
        return self.brokers[i].config["mqtt"]["port"]

    def connections(self, i):
        with self.brokers[i].client() as c:
            return int(c.stats_dict()["mqtt_connections"])

    def stored(self):
        total = 0
        for b in self.brokers:
            with b.client() as c:
                total += int(c.stats_dict()["total_messages"])
        return total

    def stats(self, i, keys):
        """``{key: int}`` of broker ``i``'s ``stats`` (a broker busy past the client's timeout: tried again)."""
        for _ in range(10):
            try:
                with self.brokers[i].client() as c:
                    s = c.stats_dict()
                return {k: int(float(s.get(k, 0))) for k in keys}
            except OSError:
                time.sleep(1)
        raise TimeoutError("broker %d did not answer stats" % i)

    def stop(self):
        """Every broker told to stop at once, each waited for (killed, said so, past STOP_S)."""
        for b in self.brokers:
            if b.proc.poll() is None:
                b.proc.send_signal(signal.SIGTERM)
        for i, b in enumerate(self.brokers):
            try:
                b.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                print("broker %d did not stop within %d s: killed" % (i, STOP_S), file=sys.stderr)
                b.kill()


def device_publishes(cluster, devices, seconds):
    """Messages a second ``devices`` devices publishing one at a time got acknowledged (and the brokers stored);
    the generators' CPU seconds a second."""
    n = len(cluster.brokers)
    workers = [load.spawn(load.hold, cluster.mqtt_port(i), devices // n, "dev%d-" % i, FLEET_KEEP_ALIVE,
                          SOURCES[i::n] or SOURCES) for i in range(n)]
    try:
        [pipe.recv() for _, pipe in workers]
        time.sleep(1)
        before, cpu0, started = cluster.stored(), _cpu(workers), time.perf_counter()
        for _, pipe in workers:
            pipe.send(("devices", seconds, "dev/up", PAYLOAD))
        acked = sum(pipe.recv() for _, pipe in workers)
        elapsed = time.perf_counter() - started
        stored = cluster.stored() - before
        cpu = _cpu(workers) - cpu0
        for _, pipe in workers:
            pipe.send("close")
    finally:
        for proc, _ in workers:
            proc.join(30)
    return min(stored, acked) / seconds, cpu / elapsed


def _cpu(workers):
    return sum(cpu_seconds(proc.pid) for proc, _ in workers)


def latency(cluster, publisher, messages):
    """p50 / p99 ms of ``messages`` stamped QoS 1 publishes on broker ``publisher`` to a subscriber on broker 0
    (None: nothing arrived)."""
    size = load.delivered_size("lat/x", PAYLOAD, 1)
    sub = load.spawn(load.subscribe, cluster.mqtt_port(0), 1, "latsub", "lat/#", 1, None, size)
    pub = load.spawn(load.publish, cluster.mqtt_port(publisher), 1, "latpub", "lat/x", 1, PAYLOAD, None)
    try:
        for _, pipe in (sub, pub):
            if pipe.recv() != "ready":
                raise RuntimeError("a generator did not connect")
        time.sleep(1)  # the subscription reaches the other brokers' routes
        sub[1].send(("time", messages, 10 + messages))
        pub[1].send(("stamped", messages, 0.05))
        pub[1].recv()
        got = sub[1].recv()[0]
        for _, pipe in (sub, pub):
            pipe.send("close")
    finally:
        for proc, _ in (sub, pub):
            proc.join(30)
    ms = sorted(x / 1e6 for x in got)
    if not ms:
        return None
    return ms[len(ms) // 2], ms[min(len(ms) - 1, int(len(ms) * 0.99))]


def cpu_per_message(cluster, publisher, messages):
    """The brokers' CPU (µs, all of them together) per message of ``messages`` QoS 1 publishes (at most 64 in
    flight) on broker ``publisher`` to one QoS 1 subscriber on broker 0 (None: nothing arrived)."""
    size = load.delivered_size("cpu/x", PAYLOAD, 1)
    pids = [b.proc.pid for b in cluster.brokers]
    sub = load.spawn(load.subscribe, cluster.mqtt_port(0), 1, "cpusub", "cpu/#", 1, None, size)
    pub = load.spawn(load.publish, cluster.mqtt_port(publisher), 1, "cpupub", "cpu/x", 1, PAYLOAD, None)
    try:
        for _, pipe in (sub, pub):
            if pipe.recv() != "ready":
                raise RuntimeError("a generator did not connect")
        time.sleep(1)  # the subscription reaches the other brokers' routes
        cpu0 = sum(cpu_seconds(pid) for pid in pids)
        sub[1].send(("count", messages, 30 + messages / 1000))
        pub[1].send(("go", messages, 64))
        pub[1].recv()
        delivered = sub[1].recv()[0]
        cpu = sum(cpu_seconds(pid) for pid in pids) - cpu0
        for _, pipe in (sub, pub):
            pipe.send("close")
    finally:
        for proc, _ in (sub, pub):
            proc.join(30)
    return cpu / delivered * 1e6 if delivered else None


def paths_run(root, zk, n, args):
    """A message's path alone (``--paths-only``) on a cluster of ``n``: publish-to-receive latency and the brokers'
    CPU per message, publisher and subscriber on one broker, then on two."""
    cluster = Cluster(os.path.join(root, "p%d-%d" % (n, time.monotonic_ns())), zk.connect, n)
    try:
        out = {"same": latency(cluster, 0, args.messages), "same_cpu": cpu_per_message(cluster, 0, args.cpu_messages)}
        if n > 1:
            out["across"] = latency(cluster, n - 1, args.messages)
            out["across_cpu"] = cpu_per_message(cluster, n - 1, args.cpu_messages)
    finally:
        cluster.stop()
    return out


def print_paths(args, results):
    print()
    print("a message's path: %d stamped QoS 1 messages 50 ms apart (latency), %d QoS 1 messages 64 in flight (the "
          "brokers' CPU per message, all brokers together); medians of %d runs; %d cores"
          % (args.messages, args.cpu_messages, args.runs, os.cpu_count()))
    print()
    print("| brokers | same broker p50 / p99 ms | across brokers p50 / p99 ms | CPU µs/message same broker | across "
          "brokers | across / same |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in args.brokers:
        rows = results[n]
        same = _median([r["same_cpu"] for r in rows])
        across = _median([r.get("across_cpu") for r in rows])
        print("| %d | %s | %s | %s | %s | %s |" % (
            n, _ms([r["same"] for r in rows]), _ms([r.get("across") for r in rows]),
            "-" if same is None else "%.0f" % same, "-" if across is None else "%.0f" % across,
            "-" if None in (same, across) else "%.2fx" % (across / same)))


def fanout(cluster, subscribers, messages):
    """Share delivered and p50 / p99 ms of ``messages`` stamped QoS 0 publishes on broker 0 to ``subscribers``
    spread over every broker, over all of them, and over those on broker 0 and on the others apart ((None, None)
    when none)."""
    n = len(cluster.brokers)
    procs = -(-FANOUT_PROCS // n) * n  # as many subscriber processes whatever the cluster's size, a multiple of it
    size = load.delivered_size("fan/out", PAYLOAD, 0)
    subs = []
    for j in range(procs):  # one process's CONNECTs at a time: the setup is no reconnect storm
        subs.append(load.spawn(load.subscribe, cluster.mqtt_port(j % n), subscribers // procs, "fan%d-" % j,
                               "fan/out", 0, SOURCES[j::procs] or SOURCES, size))
        if not subs[-1][1].poll(300) or subs[-1][1].recv() != "ready":
            raise RuntimeError("a fan-out subscriber did not connect")
    pub = load.spawn(load.publish, cluster.mqtt_port(0), 1, "fanpub", "fan/out", 0, PAYLOAD, None)
    lat = load.stamped_round(subs, pub, messages, 1.0, by_worker=True, ready=subs)
    want = (subscribers // procs) * procs * messages
    return (sum(len(x) for x in lat) / want, _quantiles([x for w in lat for x in w]),
            _quantiles([x for j, w in enumerate(lat) if j % n == 0 for x in w]),
            _quantiles([x for j, w in enumerate(lat) if j % n for x in w]))


def _quantiles(ns):
    """p50 / p99 ms of latencies in ns; None when there are none."""
    ms = sorted(x / 1e6 for x in ns)
    if not ms:
        return None
    return ms[len(ms) // 2], ms[min(len(ms) - 1, int(len(ms) * 0.99))]


def held(cluster, connections, keep_alive, seconds, every):
    """``connections`` MQTT connections (Keep Alive ``keep_alive`` s) spread evenly over the brokers and held, one
    generator process per broker (each under the open-file cap, from source addresses of its own): the connect rate
    (each CONNECT registers its client id with its home broker), the connections each broker saw, each broker's heap
    (RssAnon MB) before and with them open, the brokers' CPU seconds a second while each connection sends a PINGREQ
    every ``every`` s for ``seconds`` (the pings sent and answered, the connections any broker closed), then the
    same with them idle; ``dict`` of figures."""
    n = len(cluster.brokers)
    pids = [b.proc.pid for b in cluster.brokers]
    time.sleep(2)
    before = [rss(pid)[0] for pid in pids]
    empty_cpu = _cpu_rate(pids, 5)
    started = time.perf_counter()
    workers = [load.spawn(load.hold, cluster.mqtt_port(i), connections // n + (i < connections % n), "held%d-" % i,
                          keep_alive, held_sources(i)) for i in range(n)]
    try:
        [pipe.recv() for _, pipe in workers]
        connect_s = time.perf_counter() - started
        seen = [cluster.connections(i) for i in range(n)]
        after = [rss(pid)[0] for pid in pids]
        cpu0, t0 = sum(cpu_seconds(pid) for pid in pids), time.perf_counter()
        for _, pipe in workers:
            pipe.send(("ping", seconds, every))
        pings = [pipe.recv() for _, pipe in workers]
        ping_s = time.perf_counter() - t0
        busy = (sum(cpu_seconds(pid) for pid in pids) - cpu0) / ping_s
        idle = _cpu_rate(pids, min(seconds, keep_alive / 2))
        still = [cluster.connections(i) for i in range(n)]
        for _, pipe in workers:
            pipe.send("close")
    finally:
        for proc, _ in workers:
            proc.join(60)
    sent, answered, closed = (sum(p[k] for p in pings) for k in range(3))
    return {"seen": sum(seen), "per_broker": seen, "connect_rate": connections / connect_s,
            "rss_before": before, "rss_after": after, "empty_cpu": empty_cpu, "idle_cpu": idle, "ping_cpu": busy,
            "pings": sent, "answered": answered, "closed": closed, "open_after": sum(still),
            "ping_us": max(0.0, busy - idle) * ping_s / max(1, sent) * 1e6}


#: Generator processes of a reconnect wave at least (one per broker past it), alike for every cluster size.
RECONNECT_PROCS = 4
#: Connections one generator process opens at most (under a process's open-file cap, as ``--held``'s).
RECONNECT_PER_PROC = 12_500


#: Seconds the devices of a reconnect wave stay connected after its last CONNACK, counting those a broker closes.
RECONNECT_HELD_S = 10


def reconnect(cluster, devices):
    """Connects a second of ``devices`` devices with persistent sessions coming back at once (see the module doc): the
    first wave makes their sessions, the second is timed; ``(rate, seconds, first wave's rate, CONNACKs of the second
    with Session Present, connections a broker closed within RECONNECT_HELD_S after it, connections the brokers
    closed for a client id's home not reached, the brokers' CPU seconds per device of the second wave)``."""
    n = len(cluster.brokers)
    procs = max(RECONNECT_PROCS, n, -(-devices // RECONNECT_PER_PROC))
    procs = -(-procs // n) * n  # process i connects to broker i % n: a multiple of n gives each broker its share

    pids = [b.proc.pid for b in cluster.brokers]

    def wave():
        started, cpu = time.perf_counter(), sum(cpu_seconds(pid) for pid in pids)
        workers = [load.spawn(load.hold, cluster.mqtt_port(i % n), devices // procs + (i < devices % procs),
                              "rc%d-" % i, FLEET_KEEP_ALIVE, held_sources(i), False) for i in range(procs)]
        try:
            present = sum([pipe.recv()[1] for _, pipe in workers])
            took = time.perf_counter() - started
            cpu = sum(cpu_seconds(pid) for pid in pids) - cpu
            held = [cluster.connections(i) for i in range(n)]
            for _, pipe in workers:
                pipe.send(("closed", RECONNECT_HELD_S))
            closed = sum([pipe.recv() for _, pipe in workers])
            for _, pipe in workers:
                pipe.send("close")
        finally:
            for proc, _ in workers:
                proc.join(60)
        return took, present, closed, cpu, held

    first, _, _, _, _ = wave()
    deadline = time.monotonic() + 120
    while not _all_closed(cluster) and time.monotonic() < deadline:
        time.sleep(0.5)  # every connection seen closed, each session kept on its broker
    time.sleep(1)
    took, present, closed, cpu, held = wave()
    lease_closed = _lease_closed(cluster)
    return devices / took, took, devices / first, present, closed, lease_closed, cpu / devices, held


def _all_closed(cluster):
    """True once no broker holds a connection (a broker busy closing thousands may not answer ``stats`` in time)."""
    try:
        return not any(cluster.connections(i) for i in range(len(cluster.brokers)))
    except OSError:
        return False


def reconnect_run(root, zk, n, args):
    """The reconnect wave alone (``--reconnect``) on a cluster of ``n``."""
    cluster = Cluster(os.path.join(root, "r%d-%d" % (n, time.monotonic_ns())), zk.connect, n,
                      mqtt={"max_offline_sessions": args.reconnect})  # every device's session kept while it is away
    try:
        time.sleep(2)
        rate, took, first, present, closed, lease_closed, cpu, held = reconnect(cluster, args.reconnect)
    finally:
        cluster.stop()
    return {"rate": rate, "took": took, "first": first, "present": present, "closed": closed,
            "lease_closed": lease_closed, "cpu": cpu, "held": held}


def leave(cluster, devices):
    """``devices`` devices with persistent sessions, spread evenly over the brokers, and half of each broker's leave
    at once (every broker's half together) while the other half stays: ``(devices that stayed, of them those a
    broker closed within RECONNECT_HELD_S, the brokers' closes for a client id's home not reached meanwhile, the
    worst of the brokers' ``loop_lag_ms`` at the end)``."""
    n = len(cluster.brokers)
    procs = 2 * n * max(1, -(-devices // (2 * n * RECONNECT_PER_PROC)))  # processes i and i + procs / 2: one broker
    sizes = [devices // procs + (i < devices % procs) for i in range(procs)]
    workers = [load.spawn(load.hold, cluster.mqtt_port(i % n), sizes[i], "lv%d-" % i, FLEET_KEEP_ALIVE, held_sources(i),
                          False) for i in range(procs)]
    stay, go = workers[:procs // 2], workers[procs // 2:]
    try:
        [pipe.recv() for _, pipe in workers]  # every device connected
        stayed = sum(sizes[:procs // 2])
        time.sleep(2)
        before = _lease_closed(cluster)
        for _, pipe in stay:
            pipe.send(("closed", RECONNECT_HELD_S))
        for _, pipe in go:
            pipe.send("close")
        closed = sum([pipe.recv() for _, pipe in stay])
        for _, pipe in stay:
            pipe.send("close")
    finally:
        for proc, _ in workers:
            proc.join(60)
    lag = max(cluster.stats(i, ["loop_lag_ms"])["loop_lag_ms"] for i in range(len(cluster.brokers)))
    return stayed, closed, _lease_closed(cluster) - before, lag


def _lease_closed(cluster):
    """The brokers' closes for a client id's home not reached, all of them together, since they started."""
    return sum(cluster.stats(i, ["mqtt_cluster_lease_closed"])["mqtt_cluster_lease_closed"]
               for i in range(len(cluster.brokers)))


def leave_run(root, zk, n, args):
    """Half the devices leaving at once (``--leave``) on a cluster of ``n``."""
    mqtt = {"max_offline_sessions": args.leave}
    if args.lease:
        mqtt["cluster_id_lease_s"] = args.lease
    cluster = Cluster(os.path.join(root, "l%d-%d" % (n, time.monotonic_ns())), zk.connect, n, mqtt=mqtt)
    try:
        time.sleep(2)
        stayed, closed, lease_closed, lag = leave(cluster, args.leave)
    finally:
        cluster.stop()
    return {"stayed": stayed, "closed": closed, "lease_closed": lease_closed, "lag": lag}


def print_leave(args, results):
    print()
    print("leave: %d devices with persistent sessions spread evenly over the brokers, half of each broker's leave "
          "at once, the others stay %d s; mqtt.cluster_id_lease_s %s; %d runs; %d cores"
          % (args.leave, RECONNECT_HELD_S, args.lease or "default", args.runs, os.cpu_count()))
    print()
    print("| brokers | devices | stayed | of them closed by a broker, each run | closes for a home not reached | "
          "worst loop lag, ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in args.brokers:
        print("| %d | %d | %d | %s | %s | %s |" % (
            n, args.leave, results[n][0]["stayed"], " / ".join(str(r["closed"]) for r in results[n]),
            " / ".join(str(r["lease_closed"]) for r in results[n]), " / ".join(str(r["lag"]) for r in results[n])))


def print_reconnect(args, results):
    base = statistics.median(r["rate"] for r in results[args.brokers[0]])
    print()
    print("reconnect: %d devices with persistent sessions (Clean Start 0) come back at once to the broker they left, "
          "spread evenly over the brokers, their ids' homes spread over them; medians of %d runs; %d cores"
          % (args.reconnect, args.runs, os.cpu_count()))
    print()
    print("| brokers | devices | held per broker, fewest-most | reconnects/s (range) | seconds for all | "
          "vs %d broker(s) | first connects/s | brokers' CPU per reconnect | with their session | "
          "closed by a broker within %d s |" % (args.brokers[0], RECONNECT_HELD_S))
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.brokers:
        rates = [r["rate"] for r in results[n]]
        rate = statistics.median(rates)
        held = [h for r in results[n] for h in r["held"]]
        print("| %d | %d | %d-%d | %.0f (%.0f-%.0f) | %.1f | %.2fx | %.0f | %.0f µs | %s | %s |" % (
            n, args.reconnect, min(held), max(held), rate, min(rates), max(rates),
            statistics.median(r["took"] for r in results[n]),
            rate / base, statistics.median(r["first"] for r in results[n]),
            statistics.median(r["cpu"] for r in results[n]) * 1e6,
            " / ".join(str(r["present"]) for r in results[n]), " / ".join(str(r["closed"]) for r in results[n])))


def held_sources(i):
    """Source addresses of broker ``i``'s held connections: eight of its own, so that no address runs out of
    ephemeral ports and none nears a broker's per-address share."""
    return ["127.0.%d.%d" % (10 + i, j) for j in range(2, 10)]


def _cpu_rate(pids, seconds):
    """CPU seconds a second ``pids`` use together over the next ``seconds``."""
    cpu0, t0 = sum(cpu_seconds(pid) for pid in pids), time.perf_counter()
    time.sleep(seconds)
    return (sum(cpu_seconds(pid) for pid in pids) - cpu0) / (time.perf_counter() - t0)


def one_run(root, zk, n, args):
    cluster = Cluster(os.path.join(root, "n%d-%d" % (n, time.monotonic_ns())), zk.connect, n)
    try:
        rate, gen_cpu = device_publishes(cluster, args.devices, args.seconds)
        same = latency(cluster, 0, args.messages)
        across = latency(cluster, n - 1, args.messages) if n > 1 else None
        share, fan, _, _ = fanout(cluster, args.subscribers, args.messages)
    finally:
        cluster.stop()
    return {"rate": rate, "gen_cpu": gen_cpu, "same": same, "across": across, "share": share, "fan": fan}


def fanout_run(root, zk, n, args):
    """The fan-out alone (``--fanout-only``) on a cluster of ``n``."""
    cluster = Cluster(os.path.join(root, "f%d-%d" % (n, time.monotonic_ns())), zk.connect, n)
    try:
        time.sleep(2)
        empty = _cpu_rate([b.proc.pid for b in cluster.brokers], 5)
        share, fan, local, remote = fanout(cluster, args.subscribers, args.messages)
    finally:
        cluster.stop()
    return {"share": share, "fan": fan, "local": local, "remote": remote, "empty_cpu": empty}


def held_run(root, zk, args):
    """The held connections alone (``--held``) on a cluster of ``--held-brokers``."""
    cluster = Cluster(os.path.join(root, "h-%d" % time.monotonic_ns()), zk.connect, args.held_brokers)
    try:
        return held(cluster, args.held, args.held_keep_alive, args.held_seconds, args.held_every)
    finally:
        cluster.stop()


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _ms(pairs):
    p50, p99 = _median([p[0] if p else None for p in pairs]), _median([p[1] if p else None for p in pairs])
    return "-" if p50 is None else "%.2f / %.2f" % (p50, p99)


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-cluster-", dir=args.dir)
    zk = ZooKeeperProcess(os.path.join(root, "zk"))
    os.makedirs(zk.workdir, exist_ok=True)
    zk.start()
    results = {n: [] for n in args.brokers}
    try:
        if args.held:
            runs = [held_run(root, zk, args) for _ in range(args.runs)]
            for r in runs:
                print("run: %r" % r, file=sys.stderr, flush=True)
            return print_held(args, runs)
        for _ in range(args.runs):
            for n in args.brokers:  # interleaved: a noisy minute hits every size alike
                kind = fanout_run if args.fanout_only else paths_run if args.paths_only else \
                    reconnect_run if args.reconnect else leave_run if args.leave else one_run
                results[n].append(kind(root, zk, n, args))
                print("run: %d brokers %r" % (n, results[n][-1]), file=sys.stderr, flush=True)
    finally:
        zk.stop()
        shutil.rmtree(root, ignore_errors=True)
    if args.fanout_only:
        return print_fanout(args, results)
    if args.reconnect:
        return print_reconnect(args, results)
    if args.leave:
        return print_leave(args, results)
    if args.paths_only:
        return print_paths(args, results)
    base = statistics.median(r["rate"] for r in results[args.brokers[0]])
    print()
    print("cluster benchmark: %d devices publishing QoS 1, each its next message once the last is acknowledged; "
          "medians of %d runs; %d cores" % (args.devices, args.runs, os.cpu_count()))
    print()
    print("| brokers | device publishes/s | vs %d broker(s) | generators' CPU s/s | publish-to-receive same broker "
          "p50 / p99 ms | across brokers p50 / p99 ms | fan-out to %d: delivered | fan-out p50 / p99 ms |"
          % (args.brokers[0], args.subscribers))
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.brokers:
        rows = results[n]
        rate = statistics.median(r["rate"] for r in rows)
        print("| %d | %.0f | %.2fx | %.2f | %s | %s | %.3f | %s |" % (
            n, rate, rate / base, statistics.median(r["gen_cpu"] for r in rows), _ms([r["same"] for r in rows]),
            _ms([r["across"] for r in rows]) if n > 1 else "-", statistics.median(r["share"] for r in rows),
            _ms([r["fan"] for r in rows])))


def print_fanout(args, results):
    print()
    print("fan-out: %d QoS 0 subscribers of one topic spread evenly over the brokers, one publisher on broker 0, "
          "%d stamped messages 1 s apart; medians of %d runs; %d cores" % (args.subscribers, args.messages,
                                                                          args.runs, os.cpu_count()))
    print()
    print("| brokers | subscribers | delivered | p50 / p99 ms, all | on the publisher's broker | on the others "
          "| brokers' CPU s/s with no client |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n in args.brokers:
        rows = results[n]
        print("| %d | %d | %.3f | %s | %s | %s | %.3f |" % (
            n, (args.subscribers // max(n, FANOUT_PROCS)) * max(n, FANOUT_PROCS),
            statistics.median(r["share"] for r in rows), _ms([r["fan"] for r in rows]),
            _ms([r["local"] for r in rows]), _ms([r["remote"] for r in rows]) if n > 1 else "-",
            statistics.median(r["empty_cpu"] for r in rows)))


def print_held(args, runs):
    def med(f):
        return statistics.median(f(r) for r in runs)

    n = args.held_brokers
    print()
    print("held: %d MQTT connections (Keep Alive %d s) over %d brokers, one generator process per broker; a PINGREQ "
          "on each every %d s for %d s; medians of %d runs; %d cores"
          % (args.held, args.held_keep_alive, n, args.held_every, args.held_seconds, args.runs, os.cpu_count()))
    print()
    print("| brokers | connections held (per broker) | connect rate conn/s | broker heap empty / held MB (each) "
          "| KiB per connection | brokers' CPU s/s: no connections / held idle / pinging | us per ping "
          "| pings sent / answered | closed by a broker / open after |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("| %d | %d (%d) | %.0f | %.0f / %.0f | %.1f | %.2f / %.2f / %.2f | %.0f | %d / %d | %d / %d |" % (
        n, med(lambda r: r["seen"]), med(lambda r: r["seen"]) / n, med(lambda r: r["connect_rate"]),
        med(lambda r: statistics.mean(r["rss_before"])), med(lambda r: statistics.mean(r["rss_after"])),
        med(lambda r: (sum(r["rss_after"]) - sum(r["rss_before"])) * 1024 / max(1, r["seen"])),
        med(lambda r: r["empty_cpu"]), med(lambda r: r["idle_cpu"]), med(lambda r: r["ping_cpu"]),
        med(lambda r: r["ping_us"]), med(lambda r: r["pings"]), med(lambda r: r["answered"]),
        med(lambda r: r["closed"]), med(lambda r: r["open_after"])))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--brokers", type=int, nargs="+", default=[1, 2, 4], help="cluster sizes (default 1 2 4)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--devices", type=int, default=2000, help="fleet connections in all")
    p.add_argument("--seconds", type=float, default=5.0, help="the fleet's window")
    p.add_argument("--subscribers", type=int, default=2000, help="fan-out subscribers in all")
    p.add_argument("--messages", type=int, default=20, help="stamped messages per latency and fan-out row")
    p.add_argument("--fanout-only", action="store_true", help="only the fan-out, over each of --brokers")
    p.add_argument("--paths-only", action="store_true", help="only a message's path: latency and CPU per message, "
                   "same broker and across")
    p.add_argument("--cpu-messages", type=int, default=5000, help="messages of a CPU per message row")
    p.add_argument("--held", type=int, default=0, help="only connections held: this many in all (e.g. 100000)")
    p.add_argument("--held-brokers", type=int, default=8, help="brokers the held connections spread over")
    p.add_argument("--held-keep-alive", type=int, default=300, help="the held connections' Keep Alive (s)")
    p.add_argument("--held-seconds", type=float, default=60.0, help="how long the held connections ping")
    p.add_argument("--held-every", type=float, default=30.0, help="seconds between a held connection's pings")
    p.add_argument("--reconnect", type=int, default=0, help="only a reconnect wave of this many devices with "
                   "persistent sessions, over each of --brokers (e.g. --reconnect 100000 --brokers 1 4)")
    p.add_argument("--leave", type=int, default=0, help="only this many devices with persistent sessions, half of "
                   "each broker's leaving at once while the others stay, over each of --brokers")
    p.add_argument("--lease", type=float, default=None, help="with --leave: the brokers' mqtt.cluster_id_lease_s")
    p.add_argument("--dir", default=None, help="where the data goes (default: the system temp dir)")
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
