"""The batching Producer (``batch_bytes``) against real brokers: futures, linger, order across a restart."""

import threading
import time

import pytest

from metaq.client import KeySelector, Message, Producer
from metaq.client.local import free_port, small_config
from metaq.client.security import ClientSecurity
from tests.harness.acl import SECRETS, secured_config
from tests.harness.broker import consume_all, url_of


def held(broker, topic, partitions=4):
    with broker.client() as c:
        return {p: consume_all(c, topic, p) for p in range(partitions)}


def test_futures_resolve_with_their_offsets_in_order(broker):
    with Producer(brokers=[url_of(broker)], batch_bytes=16 * 1024, linger_ms=20) as producer:
        assert producer.send(Message("tbatched", b"create")).success  # the topic's partitions known from here
        futures = [producer.send_async(Message("tbatched", b"m%d" % i)) for i in range(3000)]
        results = [f.result(60) for f in futures]
    assert all(r.success for r in results), [r for r in results if not r.success][:3]
    stored = held(broker, "tbatched")
    for i, r in enumerate(results):
        assert stored[r.partition.partition][r.offset].payload == b"m%d" % i
        assert stored[r.partition.partition][r.offset].msg_id == r.msg_id
    by_partition = {}
    for r in results:
        by_partition.setdefault(r.partition.partition, []).append(r.offset)
    assert len(by_partition) == 4
    assert all(offsets == sorted(offsets) for offsets in by_partition.values())  # in send order per partition


def test_linger_sends_a_partial_batch(broker):
    with Producer(brokers=[url_of(broker)], batch_bytes=1 << 20, linger_ms=200) as producer:
        assert producer.send(Message("tlinger", b"create")).success
        sent = time.monotonic()
        future = producer.send_async(Message("tlinger", b"alone"))
        result = future.result(10)  # no flush: the batch, far from full, goes when its linger ends
        waited = time.monotonic() - sent
    assert result.success and waited >= 0.18, (result, waited)
    assert held(broker, "tlinger")[result.partition.partition][result.offset].payload == b"alone"


def test_a_sync_send_does_not_wait_for_the_linger(broker):
    with Producer(brokers=[url_of(broker)], batch_bytes=1 << 20, linger_ms=30000) as producer:
        assert producer.send(Message("tnolinger", b"create")).success
        started = time.monotonic()
        result = producer.send(Message("tnolinger", b"now"))
        assert result.success and time.monotonic() - started < 15, result  # not the 30 s linger
    assert held(broker, "tnolinger")[result.partition.partition][result.offset].payload == b"now"


def test_a_refused_batch_fails_each_of_its_messages(broker_factory, tmp_path):
    broker = broker_factory(secured_config(tmp_path))
    bob = ClientSecurity("bob", SECRETS["bob"])
    with Producer(brokers=[url_of(broker)], batch_bytes=4096, security=bob, retry_deadline=2) as producer:
        results = [f.result(10) for f in [producer.send_async(Message("payroll", b"x%d" % i)) for i in range(5)]]
    assert [r.success for r in results] == [False] * 5
    assert {r.error.code for r in results} == {403}


@pytest.mark.slow
def test_a_broker_restart_mid_stream_keeps_each_partitions_order(broker_factory, tmp_path):
    port = free_port()
    cfg = small_config(tmp_path / "data", broker={"port": port})
    broker = broker_factory(cfg)
    keys = ["k%d" % k for k in range(8)]
    sent, times = [], []
    stop = threading.Event()
    with Producer(brokers=[url_of(broker)], batch_bytes=4096, linger_ms=2, selector=KeySelector(),
                  retry_deadline=30) as producer:
        assert producer.send(Message("trestart", b"create", key="k0")).success

        def produce():
            i = 0
            while not stop.is_set() and i < 20000:
                key = keys[i % len(keys)]
                sent.append((key, producer.send_async(Message("trestart", b"%s %d" % (key.encode(), i), key=key))))
                i += 1
                if i % 100 == 0:
                    times.append(time.monotonic())
                    time.sleep(0.01)

        t = threading.Thread(target=produce)
        t.start()
        time.sleep(0.5)
        broker.stop()  # sends in flight fail, are retried until the broker is back
        down = time.monotonic()
        time.sleep(1.0)
        up = time.monotonic()
        broker.start()
        time.sleep(0.5)
        stop.set()
        t.join()
        results = [(key, f.result(60)) for key, f in sent]
    assert all(r.success for _k, r in results), [r for _k, r in results if not r.success][:3]
    assert len(results) > 1000 and any(down < t < up for t in times)  # sent while it was down, stored all the same
    for key in keys:  # acknowledged in send order, each key on its partition
        places = [(r.partition, r.offset) for k, r in results if k == key]
        assert len({p for p, _o in places}) == 1 and places == sorted(places), key
    for partition, records in held(broker, "trestart").items():  # stored in send order per key (a retried batch's
        firsts = {}                                                 # first attempt may have been stored too)
        for rec in records:
            if rec.payload != b"create":
                key, n = rec.payload.split()
                firsts.setdefault(key, []).append(int(n))
        for key, ns in firsts.items():
            seen = list(dict.fromkeys(ns))  # first occurrences
            assert seen == sorted(seen), (partition, key)


