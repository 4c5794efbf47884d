"""The Python clients side by side (issue 45, points 5 and 7): metaq's client beside redis-py and nats-py.

    python -m bench.bench_pyclients [--runs 3] [--messages 100000] [--latency-seconds 3] [--rates 1000,50000]

(``--rates ""``: no latency rows.) Against real servers on 127.0.0.1 started here (data in a temporary
directory), the same run, medians of ``--runs`` runs, printed in ``bench/run.py``'s table (name, figure, unit,
each peer and the ratio):

* puts at 100 B and 1 KiB, every message acknowledged: metaq's ``Producer.send_many`` (1,000 payloads a call)
  and the batching ``Producer`` (``send_async``, ``batch_bytes`` 256 KiB, ``linger_ms`` 5; again with
  ``idempotent=True``: ``putb_idem`` batches, a sequence per message), beside redis-py's
  pipelined ``XADD`` (1,000 a pipeline, no transaction) and nats-py's JetStream publish (1,000 publishes
  gathered at once, each awaiting its ack);
* reads of what was put, from the start to the end: metaq's ``Consumer.iter_batches`` (1 MiB gets, each
  payload iterated) beside redis-py's ``XRANGE`` (1,000 a call) and nats-py's pull consumer ``fetch`` (1,000 a
  call, ``ack_policy`` none);
* end-to-end latency at each offered rate of ``--rates``: a paced producer process sends, every millisecond,
  the messages then due (100 B, the send time in the first 8 bytes, ``time.monotonic_ns``, one clock for every
  process of the host) in one call (``send_many`` / an ``XADD`` pipeline / publishes gathered); a consumer
  process receives them: metaq's ``Consumer.fetch_batch`` long-polling (``max_wait_ms`` 500), Redis's
  ``XREAD BLOCK 500 COUNT 1000``, a JetStream push consumer (``ack_policy`` none). p50 and p99 of receipt
  minus send time; the rate the producer reached is printed under the table.

Persistence: metaq with ``flush: async`` (acknowledged in the page cache, flushed in the background), Redis
with AOF ``appendfsync everysec``, JetStream with file storage (2.9 writes before it acks, fsyncs every 2 min):
acknowledged once in the OS's page cache, all three. Not a test: nothing here asserts a figure.
"""

import argparse
import asyncio
import multiprocessing
import os
import queue
import shutil
import statistics
import struct
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bench.nats_jetstream import NatsBench, nats_available  # noqa: E402
from bench.redis_streams import RedisBench, redis_available  # noqa: E402
from bench.run import print_table, start_broker  # noqa: E402
from metaq.client import Consumer, Message, Producer  # noqa: E402

PER_CALL = 1000
MAX_SIZE = 1 << 20
LAT_SIZE = 100
LONG_POLL_MS = 500
#: The paced producer's tick: every tick it sends what is due by then.
TICK_S = 0.001
STREAM = "PYB"


def clients_available():
    """redis-py and nats-py (the ``bench`` extra): without them the peers' rows stay empty."""
    try:
        import nats  # noqa: F401
        import redis  # noqa: F401
    except ImportError:
        return False
    return True


# --- metaq -----------------------------------------------------------------------------------------------------

def metaq_partition(url, topic):
    """Creates ``topic`` (one message ``w``) and returns its first partition."""
    with Producer(brokers=[url]) as p:
        assert p.send(Message(topic, b"w")).success
        return p.partitions(topic)[0]


