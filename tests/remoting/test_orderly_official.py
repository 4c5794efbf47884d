"""Orderly consumption with the official RocketMQ client (PyPI rocketmq==0.4.4, C++ core): two
``PushConsumer(orderly=True)`` processes of one group, a producer's ``send_orderly`` by key, one consumer killed
with kill -9.

What the C++ core does (its 1.2.x sources; the constants read from the bundled librocketmq.so): it locks the
queues its rebalance gives it (LOCK_BATCH_MQ, every 20 s for all of them, and once for a queue it finds unlocked
when a message is there), consumes a queue only while its own lock is younger than 30 s, and unlocks a queue its
rebalance takes away. So the broker's expiry must exceed 30 s, or a client that renews on time could lose a lock
it still believes it holds; this test keeps RocketMQ's 60 s.

Measured here: the survivor processes the dead one's queues 0.03 s after the kill when nothing else holds it up,
and up to ~11 s after it when its rebalance first waits for a long poll it left parked on a queue it gave up
earlier (the C++ client waits for such a pull to return before it takes that queue again; it parks for 15 s).
"""

import json
import os
import time
from itertools import pairwise

import pytest

from bench.rocketmq_peer import finish_peer, start_peer
from metaq.client.local import ns_of
from metaq.client.raw import RemotingClient
from metaq.protocol.rocketmq.remoting import RequestCode as R
from tests.harness.broker import wait_for
from tests.harness.rocketmq import require_official_client

pytestmark = pytest.mark.slow

FAST = {"store": {"flush": "async", "flush_interval_ms": 50}}
#: The broker's lock expiry here (the default, RocketMQ's): above the client's own 30 s lock life, which is above
#: its 20 s renewal period.
EXPIRY = 60.0
#: The survivor must take the dead consumer's queues well within the expiry: the broker frees them when the dead
#: process's connection closes, and the client may first wait out one 15 s long poll. (Were they only freed by
#: the expiry, it would wait 40-60 s: the dead one renewed at most 20 s before it died.)
TAKEOVER_BOUND = 30.0
KEYS, COUNT = 8, 600


@pytest.fixture(autouse=True)
def _official_client():
    require_official_client()


def lines_of(path):
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            if line.endswith("\n") and line.startswith("{"):
                out.append(json.loads(line))
    return out


def begins(lines):
    return [m for m in lines if m.get("ev") == "begin"]


def intervals(lines, killed_at=None):
    """``{queue: [(begin t, end t, offset)]}`` of one consumer; a handler still running when the process was killed
    ends at ``killed_at``."""
    ends = {(m["queue_id"], m["queue_offset"]): m["t"] for m in lines if m.get("ev") == "end"}
    out = {}
    for m in begins(lines):
        end = ends.get((m["queue_id"], m["queue_offset"]), killed_at)
        assert end is not None, m
        out.setdefault(m["queue_id"], []).append((m["t"], end, m["queue_offset"]))
    return out


def consumer_ids(broker, group):
    with RemotingClient(broker.config["remoting"]["port"]) as rc:
        r = rc.call(R.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
        return json.loads(r.body)["consumerIdList"] if r.code == 0 else []


def test_two_orderly_consumers_one_killed_the_survivor_takes_over_and_no_queue_is_processed_twice_at_once(
        rmq_factory, tmp_path):
    broker = rmq_factory(**FAST)  # remoting.lock_expiry_s: 60 by default
    ns = ns_of(broker)
    logs = {name: str(tmp_path / ("%s.jsonl" % name)) for name in "AB"}
    stop = str(tmp_path / "stop")
    procs = {name: start_peer(tmp_path / name, "consume", "--ns", ns, "--topic", "tO", "--group", "CGO", "--orderly",
                              "--work", 0.005, "--expect", 10**9, "--timeout", 180, "--log", logs[name],
                              "--stop-file", stop)
             for name in "AB"}
    try:
        wait_for(lambda: len(consumer_ids(broker, "CGO")) == 2, timeout=30, what="both consumers in the group")
        time.sleep(3)  # their rebalance (at once on NOTIFY_CONSUMER_IDS_CHANGED) settles before anything arrives
        producer = start_peer(tmp_path / "p", "produce", "--ns", ns, "--topic", "tO", "--count", COUNT,
                              "--orderly-keys", KEYS, "--interval", 0.01, "--quiet")
        wait_for(lambda: len(begins(lines_of(logs["A"]))) >= 50 and begins(lines_of(logs["B"])), timeout=60,
                 what="both consumers processing")
        procs["A"].kill()  # kill -9
        procs["A"].wait()
        killed_at = time.time()
        assert finish_peer(producer)[-1]["done"]
        every = {"k%d-%d" % (i % KEYS, i // KEYS) for i in range(COUNT)}
        wait_for(lambda: every <= {m["body"] for name in "AB" for m in begins(lines_of(logs[name]))},
                 timeout=EXPIRY + 30, what="every message processed by one consumer or the other")
        open(stop, "w").close()
        finish_peer(procs["B"])
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    a, b = lines_of(logs["A"]), lines_of(logs["B"])
    assert {m["pid"] for m in begins(a)} != {m["pid"] for m in begins(b)}

    # per consumer, per queue: strictly increasing offsets, and each key's messages in the order they were sent
    for lines in (a, b):
        per_queue, per_key = {}, {}
        for m in begins(lines):
            per_queue.setdefault(m["queue_id"], []).append(m["queue_offset"])
            key, n = m["body"].split("-")
            per_key.setdefault(key, []).append(int(n))
            assert m["queue_id"] == int(key[1:]) % 4  # send_orderly's hashing selector: key % queues
        for queue, offsets in per_queue.items():
            assert all(x < y for x, y in pairwise(offsets)), (queue, offsets)
        for key, ns_ in per_key.items():
            assert all(x < y for x, y in pairwise(ns_)), (key, ns_)

    # no queue ever processed by the two at once
    ia, ib = intervals(a, killed_at), intervals(b)
    for queue in set(ia) & set(ib):
        for a_begin, a_end, a_off in ia[queue]:
            for b_begin, b_end, b_off in ib[queue]:
                assert a_end <= b_begin or b_end <= a_begin, ("queue %d: A at offset %d and B at offset %d at once"
                                                              % (queue, a_off, b_off))

    # the survivor took the dead consumer's queues over, soon after the kill
    a_queues = set(ia) - {q for q, spans in ib.items() if any(begin < killed_at for begin, _e, _o in spans)}
    assert a_queues, "A had queues of its own before the kill"
    takeover = {q: min(begin for begin, _e, _o in ib[q] if begin >= killed_at) - killed_at for q in a_queues}
    print("takeover after kill -9 (s):", {q: round(t, 2) for q, t in sorted(takeover.items())})
    assert max(takeover.values()) < TAKEOVER_BOUND, takeover
