"""``Producer.send_many`` against a real broker: one future per call, the records N single sends store, frames
split at the batch limits, a refused frame failing the result with the broker's words; and its encoder, the C
helper's ``encode_sub_records``, equal to the Python reference byte for byte."""

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq import limits
from metaq.client import Message, Producer
from metaq.client.local import free_port, small_config
from metaq.client.selectors import CallableSelector
from metaq.client.security import ClientSecurity
from metaq.protocol.putbatch import encode_sub_records_py
from tests.harness.acl import SECRETS, secured_config
from tests.harness.broker import consume_all, url_of

try:
    from metaq.native._bytes import encode_sub_records as _c
except ImportError:  # not built: the Python reference is what runs
    _c = None

needs_c = pytest.mark.skipif(_c is None, reason="metaq.native._bytes was not built")


@needs_c
@settings(max_examples=300, deadline=None)
@given(topic=st.binary(min_size=1, max_size=20).map(lambda b: bytes(0x21 + x % 94 for x in b)),
       partition=st.integers(0, 2**31 - 1), seq0=st.integers(0, 2**40),
       payloads=st.lists(st.binary(max_size=300), max_size=30))
def test_the_c_encoder_equals_the_python_reference(topic, partition, seq0, payloads):
    assert _c(topic, partition, payloads, seq0) == encode_sub_records_py(topic, partition, payloads, seq0)


@needs_c
def test_the_encoders_refuse_a_payload_that_is_not_bytes():
    for encode in (_c, encode_sub_records_py):
        with pytest.raises(TypeError, match="payload 1"):
            encode(b"t", 0, [b"ok", "text"], 0)


def held(broker, topic, partition):
    with broker.client() as c:
        return consume_all(c, topic, partition)


def test_send_many_stores_what_single_sends_store(broker):
    payloads = [b"m%d" % i * (i % 7) for i in range(500)] + [b"", b"\r\nput x 0 1 0 -1 0\r\n"]
    one_partition = CallableSelector(lambda t, ps, m: ps[min(1, len(ps) - 1)])
    with Producer(brokers=[url_of(broker)], selector=one_partition) as p:
        assert p.send(Message("tmany", b"create")).success
        singles = [p.send(Message("tmany", data)) for data in payloads]
        result = p.send_many("tmany", payloads, partition=2).result(30)
    assert all(r.success and r.partition.partition == 1 for r in singles)
    assert result.success and result.error is None and result.stored == result.count == len(payloads), result
    assert result.partition.partition == 2
    one, many = held(broker, "tmany", 1), held(broker, "tmany", 2)
    first = len(many) - len(payloads)  # the topic's first message may be here
    assert [(r.payload, r.flag) for r in one[-len(payloads):]] == [(r.payload, r.flag) for r in many[first:]]
    offsets, ids = result.offsets(), result.ids()
    assert list(offsets) == list(range(first, len(many)))
    assert [r.msg_id for r in many[first:]] == list(ids)


def test_a_key_keeps_its_partition_and_calls_keep_their_order(broker):
    with Producer(brokers=[url_of(broker)]) as producer:
        assert producer.send(Message("tmanykey", b"create")).success
        futures = [producer.send_many("tmanykey", [b"%d-%d" % (c, i) for i in range(50)], key="user-7")
                   for c in range(20)]  # several frames in flight, one partition: stored in call order
        results = [f.result(30) for f in futures]
    assert all(r.success for r in results)
    assert len({r.partition for r in results}) == 1
    stored = held(broker, "tmanykey", results[0].partition.partition)
    sent = [b"%d-%d" % (c, i) for c in range(20) for i in range(50)]
    assert [r.payload for r in stored if r.payload != b"create"] == sent


def test_frames_split_at_the_message_limit(broker_factory, tmp_path):
    broker = broker_factory(small_config(tmp_path / "data", limits={"max_body_bytes": 512 * 1024}))
    n = limits.MAX_BATCH_MESSAGES
    with Producer(brokers=[url_of(broker)], batch_bytes=1 << 20, linger_ms=0) as producer:
        assert producer.send(Message("tmanysplit", b"create")).success
        at = producer.send_many("tmanysplit", [b""] * n, partition=0).result(60)
        past = producer.send_many("tmanysplit", [b""] * (n + 1), partition=0).result(60)
    assert at.success and at.stored == n  # the broker refuses a frame of one more: this one went split
    assert past.success and past.stored == n + 1, past.error
    assert past.runs[-1][0] == n and past.runs[-1][4] == 1  # a run never spans two frames: the last went alone
    start = at.offsets()[-1] + 1
    assert list(past.offsets()) == list(range(start, start + n + 1))


def test_frames_split_at_batch_bytes(broker):
    payloads = [b"%05d" % i + b"x" * 995 for i in range(1000)]  # about 1 MiB in frames of at most 64 KiB
    with Producer(brokers=[url_of(broker)], batch_bytes=64 * 1024, linger_ms=0) as producer:
        assert producer.send(Message("tmanybytes", b"create")).success
        result = producer.send_many("tmanybytes", payloads, partition=3).result(60)
    assert result.success and len(result.runs) >= 16, result.runs  # a run never spans two frames
    assert [r.payload for r in held(broker, "tmanybytes", 3) if r.payload != b"create"] == payloads


