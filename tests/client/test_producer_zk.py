"""Producer with ZooKeeper discovery: MetaQ's layout, written by hand or by the brokers themselves."""

import collections
import time

import pytest

from metaq.client import Message, Partition, Producer
from metaq.client.local import small_config
from tests.harness.broker import wait_for
from tests.harness.registrar import Registrar


def test_partitions_from_hand_written_nodes_follow_changes(broker_factory, tmp_path, zk_connect):
    brokers = {bid: broker_factory(config=small_config(tmp_path / ("d%d" % bid), broker={"id": bid}))
               for bid in (1, 2)}
    registrar = Registrar(zk_connect)
    try:
        for bid, b in brokers.items():
            registrar.broker(bid, "meta://127.0.0.1:%d" % b.port)
            registrar.topic("tzk", bid, 4)
        with Producer(zk_connect=zk_connect) as producer:
            assert producer.partitions("tzk") == [Partition(b, p) for b in (1, 2) for p in range(4)]
            results = [producer.send(Message("tzk", b"%d" % i)) for i in range(16)]
            assert all(r.success for r in results)
            assert collections.Counter(r.partition for r in results) == {
                Partition(b, p): 2 for b in (1, 2) for p in range(4)}

            registrar.remove_broker(1)  # broker 1's session ended: its nodes are gone
            assert wait_for(lambda: producer.partitions("tzk") == [Partition(2, p) for p in range(4)])
            later = [producer.send(Message("tzk", b"later")) for _ in range(8)]
            assert all(r.success and r.partition.broker_id == 2 for r in later)

            registrar.broker(1, "meta://127.0.0.1:%d" % brokers[1].port)
            registrar.topic("tzk", 1, 4)
            assert wait_for(lambda: len(producer.partitions("tzk")) == 8)
            back = [producer.send(Message("tzk", b"back")) for _ in range(8)]
            assert {r.partition.broker_id for r in back} == {1, 2}
    finally:
        registrar.close()


@pytest.mark.slow
@pytest.mark.fault
def test_self_registered_brokers_and_a_dead_one(broker_factory, tmp_path, zk_connect):
    brokers = {}
    for bid in (1, 2):
        cfg = small_config(tmp_path / ("d%d" % bid), broker={"id": bid},
                           zk={"connect": zk_connect, "session_timeout_ms": 4000})
        brokers[bid] = broker_factory(config=cfg)
    with Producer(zk_connect=zk_connect, send_timeout=2.0, retry_deadline=10.0, suspect_time=1.0) as producer:
        assert wait_for(lambda: {p.broker_id for p in producer.partitions("tnew")} == {1, 2})
        # nobody has the topic yet: the first puts let the brokers create it, then they register it
        assert producer.partitions("tnew") == [Partition(1, -1), Partition(2, -1)]
        first = [producer.send(Message("tnew", b"first")) for _ in range(4)]
        assert all(r.success for r in first)
        assert wait_for(lambda: all(p.partition >= 0 for p in producer.partitions("tnew"))
                        and len(producer.partitions("tnew")) >= 4)
        for bid in (1, 2):  # make sure both brokers have it
            with brokers[bid].client() as raw:
                raw.put_ok("tnew", b"create")
        assert wait_for(lambda: len(producer.partitions("tnew")) == 8)

        brokers[1].kill()  # kill -9: its ephemeral nodes vanish when the session expires
        killed = time.monotonic()
        results = []
        while time.monotonic() - killed < 12 and producer.partitions("tnew") != [Partition(2, p) for p in range(4)]:
            results.append(producer.send(Message("tnew", b"during")))
        assert producer.partitions("tnew") == [Partition(2, p) for p in range(4)]
        assert all(r.success for r in results), [r for r in results if not r.success][:3]
        after = [producer.send(Message("tnew", b"after")) for _ in range(8)]
        assert all(r.success and r.partition.broker_id == 2 for r in after)


def test_zookeeper_discovery_under_gevent_monkey_patching(broker_factory, tmp_path, zk_connect):
    from tests.harness.gevent_producer import run_gevent_script

    broker = broker_factory(config=small_config(tmp_path / "d", zk={"connect": zk_connect}))
    run_gevent_script("meta://127.0.0.1:%d" % broker.port, zk_connect)
