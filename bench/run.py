"""metaq benchmark: prints a table for 1 KiB messages (medians of several runs).

    python bench/run.py [--runs 3] [--messages 100000] [--quick] [--reads-only]

Every figure is measured against a real broker process on 127.0.0.1 started by
this script (data in a temporary directory). Two peers are measured in the same
run and printed beside ours, each with the ratio: where ``redis-server`` is
installed, Redis Streams (XADD / XRANGE, AOF with ``appendfsync everysec``;
``always`` in the rows where metaq fsyncs each put), and where ``nats-server``
is installed, NATS JetStream (file storage; publishes with acks, a pull
consumer; 2.9 cannot fsync before its ack, see ``bench/nats_jetstream.py``).
Not a test: nothing here asserts.
"""

import argparse
import contextlib
import os
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench import wire  # noqa: E402
from bench.nats_jetstream import NatsBench, nats_available  # noqa: E402
from bench.redis_streams import RedisBench, redis_available  # noqa: E402
from bench.configs import full_size_store  # noqa: E402
from metaq.client.local import BrokerProcess, small_config  # noqa: E402

MSG = 1024
TOPIC = "bench"


def put_frames(depth, partition=0):
    """Pre-encoded 1 KiB put frames with opaques 0..depth-1 (the client cycles through them)."""
    return wire.put_block(TOPIC, b"p" * MSG, depth, partition)


def pipelined_puts(port, n, depth=64, **conn):
    """Put n messages keeping ``depth`` requests in flight; returns msgs/s. ``conn``: ``wire.connect``'s TLS or
    authentication."""
    return pipelined(port, put_frames(depth), depth, n, **conn)


def pipelined(port, frames, depth=64, n=None, **conn):
    """Send ``n`` requests (default: each of ``frames`` once, else cycling through them) keeping ``depth`` in
    flight, expecting ``result 200`` for each; returns requests/s."""
    n = len(frames) if n is None else n
    sock = wire.connect(port, **conn)
    replies = wire.ResultReplies(sock)
    started = time.perf_counter()
    wire.pipeline(sock, replies, frames, n, depth)
    elapsed = time.perf_counter() - started
    sock.close()
    return n / elapsed


def sequential_put_latencies(port, n, **conn):
    frame = put_frames(1)[0]
    sock = wire.connect(port, **conn)
    replies = wire.ResultReplies(sock)
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        sock.sendall(frame)
        replies.wait(1)
        lat.append(time.perf_counter() - t)
    sock.close()
    lat.sort()
    return lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3


def cpu_seconds(pid):
    """CPU seconds process ``pid`` has run so far, its threads together (``/proc/<pid>/task/*/schedstat``:
    nanoseconds, where ``/proc/<pid>/stat`` counts 10 ms ticks). A thread that ended meanwhile takes its time
    with it (a broker's threads live as long as it does)."""
    total = 0
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            with open("/proc/%d/task/%s/schedstat" % (pid, tid)) as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that ended meanwhile
    return total / 1e9


def pin(pid, cpus):
    """Every thread of process ``pid`` on ``cpus`` only (``sched_setaffinity`` on each of /proc/<pid>/task)."""
    for tid in os.listdir("/proc/%d/task" % pid):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


#: The CPUs the outermost ``placed`` split (None: nothing placed now): a nested placement puts its server beside the
#: others, not on what is left of this client's own (one CPU, which would leave the server unplaced).
_placing = {"cpus": None}


@contextlib.contextmanager
def placed(server_pid):
    """The latency rows' placement, the same for metaq and each peer: this client on the first CPU, the server on
    the others, as a client on another host would be. Left to the scheduler, a request-reply loop lands either on
    one CPU (~10 µs a round trip here) or across two (~80 µs: waking the idle one), by luck, so an unplaced
    row compares luck, not servers. Placements nest (``bench_latency`` places every target at once). With one
    CPU, nothing is placed."""
    outer = _placing["cpus"] is None
    cpus = sorted(os.sched_getaffinity(0)) if outer else _placing["cpus"]
    if len(cpus) < 2:
        yield
        return
    pin(server_pid, set(cpus[1:]))
    if outer:
        _placing["cpus"] = cpus
        os.sched_setaffinity(0, {cpus[0]})
    try:
        yield
    finally:
        if outer:
            os.sched_setaffinity(0, set(cpus))
            _placing["cpus"] = None
        try:
            pin(server_pid, set(cpus))
        except FileNotFoundError:  # the server is gone
            pass