def first_partition(topic, partitions, message):
    return partitions[0]


def test_a_batch_of_ten_thousand_resolves_each_future_with_its_own_place(broker_factory, tmp_path):
    """One batch of limits.MAX_BATCH_MESSAGES: each future its own id and offset, each message's fields set."""
    broker = broker_factory(small_config(tmp_path / "data", limits={"max_body_bytes": 1 << 20},
                                         store={"segment_size": 4 << 20}))
    with Producer(brokers=[url_of(broker)], batch_bytes=1 << 20, linger_ms=60_000,
                  selector=first_partition) as producer:
        assert producer.send(Message("tten", b"create")).success
        messages = [Message("tten", b"n%d" % i) for i in range(10_000)]
        futures = [producer.send_async(m) for m in messages]
        results = [f.result(30) for f in futures]  # the batch closed on its count: no flush, no linger
    assert all(r.success for r in results), [r for r in results if not r.success][:3]
    first = results[0]
    assert [r.offset for r in results] == list(range(first.offset, first.offset + 10_000))
    assert len({r.msg_id for r in results}) == 10_000
    assert [(m.id, m.partition, m.offset) for m in messages] == [(r.msg_id, r.partition, r.offset) for r in results]
    stored = held(broker, "tten", 1)[0]
    assert [(stored[r.offset].payload, stored[r.offset].msg_id) for r in results] == [
        (b"n%d" % i, r.msg_id) for i, r in enumerate(results)]


def test_plain_and_attributed_messages_share_a_batch_in_order(broker):
    """Messages with an attribute or a key (an attribute block, another flag) go in the same batch as plain ones;
    every one is stored as sent, in send order."""
    with Producer(brokers=[url_of(broker)], batch_bytes=1 << 16, linger_ms=50,
                  selector=first_partition) as producer:
        assert producer.send(Message("tmixed", b"create")).success
        messages = [Message("tmixed", b"p%d" % i, attribute="a%d" % i if i % 3 == 1 else None,
                            key="k%d" % i if i % 3 == 2 else None) for i in range(300)]
        results = [f.result(30) for f in [producer.send_async(m) for m in messages]]
    assert all(r.success for r in results)
    assert [r.offset for r in results] == list(range(results[0].offset, results[0].offset + 300))
    with broker.client() as c:
        stored = consume_all(c, "tmixed", 0)
    got = [Message.from_record("tmixed", None, r.offset, stored[r.offset]) for r in results]
    assert [(m.body, m.attribute, m.properties.get("KEYS")) for m in got] == [
        (b"p%d" % i, "a%d" % i if i % 3 == 1 else None, "k%d" % i if i % 3 == 2 else None) for i in range(300)]


def test_futures_work_with_callbacks_wait_and_asyncio(broker):
    """A send's future is a concurrent.futures.Future: callbacks (each once), wait, as_completed, wrap_future."""
    import asyncio
    import concurrent.futures

    called = []
    with Producer(brokers=[url_of(broker)], batch_bytes=1 << 16, linger_ms=20) as producer:
        assert producer.send(Message("tfut", b"create")).success
        futures = [producer.send_async(Message("tfut", b"c%d" % i), callback=called.append) for i in range(500)]
        waiting = [producer.send_async(Message("tfut", b"w%d" % i)) for i in range(500)]
        done, not_done = concurrent.futures.wait(waiting, timeout=30)
        assert len(done) == 500 and not not_done
        assert len(list(concurrent.futures.as_completed(futures, timeout=30))) == 500
        late = []
        futures[0].add_done_callback(late.append)  # added once done: called at once
        assert late == [futures[0]] and not futures[0].cancel() and futures[0].done()

        async def awaited():
            return await asyncio.wrap_future(producer.send_async(Message("tfut", b"aio")))
        assert asyncio.run(awaited()).success
    assert sorted(r.offset for r in called) == sorted(f.result().offset for f in futures)


def test_a_refused_batch_fails_every_future_with_the_error(broker_factory, tmp_path):
    """A batch of 2,000 refused whole (403): each future fails with that error, each callback runs once."""
    broker = broker_factory(secured_config(tmp_path))
    bob = ClientSecurity("bob", SECRETS["bob"])
    called = []
    with Producer(brokers=[url_of(broker)], batch_bytes=1 << 20, linger_ms=50, security=bob,
                  retry_deadline=2) as producer:
        futures = [producer.send_async(Message("payroll", b"x%d" % i), callback=called.append) for i in range(2000)]
        results = [f.result(10) for f in futures]
        assert producer.flush(5)
    assert [r.success for r in results] == [False] * 2000
    assert {r.error.code for r in results} == {403} and len(called) == 2000
