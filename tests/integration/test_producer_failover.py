"""A metaq producer in ZooKeeper mode follows an elected master (issue 17, point 4): the master of an ``ha: auto``
group is killed (kill -9) while a producer sends; with a retry deadline longer than the switch (the dead
master's session timeout, the election, the new master's registration), no send fails and every acknowledged
message is on the new master at the partition and offset its acknowledgement gave. (The clean-stop case runs
through Fabric: tests/deploy/test_pairs.py::test_an_auto_pair_rolling_restart_fails_no_send.)"""

import threading
import time

import pytest

from metaq.client import Message, Producer
from tests.harness.broker import consume_all, wait_for
from tests.harness.ha import SESSION_MS, Group

pytestmark = [pytest.mark.fault, pytest.mark.slow]

TOPIC = "t-follow"  # "t*": 4 partitions in small_config


class Sender:
    """A thread sending numbered messages one at a time: ``results`` = [(body, SendResult, sent at, answered at)]
    (monotonic clock)."""

    def __init__(self, producer):
        self.producer, self.results, self.stop = producer, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        i = 0
        while not self.stop.is_set():
            body, sent = b"m-%06d" % i, time.monotonic()
            self.results.append((body, self.producer.send(Message(TOPIC, body)), sent, time.monotonic()))
            i += 1

    def wait_for_more(self, n, what, timeout=60):
        count = len(self.results)
        wait_for(lambda: len(self.results) >= count + n, timeout, what)

    def close(self):
        self.stop.set()
        self.thread.join(60)
        return self.results


def held(broker):
    """{(partition, offset): payload} of everything ``broker`` stores for TOPIC."""
    with broker.client() as c:
        return {(p, offset): rec.payload for p in range(4) for offset, rec in enumerate(consume_all(c, TOPIC, p))}


def test_a_zookeeper_producer_follows_a_killed_master_with_no_failed_send(broker_factory, tmp_path, zk_connect):
    g = Group(broker_factory, tmp_path, zk_connect, n=3, mode="sync")
    first = g.master()
    others = [i for i in range(3) if i != first]
    g.following(first, others)
    producer = Producer(zk_connect=zk_connect, retry_deadline=30.0)
    try:
        sender = Sender(producer)
        sender.wait_for_more(200, "200 sends before the kill")
        g.members[first].kill()
        killed_at = time.monotonic()
        second = g.master(timeout=SESSION_MS / 1000.0 * 3 + 10, exclude=(first,))
        elected_at = time.monotonic()
        sender.wait_for_more(200, "200 sends after the election")
        results = sender.close()
    finally:
        producer.close()
    failed = [(body, res.error) for body, res, _s, _t in results if not res.success]
    assert failed == [], "%d of %d sends failed: %s" % (len(failed), len(results), failed[:3])
    # the send in flight at the kill was retried until the new master took it: nothing could ack it sooner
    spanning = max((answered for _b, _r, sent, answered in results if sent < killed_at < answered), default=None)
    assert spanning is not None, "no send was in flight at the kill"
    assert spanning - killed_at >= SESSION_MS / 1000.0 * 0.5, spanning - killed_at
    print("\nmetaq producer (ZooKeeper), master killed: elected %.1f s after, the send in flight then acknowledged "
          "%.1f s after; %d sends, none failed" % (elected_at - killed_at, spanning - killed_at, len(results)))
    stored = held(g.members[second])
    lost = [body for body, res, _s, _t in results if stored.get((res.partition.partition, res.offset)) != body]
    assert lost == [], "%d of %d acknowledged messages are not on the new master at their offset: %s" % (
        len(lost), len(results), lost[:5])