def fdatasync_latencies(root, n):
    """The floor under a synchronous put: append 1 KiB records to a preallocated, mapped file and
    fdatasync after each, as the broker's segments are written (no network, no broker); (p50, p99) ms."""
    import mmap

    path = os.path.join(root, "fdatasync-floor")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        size = n * (MSG + 64)
        os.posix_fallocate(fd, 0, size)
        with mmap.mmap(fd, size) as mm:
            record = os.urandom(MSG + 64)
            lat = []
            for i in range(n):
                mm[i * len(record):(i + 1) * len(record)] = record
                t = time.perf_counter()
                os.fdatasync(fd)
                lat.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(path)
    lat.sort()
    return lat[len(lat) // 2] * 1e3, lat[int(len(lat) * 0.99)] * 1e3


def _producer(args):
    port, n, depth, barrier_at = args
    while time.time() < barrier_at:  # start together
        time.sleep(0.001)
    return pipelined_puts(port, n, depth)


def concurrent_producers(port, producers, per_producer, depth=1):
    """``producers`` separate client processes (no shared GIL), each with ``depth`` puts in flight."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(producers) as pool:
        start_at = time.time() + 0.5
        pool.map(_producer, [(port, per_producer, depth, start_at)] * producers)
        elapsed = time.time() - start_at
    return producers * per_producer / elapsed


def sequential_reads(port, count, max_size=1 << 20, **conn):
    """Read ``count`` messages of partition 0 in order with 1 MiB gets; returns (MB/s, msgs/s).

    As a fetching consumer does, the next get goes out as soon as the reply's
    header says how much is coming (so the broker prepares it while this one is
    read). Everything is received with ``recv_into`` into one preallocated
    buffer and only the ``value`` header is parsed, so the figure is the
    broker's, not a Python parser's.
    """
    sock = wire.connect(port, **conn)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)  # room for a whole reply
    buf = bytearray(max_size + (64 << 10))
    view = memoryview(buf)
    topic = TOPIC.encode()
    offset, nbytes, opaque, have = 0, 0, 1, 0
    started = time.perf_counter()
    sock.sendall(b"get %s g 0 0 %d 1\r\n" % (topic, max_size))
    while offset < count:
        line_end = buf.find(b"\r\n", 0, have)
        while line_end < 0:
            have += sock.recv_into(view[have:])
            line_end = buf.find(b"\r\n", 0, have)
        word, n, _op = bytes(buf[:line_end]).split(b" ")
        assert word == b"value", bytes(buf[:line_end])
        n = int(n)
        offset += n // (20 + MSG)
        if offset < count:
            opaque += 1
            sock.sendall(b"get %s g 0 %d %d %d\r\n" % (topic, offset, max_size, opaque))
        end = line_end + 2 + n  # only this reply is in flight until its header is read: nothing past it
        while have < end:
            have += sock.recv_into(view[have:end])
        nbytes += n
        have = 0
    elapsed = time.perf_counter() - started
    sock.close()
    return nbytes / elapsed / 1e6, offset / elapsed


def start_broker(root, flush, name, **broker):
    wd = os.path.join(root, name)
    os.makedirs(wd, exist_ok=True)
    cfg = small_config(os.path.join(wd, "data"), broker=broker, store=full_size_store(flush=flush),
                       limits={"max_body_bytes": 1 << 20},
                       topics=[{"name": "*", "partitions": 4}])
    return BrokerProcess(wd, cfg).start()


def measure_recovery(root, gib):
    """Write ~gib GiB, kill -9, restart with the checkpoint removed: full-scan seconds per GiB."""
    b = start_broker(root, "async", "recovery")
    n = int(gib * (1 << 30) / (MSG + 80))
    chunk = 50_000
    for start in range(0, n, chunk):
        pipelined_puts(b.port, min(chunk, n - start), depth=256)
    b.kill()
    checkpoint = os.path.join(b.data_dir, "checkpoint")
    if os.path.exists(checkpoint):  # force the full scan
        os.unlink(checkpoint)
    t = time.perf_counter()
    b.start(timeout=600)
    elapsed = time.perf_counter() - t
    b.stop()
    shutil.rmtree(b.workdir, ignore_errors=True)
    return elapsed / gib


def median(xs):
    return statistics.median(xs)


#: The peers' columns: (key, heading).
PEERS = (("redis", "redis streams"), ("nats", "nats jetstream"))
#: A NATS figure marked so was acknowledged before any fsync where metaq and Redis fsync each write.
NO_FSYNC = "*"


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-", dir=args.dir)
    results = []  # (name, ours, unit, {peer key: figure, or (figure, NO_FSYNC)})
    redis = nats = None
    try:
        redis = RedisBench(root) if redis_available() else None
        nats = NatsBench(root) if nats_available() else None
        if args.reads_only:
            read_rows(root, args, redis, nats, results)
            return
        pipelined_rows(root, args, redis, nats, results)
        latency_rows(root, args, redis, nats, results)
        floor = [fdatasync_latencies(root, args.latency_n) for _ in range(args.runs)]
        results.append(("disk alone: 1 KiB append + fdatasync, p50", median([f[0] for f in floor]), "ms", {}))
        results.append(("disk alone: 1 KiB append + fdatasync, p99", median([f[1] for f in floor]), "ms", {}))
        durable_rows(root, args, redis, nats, results)
        read_rows(root, args, redis, nats, results)
        if not args.quick:
            secs = [measure_recovery(root, args.recovery_gib) for _ in range(args.runs)]
            results.append(("recovery after kill -9, full scan", median(secs), "s/GiB", {}))
    finally:
        for peer in (redis, nats):
            if peer:
                peer.close()
        shutil.rmtree(root, ignore_errors=True)
        print_table(results, args, [key for key, peer in (("redis", redis), ("nats", nats)) if peer])


def pipelined_rows(root, args, redis, nats, results):
    """The pipelined put rows, without and with fsync, each with the peers' figures."""
    for flush in ("async", "sync"):
        runs = []
        for r in range(args.runs):
            b = start_broker(root, flush, "pipe-%s-%d" % (flush, r))
            runs.append(pipelined_puts(b.port, args.messages))
            b.stop()
            shutil.rmtree(b.workdir, ignore_errors=True)
        peers = {}
        if redis:  # with fsync, the peer fsyncs too (appendfsync always: once per loop turn, before answering)
            redis.set_fsync("always" if flush == "sync" else "everysec")
            peers["redis"] = median([redis.pipelined_xadd(args.messages) for _ in range(args.runs)])
            redis.set_fsync("everysec")
        if nats:
            peers["nats"] = median([nats.pipelined_publish(args.messages) for _ in range(args.runs)])
            if flush == "sync":  # NATS 2.9 cannot fsync before it acks
                peers["nats"] = (peers["nats"], NO_FSYNC)
        results.append(("pipelined put, depth 64, flush=%s" % flush, median(runs), "msgs/s", peers))


def latency_rows(root, args, redis, nats, results):
    """The single put p50 and p99 rows, without and with fsync, each with the peers' figures."""
    for flush, label in (("async", "without fsync"), ("sync", "with fsync")):
        b = start_broker(root, flush, "lat-%s" % flush)
        with placed(b.proc.pid):
            latencies = [sequential_put_latencies(b.port, args.latency_n) for _ in range(args.runs)]
            p50s, p99s = zip(*latencies, strict=True)
        b.stop()
        p50, p99 = {}, {}
        if redis:  # with fsync, the peer fsyncs each write too (appendfsync always)
            redis.set_fsync("always" if flush == "sync" else "everysec")
            with placed(redis.proc.pid):
                peer = [redis.sequential_xadd(args.latency_n) for _ in range(args.runs)]
            redis.set_fsync("everysec")
            p50["redis"], p99["redis"] = median([p[0] for p in peer]), median([p[1] for p in peer])
        if nats:
            with placed(nats.proc.pid):
                peer = [nats.sequential_publish(args.latency_n) for _ in range(args.runs)]
            p50["nats"], p99["nats"] = median([p[0] for p in peer]), median([p[1] for p in peer])
            if flush == "sync":
                p50["nats"], p99["nats"] = (p50["nats"], NO_FSYNC), (p99["nats"], NO_FSYNC)
        results.append(("single put p50, %s" % label, median(p50s), "ms", p50))
        results.append(("single put p99, %s" % label, median(p99s), "ms", p99))


def durable_rows(root, args, redis, nats, results):
    """The durable put rows: 16 producers at depths 1, 8 and 64, flush=sync, with the peers' figures."""
    for depth, per in ((1, args.messages // 16 // 4), (8, args.messages // 16), (64, args.messages // 16)):
        runs = []
        for r in range(args.runs):
            b = start_broker(root, "sync", "durable-%d-%d" % (depth, r))
            runs.append(concurrent_producers(b.port, 16, per, depth=depth))
            b.stop()
            shutil.rmtree(b.workdir, ignore_errors=True)
        peers = {}
        if redis:  # the durable peer: AOF with appendfsync always
            redis.set_fsync("always")
            peers["redis"] = median([redis.concurrent_xadd(16, per, depth) for _ in range(args.runs)])
            redis.set_fsync("everysec")
        if nats:
            peers["nats"] = (median([nats.concurrent_publish(16, per, depth) for _ in range(args.runs)]),
                             NO_FSYNC)
        results.append(("durable puts, 16 producers x depth %d, flush=sync" % depth, median(runs),
                        "msgs/s", peers))


def read_rows(root, args, redis, nats, results):
    """The sequential read rows, and the loopback ceiling measured in the same minutes (a Python sender process
    writing 1 MiB buffers to a receiver that reads as the read row does: bench/bench_reads.py); with
    ``--reads-only`` one broker with ``broker.zero_copy_reads: true`` and one with ``false`` instead."""
    from bench.bench_reads import loopback_ceiling

    brokers = [("sequential read, 1 MiB gets", start_broker(root, "async", "read"))]  # the default settings
    if args.reads_only:  # each path named, whatever the default is
        brokers = [("sequential read, zero-copy (zero_copy_reads on)",
                    start_broker(root, "async", "read-zc", zero_copy_reads=True)),
                   ("sequential read, copying (zero_copy_reads off)",
                    start_broker(root, "async", "read-copy", zero_copy_reads=False))]
    for _name, b in brokers:
        pipelined_puts(b.port, args.messages, depth=256)
    runs = {name: [] for name, _b in brokers}
    ceiling = []
    for _ in range(args.runs):  # interleaved: a slow minute on a shared machine slows every row alike
        ceiling.append(loopback_ceiling(args.messages * (MSG + 20))[0])
        for name, b in brokers:
            runs[name].append(sequential_reads(b.port, args.messages))
    for _name, b in brokers:
        b.stop()
    by_bytes, by_msgs = {}, {}
    if redis:
        peer = [redis.sequential_xrange(args.messages) for _ in range(args.runs)]
        by_bytes["redis"], by_msgs["redis"] = median([p[0] for p in peer]), median([p[1] for p in peer])
    if nats:  # a pull consumer, 1000 messages a request
        peer = [nats.sequential_pull(args.messages) for _ in range(args.runs)]
        by_bytes["nats"], by_msgs["nats"] = median([p[0] for p in peer]), median([p[1] for p in peer])
    for name, _b in brokers:
        mbs, msgs = zip(*runs[name], strict=True)
        results.append((name, median(mbs), "MB/s", by_bytes))
        results.append((name, median(msgs), "msgs/s", by_msgs))
    results.append(("loopback ceiling: Python socket pair, 1 MiB sends", median(ceiling), "MB/s", {}))


def print_table(results, args, peers, title=None):
    """``peers``: the keys of the peers measured (columns for each, in ``PEERS`` order); ``title``: the line over
    the table (default: this script's)."""
    columns = [(key, heading) for key, heading in PEERS if key in peers]
    print()
    print(title or "metaq benchmark: 1 KiB messages, median of %d runs, broker and client on 127.0.0.1" % args.runs)
    head = "%-52s %14s  %-7s" % ("measurement", "metaq", "unit")
    for _key, heading in columns:
        head += " %15s %9s" % (heading, "ratio")
    print(head)
    print("-" * len(head))
    marked = False
    for name, ours, unit, figures in results:
        line = "%-52s %14s  %-7s" % (name, fmt(ours), unit)
        for key, _heading in columns:
            peer, mark = figures.get(key), ""
            if isinstance(peer, tuple):
                peer, mark = peer
                marked = True
            if peer:
                ratio = (peer / ours) if unit in ("ms", "s/GiB") else (ours / peer)
                shown = ("(%.2fx)" if mark else "%.2fx ") % ratio  # not like for like: in brackets
                line += " %15s %9s" % (fmt(peer) + mark, shown)
            else:
                line += " %15s %9s" % ("-", "")
        print(line)
    for key, missing in (("redis", "(redis-server not installed: no Redis Streams figures)"),
                         ("nats", "(nats-server not installed: no NATS JetStream figures)")):
        if key not in peers:
            print(missing)
    if columns:
        print("ratio > 1 means metaq is better (higher rate or lower latency)")
    if marked:
        print("%s NATS JetStream 2.9 acknowledges before any fsync (it has no per-write sync option), while "
              "metaq and Redis (appendfsync always) fsync each write in these rows: not like for like, "
              "the ratio in brackets" % NO_FSYNC)


def fmt(x):
    if x >= 100:
        return "{:,.0f}".format(x)
    if x >= 1:
        return "%.2f" % x
    return "%.3f" % x


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--latency-n", type=int, default=2000)
    p.add_argument("--recovery-gib", type=float, default=0.5)
    p.add_argument("--dir", default=None, help="where to put the data (default: $TMPDIR)")
    p.add_argument("--quick", action="store_true", help="skip the recovery measurement")
    p.add_argument("--reads-only", action="store_true",
                   help="only the sequential read rows, with the copying path and the loopback ceiling beside them")
    run(p.parse_args())


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main()