def metaq_many(url, topic, n, size):
    payloads = [b"m" * size] * PER_CALL
    with Producer(brokers=[url]) as p:
        assert p.send(Message(topic, b"w")).success
        started = time.perf_counter()
        futures = [p.send_many(topic, payloads, partition=0) for _ in range(n // PER_CALL)]
        stored = sum(f.result(timeout=120).stored for f in futures)
        elapsed = time.perf_counter() - started
    assert stored == n // PER_CALL * PER_CALL, stored
    return stored / elapsed


def metaq_batching(url, topic, n, size, idempotent=False):
    body = b"b" * size
    with Producer(brokers=[url], batch_bytes=256 * 1024, linger_ms=5, idempotent=idempotent) as p:
        assert p.send(Message(topic, b"w")).success
        started = time.perf_counter()
        futures = [p.send_async(Message(topic, body)) for _ in range(n)]
        p.flush()
        failed = sum(1 for f in futures if not f.result(timeout=120).success)
        elapsed = time.perf_counter() - started
    assert failed == 0, failed
    return n / elapsed


def metaq_read(url, topic, n):
    """msgs/s of reading partition 0 of ``topic`` (filled by ``metaq_many``) from 0 to its end."""
    part = metaq_partition(url, topic)
    consumer = Consumer("bench-pyclients", brokers=[url])
    try:
        got, started = 0, time.perf_counter()
        for batch in consumer.iter_batches(topic, part, 0, max_size=MAX_SIZE):
            for _offset, _id, payload in batch:
                got += len(payload) > 1
        elapsed = time.perf_counter() - started
    finally:
        consumer.close()
    assert got >= n, (got, n)
    return got / elapsed


# --- Redis (redis-py) ------------------------------------------------------------------------------------------

def redis_puts(port, key, n, size):
    import redis

    r = redis.Redis(port=port)
    body = b"r" * size
    started = time.perf_counter()
    for _ in range(n // PER_CALL):
        pipe = r.pipeline(transaction=False)
        for _ in range(PER_CALL):
            pipe.xadd(key, {"v": body})
        pipe.execute()
    elapsed = time.perf_counter() - started
    r.close()
    return n // PER_CALL * PER_CALL / elapsed


def redis_read(port, key, n):
    import redis

    r = redis.Redis(port=port)
    got, start, started = 0, "-", time.perf_counter()
    while True:
        entries = r.xrange(key, start, "+", count=PER_CALL)
        if not entries:
            break
        for _id, fields in entries:
            got += len(fields[b"v"]) > 0
        start = b"(" + entries[-1][0]
    elapsed = time.perf_counter() - started
    r.close()
    assert got >= n, (got, n)
    return got / elapsed


# --- NATS JetStream (nats-py) ----------------------------------------------------------------------------------

async def _js(port):
    import nats

    nc = await nats.connect("nats://127.0.0.1:%d" % port)
    js = nc.jetstream()
    try:
        await js.add_stream(name=STREAM, subjects=["pyb.>"], storage="file")
    except Exception:  # noqa: BLE001 - exists already (made by an earlier call)
        await js.stream_info(STREAM)
    return nc, js


def nats_puts(port, subject, n, size):
    async def go():
        nc, js = await _js(port)
        body = b"n" * size
        started = time.perf_counter()
        for _ in range(n // PER_CALL):
            await asyncio.gather(*[js.publish(subject, body) for _ in range(PER_CALL)])
        elapsed = time.perf_counter() - started
        await nc.close()
        return n // PER_CALL * PER_CALL / elapsed
    return asyncio.run(go())


def nats_read(port, subject, n):
    async def go():
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        nc, js = await _js(port)
        psub = await js.pull_subscribe(subject, durable=None, config=ConsumerConfig(
            ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL))
        got, started = 0, time.perf_counter()
        while got < n:
            for m in await psub.fetch(PER_CALL, timeout=10):
                got += len(m.data) > 0
        elapsed = time.perf_counter() - started
        await psub.unsubscribe()
        await nc.close()
        return got / elapsed
    return asyncio.run(go())


# --- end-to-end latency: a paced producer process, a long-polling consumer process -----------------------------

def _stamp():
    return struct.pack("<q", time.monotonic_ns()) + b"l" * (LAT_SIZE - 8)


def _paced(send, rate, seconds):
    """Calls ``send(payloads)`` every tick with the messages due by then (at most ``PER_CALL``: a producer that
    falls behind sends less than offered, and says so); returns (sent, elapsed)."""
    sent, started = 0, time.monotonic()
    total = int(rate * seconds)
    while sent < total:
        due = min(total, int((time.monotonic() - started) * rate) + 1, sent + PER_CALL) - sent
        if due > 0:
            now = _stamp()
            send([now] * due)
            sent += due
        time.sleep(TICK_S)
    return sent, time.monotonic() - started


def _producer(kind, port, where, rate, seconds, ready, out):
    ready.wait(30)
    if kind == "metaq":
        with Producer(brokers=["meta://127.0.0.1:%d" % port]) as p:
            futures = []
            sent, elapsed = _paced(lambda ps: futures.append(p.send_many(where, ps, partition=0)), rate, seconds)
            assert sum(f.result(timeout=60).stored for f in futures) == sent
    elif kind == "redis":
        import redis

        r = redis.Redis(port=port)

        def send(ps):
            pipe = r.pipeline(transaction=False)
            for body in ps:
                pipe.xadd(where, {"v": body})
            pipe.execute()
        sent, elapsed = _paced(send, rate, seconds)
    else:
        async def go():
            nc, js = await _js(port)
            sent, started = 0, time.monotonic()
            total = int(rate * seconds)
            while sent < total:  # as _paced, each tick's publishes gathered (acks awaited) before the next
                due = min(total, int((time.monotonic() - started) * rate) + 1, sent + PER_CALL) - sent
                if due > 0:
                    body = _stamp()
                    await asyncio.gather(*[js.publish(where, body) for _ in range(due)])
                    sent += due
                await asyncio.sleep(TICK_S)
            elapsed = time.monotonic() - started
            await nc.close()
            return sent, elapsed
        sent, elapsed = asyncio.run(go())
    out.put(("sent", sent, elapsed))


def _consumer(kind, port, where, expected, ready, out):
    lat = []

    def take(body, now):
        if len(body) == LAT_SIZE:
            lat.append((now - struct.unpack_from("<q", body)[0]) / 1e6)
    deadline = time.monotonic() + 120
    if kind == "metaq":
        url = "meta://127.0.0.1:%d" % port
        part = metaq_partition(url, where)
        consumer = Consumer("bench-latency", brokers=[url])
        offset = 0
        ready.set()
        while len(lat) < expected and time.monotonic() < deadline:
            batch = consumer.fetch_batch(where, part, offset, max_size=MAX_SIZE, max_wait_ms=LONG_POLL_MS)
            now = time.monotonic_ns()
            for _offset, _id, payload in batch:
                take(payload, now)
            if batch.count:
                offset = batch.next_offset
        consumer.close()
    elif kind == "redis":
        import redis

        r = redis.Redis(port=port)
        last = "0-0"
        ready.set()
        while len(lat) < expected and time.monotonic() < deadline:
            for _key, entries in r.xread({where: last}, count=PER_CALL, block=LONG_POLL_MS) or ():
                now = time.monotonic_ns()
                for _id, fields in entries:
                    take(fields[b"v"], now)
                last = entries[-1][0]
    else:
        async def go():
            from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

            import nats.errors

            nc, js = await _js(port)
            sub = await js.subscribe(where, manual_ack=True, config=ConsumerConfig(
                ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL))
            ready.set()
            while len(lat) < expected and time.monotonic() < deadline:
                try:
                    msg = await sub.next_msg(timeout=LONG_POLL_MS / 1000)
                except nats.errors.TimeoutError:
                    continue
                take(msg.data, time.monotonic_ns())
            await asyncio.wait_for(nc.close(), 10)
        asyncio.run(go())
    lat.sort()
    out.put(("lat", len(lat), lat[len(lat) // 2] if lat else float("nan"),
             lat[int(len(lat) * 0.99)] if lat else float("nan")))


def latency_run(kind, port, where, rate, seconds):
    """(p50 ms, p99 ms, msgs/s the producer reached) of one paced run; separate processes (spawned: no client
    state shared), the consumer polling before the producer starts."""
    ctx = multiprocessing.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    expected = int(rate * seconds)
    procs = [ctx.Process(target=_consumer, args=(kind, port, where, expected, ready, out)),
             ctx.Process(target=_producer, args=(kind, port, where, rate, seconds, ready, out))]
    for p in procs:
        p.start()
    got = {}
    deadline = time.monotonic() + 240
    while len(got) < len(procs):
        try:
            x = out.get(timeout=1)
            got[x[0]] = x[1:]
        except queue.Empty:
            if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                raise RuntimeError("%s: a latency process failed or hung" % kind) from None
    for p in procs:
        p.join(30)
    received, p50, p99 = got["lat"]
    sent, elapsed = got["sent"]
    if received < sent:
        raise RuntimeError("%s: %d of %d received" % (kind, received, sent))
    return p50, p99, sent / elapsed


# --- the table -------------------------------------------------------------------------------------------------

def median(xs):
    return statistics.median(xs)


def run(args):
    root = tempfile.mkdtemp(prefix="metaq-bench-pyclients-", dir=args.dir)
    results, reached = [], []
    redis = nats = None
    brokers = []
    peers_on = clients_available()
    try:
        redis = RedisBench(root) if peers_on and redis_available() else None
        nats = NatsBench(root) if peers_on and nats_available() else None
        b = start_broker(root, "async", "pyclients")
        brokers.append(b)
        url = "meta://127.0.0.1:%d" % b.port
        n = args.messages // PER_CALL * PER_CALL
        for size in (100, 1024):
            many, batching, idem, reads = [], [], [], []
            peer_puts, peer_reads = {"redis": [], "nats": []}, {"redis": [], "nats": []}
            for r in range(args.runs):
                topic = "pyc%dr%d" % (size, r)
                many.append(metaq_many(url, topic, n, size))
                batching.append(metaq_batching(url, "pyb%dr%d" % (size, r), n, size))
                idem.append(metaq_batching(url, "pyi%dr%d" % (size, r), n, size, idempotent=True))
                reads.append(metaq_read(url, topic, n))
                if redis:
                    key = "pyc%dr%d" % (size, r)
                    peer_puts["redis"].append(redis_puts(redis.port, key, n, size))
                    peer_reads["redis"].append(redis_read(redis.port, key, n))
                if nats:
                    subject = "pyb.p%dr%d" % (size, r)
                    peer_puts["nats"].append(nats_puts(nats.port, subject, n, size))
                    peer_reads["nats"].append(nats_read(nats.port, subject, n))
            puts = {k: median(v) for k, v in peer_puts.items() if v}
            label = "%d B" % size if size < 1024 else "1 KiB"
            results.append(("py put %s: send_many 1,000/call" % label, median(many), "msgs/s", puts))
            results.append(("py put %s: batching Producer" % label, median(batching), "msgs/s", puts))
            results.append(("py put %s: batching Producer, idempotent" % label, median(idem), "msgs/s", puts))
            results.append(("py read %s: iter_batches / XRANGE / pull" % label, median(reads), "msgs/s",
                            {k: median(v) for k, v in peer_reads.items() if v}))
        targets = [("metaq", b.port)] + [(k, p.port) for k, p in (("redis", redis), ("nats", nats)) if p]
        for rate in args.rates:
            runs = {kind: [] for kind, _port in targets}
            for r in range(args.runs):
                for kind, port in targets if r % 2 == 0 else reversed(targets):
                    where = ("pyb.lat%dr%d" if kind == "nats" else "lat%dr%d") % (rate, r)
                    runs[kind].append(latency_run(kind, port, where, rate, args.latency_seconds))
            for i, stat in ((0, "p50"), (1, "p99")):
                peers = {k: median([x[i] for x in v]) for k, v in runs.items() if k != "metaq"}
                results.append(("e2e latency %s at %s msgs/s offered" % (stat, f"{rate:,}"),
                                median([x[i] for x in runs["metaq"]]), "ms", peers))
            reached.append((rate, {k: median([x[2] for x in v]) for k, v in runs.items()}))
    finally:
        for b in brokers:
            b.stop()
        for peer in (redis, nats):
            if peer:
                peer.close()
        shutil.rmtree(root, ignore_errors=True)
    print_table(results, args, [key for key, peer in (("redis", redis), ("nats", nats)) if peer],
                title="Python clients: metaq's client, redis-py, nats-py; median of %d runs, servers on 127.0.0.1, "
                      "acknowledged in the page cache (metaq flush async, Redis AOF everysec, JetStream file)"
                      % args.runs)
    if not peers_on:
        print("(redis-py or nats-py not installed, pip install -e '.[bench]': no peer rows)")
    for rate, by in reached:
        print("offered %s msgs/s, the paced producer reached: %s" % (f"{rate:,}", ", ".join(
            "%s %s" % (k, f"{v:,.0f}") for k, v in by.items())))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--messages", type=int, default=100_000, help="messages a put or read row moves (x 1,000)")
    p.add_argument("--latency-seconds", type=float, default=3.0, help="how long each paced latency run offers")
    p.add_argument("--rates", type=lambda s: [int(x) for x in s.split(",") if x], default=[1000, 50_000])
    p.add_argument("--dir", default=None)
    run(p.parse_args(argv))


if __name__ == "__main__":
    main()