def test_a_refused_send_many_fails_with_the_brokers_words(broker_factory, tmp_path):
    broker = broker_factory(secured_config(tmp_path))
    bob = ClientSecurity("bob", SECRETS["bob"])
    with Producer(brokers=[url_of(broker)], security=bob, retry_deadline=2) as producer:
        result = producer.send_many("payroll", [b"x%d" % i for i in range(5)]).result(10)
    assert not result.success and result.stored == 0 and list(result.offsets()) == [-1] * 5
    assert result.error.code == 403 and "payroll" in str(result.error), result.error


def test_send_many_refuses_what_it_cannot_send(broker):
    with Producer(brokers=[url_of(broker)], max_body_bytes=1000) as producer:
        with pytest.raises(ValueError, match="over the limit of 1000"):
            producer.send_many("tmanybad", [b"a", b"x" * 1001])
        assert producer.send_many("tmanybad", [b"x" * 1000]).result(10).success  # at the limit
        with pytest.raises(ValueError, match="at least one"):
            producer.send_many("tmanybad", [])
        with pytest.raises(TypeError, match="payload 1 is bytearray"):
            producer.send_many("tmanybad", [b"a", bytearray(b"b")])
        with pytest.raises(ValueError, match="partitions here"):
            producer.send_many("tmanybad", [b"a"], partition=99)
        assert producer.flush(5)  # nothing refused was left counted as in progress


@pytest.mark.slow
def test_a_broker_restart_mid_stream_keeps_each_partitions_order(broker_factory, tmp_path):
    broker = broker_factory(small_config(tmp_path / "data", broker={"port": free_port()}))
    keys = ["k%d" % k for k in range(4)]
    calls, times = [], []
    stop = threading.Event()
    with Producer(brokers=[url_of(broker)], retry_deadline=30) as producer:
        assert producer.send(Message("tmanyrestart", b"create")).success

        def produce():
            c = 0
            while not stop.is_set() and c < 2000:
                key = keys[c % len(keys)]
                payloads = [b"%s %d %d" % (key.encode(), c, i) for i in range(50)]
                calls.append((key, producer.send_many("tmanyrestart", payloads, key=key)))
                c += 1
                times.append(time.monotonic())
                time.sleep(0.005)

        t = threading.Thread(target=produce)
        t.start()
        time.sleep(0.5)
        broker.stop()  # frames in flight fail, are sent again (in order) once the broker is back
        down = time.monotonic()
        time.sleep(1.0)
        up = time.monotonic()
        broker.start()
        time.sleep(0.5)
        stop.set()
        t.join()
        results = [(key, f.result(60)) for key, f in calls]
    assert all(r.success for _k, r in results), [r for _k, r in results if not r.success][:3]
    assert any(down < t < up for t in times)  # called while it was down, stored all the same
    for key in keys:  # acknowledged in call order, each key on one partition
        places = [(r.partition, r.offsets()[0]) for k, r in results if k == key]
        assert len({p for p, _o in places}) == 1 and places == sorted(places), key
    with broker.client() as c:
        for partition in range(4):
            order = {}
            for rec in consume_all(c, "tmanyrestart", partition):
                if rec.payload != b"create":
                    key, call, i = rec.payload.split()
                    order.setdefault(key, []).append((int(call), int(i)))
            for key, stored in order.items():  # a retried frame's first attempt may have been stored too
                seen = list(dict.fromkeys(stored))
                assert seen == sorted(seen), (partition, key)


def test_send_many_to_partition_0_of_a_broker_that_has_no_such_topic_yet_while_another_has(broker_factory, tmp_path):
    """Two brokers, the topic made on one by a first put: a call pinned to the other's partition 0 is sent (the
    put makes the topic there, as a Spark sink's tasks do side by side), one pinned to its partition 1 is
    refused before anything is sent."""
    from metaq.client.message import Partition

    brokers = []
    for broker_id in (7, 8):
        cfg = small_config(str(tmp_path / ("b%d" % broker_id)))
        cfg["broker"]["id"] = broker_id
        brokers.append(broker_factory(cfg))
    with Producer(brokers=[url_of(b) for b in brokers]) as producer:
        assert producer.send_many("tmixed", [b"first"], partition=Partition(8, 0)).result(10).success
        producer.discovery.invalidate("tmixed")  # asked again: broker 8 has the topic now, broker 7 not yet
        assert Partition(7, -1) in producer.discovery.partitions("tmixed")
        result = producer.send_many("tmixed", [b"a", b"b"], partition=Partition(7, 0)).result(10)
        assert result.success and str(result.partition) == "7-0"
        with pytest.raises(ValueError, match="is not one of topic tmixed's"):
            producer.send_many("tmixed", [b"c"], partition=Partition(7, 1))
    assert [m.data for m in held(brokers[0], "tmixed", 0)] == [b"a", b"b"]
