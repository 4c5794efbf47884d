"""Producer failover: kill -9 a broker while sending; nothing acknowledged may be lost."""

import threading
import time

import pytest

from metaq import errors
from metaq.client import KeySelector, Message, Producer, SendResult
from metaq.client.local import small_config
from tests.harness.broker import consume_all, wait_for
from metaq.client.local import free_port

pytestmark = [pytest.mark.fault, pytest.mark.slow]


def two_brokers(broker_factory, tmp_path, fixed_ports=False):
    brokers = {}
    for bid in (1, 2):
        cfg = small_config(tmp_path / ("data%d" % bid), broker={"id": bid})
        if fixed_ports:
            cfg["broker"]["port"] = free_port()
        brokers[bid] = broker_factory(config=cfg, workdir=tmp_path / ("b%d" % bid))
    return brokers


def payloads_on(broker, topic):
    """{(partition, offset): payload} of everything ``broker`` holds for ``topic``."""
    out = {}
    with broker.client() as c:
        for p in range(4):
            for offset, rec in enumerate(consume_all(c, topic, p)):
                out[p, offset] = rec.payload
    return out


def check_nothing_acknowledged_lost(brokers, topic, results):
    held = {bid: payloads_on(b, topic) for bid, b in brokers.items()}
    for body, r in results:
        if r.success:
            assert held[r.partition.broker_id].get((r.partition.partition, r.offset)) == body, (body, r)


def test_kill_one_of_two_brokers_while_sending(broker_factory, tmp_path):
    brokers = two_brokers(broker_factory, tmp_path)
    urls = ["meta://127.0.0.1:%d" % brokers[bid].port for bid in (1, 2)]
    topic = "tfailover"
    sync_results, async_results, killed_at = [], [], []
    stop = threading.Event()
    with Producer(brokers=urls, send_timeout=2.0, retry_deadline=8.0, suspect_time=1.0) as producer:
        for bid in (1, 2):
            with brokers[bid].client() as raw:
                raw.put_ok(topic, b"create")
        assert {p.broker_id for p in producer.partitions(topic)} == {1, 2}
        assert all(p.partition >= 0 for p in producer.partitions(topic))

        def sync_sender():
            i = 0
            while not stop.is_set():
                body = b"s%d" % i
                result = producer.send(Message(topic, body))
                assert isinstance(result, SendResult)
                sync_results.append((time.monotonic(), body, result))
                i += 1

        def async_sender():  # many puts in flight when the broker dies
            i = 0
            while not stop.is_set():
                batch = [(b"a%d" % (i + k), producer.send_async(Message(topic, b"a%d" % (i + k)))) for k in range(50)]
                async_results.extend((body, f.result(30)) for body, f in batch)
                i += 50

        threads = [threading.Thread(target=sync_sender), threading.Thread(target=async_sender)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # a load under way; and both brokers acknowledged sync sends before the kill (asserted below)
        try:
            wait_for(lambda: {r.partition.broker_id for _, _, r in list(sync_results) if r.success} == {1, 2}, 30,
                     "sync sends acknowledged by both brokers")
        except AssertionError:
            stop.set()
            raise
        killed_at.append(time.monotonic())
        brokers[1].kill()
        time.sleep(3.0)
        stop.set()
        for t in threads:
            t.join(60)
    assert not any(t.is_alive() for t in threads)
    before = [r for at, _, r in sync_results if at < killed_at[0]]
    later = [r for at, _, r in sync_results if at > killed_at[0] + 1.5]
    assert {r.partition.broker_id for r in before if r.success} == {1, 2}
    assert later and all(r.success and r.partition.broker_id == 2 for r in later), later[:3]
    failed = [r for _, _, r in sync_results if not r.success] + [r for _, r in async_results if not r.success]
    assert all(isinstance(r.error, errors.MetaqError) for r in failed)
    assert len(failed) <= 5  # retries move nearly every send to the living broker
    assert sum(r.success for _, r in async_results) > 100

    brokers[1].start()  # sync flush: everything broker 1 acknowledged is still there after kill -9
    results = [(body, r) for _, body, r in sync_results] + async_results
    check_nothing_acknowledged_lost(brokers, topic, results)


def test_keyed_messages_are_not_moved_to_another_broker(broker_factory, tmp_path):
    brokers = two_brokers(broker_factory, tmp_path, fixed_ports=True)
    urls = ["meta://127.0.0.1:%d" % brokers[bid].port for bid in (1, 2)]
    topic = "tkeyfail"
    with Producer(brokers=urls, selector=KeySelector(), send_timeout=1.0, retry_deadline=1.5) as producer:
        for bid in (1, 2):
            with brokers[bid].client() as raw:
                raw.put_ok(topic, b"create")
        partitions = producer.partitions(topic)
        assert [p.broker_id for p in partitions] == [1] * 4 + [2] * 4
        keys = {}
        for n in range(100):
            p = KeySelector().select(topic, partitions, Message(topic, b"", key="k%d" % n))
            keys.setdefault(p.broker_id, "k%d" % n)
        on_1, on_2 = keys[1], keys[2]
        first = producer.send(Message(topic, b"before", key=on_1))
        assert first.success and first.partition.broker_id == 1
        brokers[1].kill()
        started = time.monotonic()
        result = producer.send(Message(topic, b"during", key=on_1))
        assert not result.success and isinstance(result.error, errors.Unavailable)
        assert result.partition == first.partition  # retried on its own partition only
        assert 1.0 <= time.monotonic() - started < 6
        assert producer.send(Message(topic, b"other key", key=on_2)).success
        brokers[1].start()  # same port
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            after = producer.send(Message(topic, b"after", key=on_1))
            if after.success:
                break
        assert after.success and after.partition == first.partition and after.offset == first.offset + 1
    held = payloads_on(brokers[2], topic)
    assert b"during" not in held.values()
