"""A consumer group end to end: two real brokers registered in ZooKeeper, three consumer processes, a producer.

Topic "orders" has 4 partitions on broker 1 and 4 on broker 2. Each consumer process
(tests/harness/consumer_proc.py) logs "<partition> <offset> <payload>" per handled message.
"""

import collections
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from metaq.client import Message, Producer
from metaq.client.local import small_config
from tests.harness.broker import wait_for as wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GROUP, TOPIC = "billing", "orders"
OWNERS = "/meta/consumers/%s/owners/%s" % (GROUP, TOPIC)
OFFSETS = "/meta/consumers/%s/offsets/%s" % (GROUP, TOPIC)
EIGHT = sorted("%d-%d" % (b, p) for b in (1, 2) for p in range(4))
SESSION_TIMEOUT = 4.0


class ConsumerProc:
    def __init__(self, workdir, zk_connect, name):
        self.name, self.member_id = name, "%s_%s" % (GROUP, name)
        self.out = os.path.join(str(workdir), "%s.out" % name)
        self.log = open(os.path.join(str(workdir), "%s.log" % name), "ab")
        cmd = [sys.executable, "-m", "tests.harness.consumer_proc", "--zk", zk_connect, "--group", GROUP,
               "--topic", TOPIC, "--id", name, "--out", self.out, "--session-timeout", str(SESSION_TIMEOUT),
               "--commit-interval", "1.0", "--handler-delay", "0.002"]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)

    def ready(self):
        if self.proc.poll() is not None:
            raise AssertionError("consumer %s exited with %s" % (self.name, self.proc.returncode))
        return os.path.exists(self.out + ".ready")

    def lines(self):
        """[(partition, offset, payload)] of whole lines written so far."""
        try:
            with open(self.out, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return []
        result = []
        for line in text.split("\n")[:-1]:  # a torn last line (kill -9) has no newline
            part, offset, payload = line.split(" ", 2)
            result.append((part, int(offset), payload))
        return result

    def close(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.log.close()


@pytest.fixture
def group_cluster(broker_factory, zk_connect, tmp_path):
    """Two brokers (ids 1 and 2) registered under zk_connect, "orders" with 4 partitions on each."""
    zk = KazooClient(hosts=zk_connect, timeout=10)
    zk.start(timeout=15)
    brokers = []
    for broker_id in (1, 2):
        cfg = small_config(tmp_path / ("data%d" % broker_id), broker={"id": broker_id}, zk={"connect": zk_connect},
                           topics=[{"name": TOPIC, "partitions": 4}])
        brokers.append(broker_factory(cfg))
    sub = "/meta/brokers/topics-sub/%s" % TOPIC
    wait_until(lambda: zk.exists(sub) and sorted(zk.get_children(sub)) == ["1-m", "2-m"], 15,
               "both brokers registered in topics-sub")
    yield zk, brokers
    zk.stop()
    zk.close()


def owners(zk):
    result = {}
    try:
        children = zk.get_children(OWNERS)
    except NoNodeError:
        return result
    for child in children:
        try:
            result[child] = zk.get("%s/%s" % (OWNERS, child))[0].decode()
        except NoNodeError:
            pass
    return result


def committed(zk, part):
    try:
        return int(zk.get("%s/%s" % (OFFSETS, part))[0].decode().rsplit("-", 1)[1])
    except NoNodeError:
        return 0


def shares(zk):
    """{member id: sorted partitions} from the owner nodes."""
    by_member = collections.defaultdict(list)
    for part, member in owners(zk).items():
        by_member[member].append(part)
    return {m: sorted(p) for m, p in by_member.items()}


@pytest.mark.slow
@pytest.mark.fault
def test_three_consumer_processes_split_the_partitions_and_survive_a_kill_9(group_cluster, zk_connect, tmp_path):
    cluster = group_cluster
    zk, _brokers = cluster
    consumers = [ConsumerProc(tmp_path, zk_connect, name) for name in ("c1", "c2", "c3")]
    producer = Producer(zk_connect=zk_connect, zk_session_timeout=SESSION_TIMEOUT)
    sent = {}  # (partition, offset) -> payload
    try:
        wait_until(lambda: all(c.ready() for c in consumers), 30, "three consumers started")
        ids = {c.member_id for c in consumers}
        wait_until(lambda: sorted(owners(zk)) == EIGHT and set(owners(zk).values()) == ids, 15,
                   lambda: "three owners over 8 partitions: %s" % owners(zk))
        before = shares(zk)
        assert sorted(len(p) for p in before.values()) == [2, 3, 3]  # range assignment of 8 over 3

        def produce(first, count, pause):
            for i in range(first, first + count):
                result = producer.send(Message(TOPIC, b"m%d" % i))
                assert result.success, result.error
                sent[(str(result.partition), result.offset)] = "m%d" % i
                time.sleep(pause)

        produce(0, 200, 0.0)
        victim = consumers[1]
        wait_until(lambda: len(victim.lines()) >= 10, 15, "the victim consuming")
        # keep messages flowing while the victim dies
        feeder = threading.Thread(target=produce, args=(200, 400, 0.005), daemon=True)
        feeder.start()
        time.sleep(0.3)
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(10)
        killed_at = time.monotonic()
        victim_parts = before[victim.member_id]
        last_commit = {p: committed(zk, p) for p in victim_parts}  # nobody else may commit them yet

        survivors = [c for c in consumers if c is not victim]
        wait_until(lambda: sorted(owners(zk)) == EIGHT and set(owners(zk).values()) == {c.member_id for c in survivors},
                   15, lambda: "survivors own everything: %s" % owners(zk))
        takeover = time.monotonic() - killed_at
        assert takeover < SESSION_TIMEOUT * 3, takeover
        feeder.join(60)
        assert not feeder.is_alive() and len(sent) == 600

        def consumed():
            return collections.Counter((p, o) for c in consumers for p, o, _ in c.lines())

        wait_until(lambda: set(consumed()) >= set(sent), 30,
                   lambda: "all consumed; missing %s" % sorted(set(sent) - set(consumed()))[:10])
        seen = consumed()
        for c in consumers:
            for part, offset, payload in c.lines():
                assert sent[(part, offset)] == payload, (c.name, part, offset)
        duplicates = {k: n for k, n in seen.items() if n > 1}
        for (part, offset), n in duplicates.items():
            assert n == 2 and part in victim_parts and offset >= last_commit[part], (part, offset, n, last_commit)
        # the survivors never re-read what they had consumed themselves
        for c in survivors:
            mine = collections.Counter((p, o) for p, o, _ in c.lines())
            assert max(mine.values()) == 1
        print("takeover %.1f s, %d duplicates after the kill of %s (owned %s, committed %s)" %
              (takeover, len(duplicates), victim.name, victim_parts, last_commit))
    finally:
        producer.close()
        for c in consumers:
            c.close()
