"""Producer in direct mode (a broker list) against real broker processes."""

import collections
import threading
import time

import pytest

from metaq import errors, limits
from metaq.client import KeySelector, Message, Partition, Producer, RandomSelector, RoundRobinSelector, SendResult
from metaq.client.local import free_port
from tests.harness.broker import consume_all, url_of
from tests.harness.gevent_producer import run_gevent_script


def stored(broker, topic, partitions=4):
    """{partition: [records]} of everything the broker holds for ``topic``."""
    with broker.client() as c:
        return {p: consume_all(c, topic, p) for p in range(partitions)}


@pytest.fixture
def producer(broker):
    """A producer whose puts may take 30 s each (its attempt and its send): the tests count what is stored, and on a
    slow machine a put queued behind thousands outlasts the default send timeout and its retry stores it again."""
    p = Producer(brokers=[url_of(broker)], send_timeout=30, retry_deadline=30)
    yield p
    p.close()


def test_sync_send_fills_result_and_message(broker, producer):
    msg = Message("tsync", b"hello \x00 world", attribute="type=greeting;\u00e9")
    result = producer.send(msg)
    assert isinstance(result, SendResult) and result.success and result.error is None
    assert result.partition.broker_id == 7 and 0 <= result.partition.partition < 4
    assert result.offset == 0 and result.msg_id > 0
    assert (msg.id, msg.partition, msg.offset) == (result.msg_id, result.partition, result.offset)
    with broker.client() as raw:
        [record] = raw.get_records("tsync", result.partition.partition, result.offset)
    assert record.msg_id == result.msg_id
    assert record.payload == b"hello \x00 world" and record.attribute == "type=greeting;\u00e9"
    assert (record.flag, record.data) == msg.encode()  # exactly the bytes sent, checksum verified on read

    plain = Message("tsync", b"")
    assert producer.send(plain).success
    with broker.client() as raw:
        [record] = raw.get_records("tsync", plain.partition.partition, plain.offset)
    assert record.flag == 0 and record.data == b"" and record.attribute is None


def test_async_sends_are_all_acknowledged(broker, producer):
    producer.send(Message("tasync", b"create"))
    calls = collections.Counter()
    lock = threading.Lock()

    def callback(result):
        with lock:
            calls[result.offset, result.partition] += 1

    futures = [producer.send_async(Message("tasync", b"m%d" % i), callback=callback) for i in range(2000)]
    results = [f.result(60) for f in futures]
    assert all(r.success for r in results), [r for r in results if not r.success][:3]
    places = {(r.partition, r.offset) for r in results}
    assert len(places) == 2000
    assert producer.flush(10)
    assert sum(calls.values()) == 2000 and set(calls.values()) == {1}
    held = stored(broker, "tasync")
    assert sum(len(v) for v in held.values()) == 2001
    by_place = {(Partition(7, p), i): rec.payload for p, recs in held.items() for i, rec in enumerate(recs)}
    for i, r in enumerate(results):
        assert by_place[r.partition, r.offset] == b"m%d" % i


def test_oneway_messages_arrive(broker, producer):
    for i in range(50):
        assert producer.send_oneway(Message("toneway", b"o%d" % i)) is True
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        payloads = sorted(rec.payload for recs in stored(broker, "toneway").values() for rec in recs)
        if len(payloads) == 50:
            break
        time.sleep(0.1)
    assert payloads == sorted(b"o%d" % i for i in range(50))


def test_round_robin_spreads_evenly(broker):
    with Producer(brokers=[url_of(broker)], selector=RoundRobinSelector()) as producer:
        assert producer.partitions("tround") == [Partition(7, -1)]  # not created yet: the broker picks
        assert producer.send(Message("tround", b"first")).success
        assert producer.partitions("tround") == [Partition(7, p) for p in range(4)]
        counts = collections.Counter(producer.send(Message("tround", b"x")).partition for _ in range(400))
    assert counts == {Partition(7, p): 100 for p in range(4)}


def test_random_selector_uses_every_partition(broker):
    with Producer(brokers=[url_of(broker)], selector=RandomSelector(seed=1)) as producer:
        producer.send(Message("trandom", b"first"))
        futures = [producer.send_async(Message("trandom", b"x")) for _ in range(200)]
        counts = collections.Counter(f.result(30).partition for f in futures)
    assert set(counts) == {Partition(7, p) for p in range(4)}


def test_key_selector_keeps_a_key_on_one_partition_in_order(broker):
    with Producer(brokers=[url_of(broker)], selector=KeySelector()) as producer:
        producer.send(Message("tkeyed", b"create", key="setup"))
        futures = [(k, i, producer.send_async(Message("tkeyed", b"%d:%d" % (k, i), key="user-%d" % k)))
                   for i in range(20) for k in range(10)]
        where = collections.defaultdict(list)
        for k, _i, f in futures:
            r = f.result(30)
            assert r.success
            where[k].append((r.partition, r.offset))
        with pytest.raises(ValueError, match="key"):
            producer.send(Message("tkeyed", b"no key"))
    for k, places in where.items():
        assert len({p for p, _ in places}) == 1, (k, places)  # one key, one partition
        offsets = [o for _, o in places]
        assert offsets == sorted(offsets)  # in the order sent
    assert len({places[0][0] for places in where.values()}) > 1  # keys spread over partitions
    again = KeySelector().select("tkeyed", [Partition(7, p) for p in range(4)], Message("t", b"", key="user-3"))
    assert again == where[3][0][0]  # stable: a fresh selector maps the key the same way


def test_custom_selectors(broker):
    def last(topic, partitions, message):
        return partitions[-1]

    class Second:
        def select(self, topic, partitions, message):
            return partitions[1]

    for selector, expected in ((last, 3), (Second(), 1)):
        with Producer(brokers=[url_of(broker)], selector=selector) as producer:
            producer.send(Message("tcustom", b"create"))
            results = [producer.send(Message("tcustom", b"x")) for _ in range(5)]
        assert {r.partition for r in results} == {Partition(7, expected)}


def test_bad_messages_raise_and_store_nothing(broker, producer):
    with pytest.raises(errors.InvalidTopic):
        producer.send(Message("bad topic", b"x"))
    with pytest.raises(errors.InvalidTopic):
        producer.send_async(Message("../etc", b"x"))
    with pytest.raises(ValueError, match="over the limit"):
        producer.send(Message("tbig", b"x" * (limits.MAX_BODY_BYTES + 1)))
    with pytest.raises(ValueError, match="over the limit"):
        producer.send(Message("tbig", b"x" * (limits.MAX_BODY_BYTES - 2), attribute="abc"))
    with pytest.raises(TypeError):
        producer.send(b"not a message")
    # over this broker's own limit (256 KiB) but not the client's: the broker's 400, not retried, nothing stored
    started = time.monotonic()
    result = producer.send(Message("tbig", b"x" * (300 * 1024)))
    assert not result.success and isinstance(result.error, errors.ClientError)
    assert "exceeds the limit" in str(result.error)
    assert time.monotonic() - started < 5
    assert producer.send(Message("tbig", b"small")).success  # the producer reconnects and goes on
    with broker.client() as raw:
        topics = raw.stats("topics")
        assert "bad" not in topics and "etc" not in topics
    assert [rec.payload for recs in stored(broker, "tbig").values() for rec in recs] == [b"small"]


def test_topic_the_broker_refuses(broker_factory, tmp_path):
    from metaq.client.local import small_config

    broker = broker_factory(config=small_config(tmp_path / "d", topics=[{"name": "t*", "partitions": 4}]))
    with Producer(brokers=[url_of(broker)]) as producer:
        result = producer.send(Message("other", b"x"))
    assert not result.success and isinstance(result.error, errors.ClientError)
    assert "does not accept topic" in str(result.error)


@pytest.mark.integration
def test_unreachable_brokers_give_a_failed_result():
    with Producer(brokers=["meta://127.0.0.1:%d" % free_port()], retry_deadline=1.0, send_timeout=0.5) as producer:
        started = time.monotonic()
        result = producer.send(Message("tdown", b"x"))
        assert not result.success and isinstance(result.error, errors.Unavailable)
        assert time.monotonic() - started < 30  # gave up after its 1 s retry deadline: it does not hang
        future = producer.send_async(Message("tdown", b"x"))
        assert not future.result(10).success
        assert producer.send_oneway(Message("tdown", b"x")) is False


@pytest.mark.integration
def test_a_closed_port_is_named_with_connection_refused():
    url = "meta://127.0.0.1:%d" % free_port()  # nobody listens there
    with Producer(brokers=[url], retry_deadline=1.0, send_timeout=0.5) as producer:
        result = producer.send(Message("tdown", b"x"))
    assert not result.success and isinstance(result.error, errors.Unavailable)
    assert str(result.error) == ("no partition is available for topic tdown: cannot connect to %s: "
                                 "connection refused" % url)


@pytest.mark.integration
def test_a_broker_that_stopped_is_named_with_connection_refused(broker):
    with Producer(brokers=[url_of(broker)], retry_deadline=1.0, send_timeout=0.5, refresh_interval=0.0) as producer:
        assert producer.send(Message("tgone", b"x")).success
        broker.stop()
        result = producer.send(Message("tgone", b"y"))
    assert not result.success and "cannot connect to %s" % url_of(broker) in str(result.error)
    assert "connection refused" in str(result.error)


def test_close_waits_for_sends_in_progress(broker):
    producer = Producer(brokers=url_of(broker))  # a comma-separated string works too
    futures = [producer.send_async(Message("tclose", b"%d" % i)) for i in range(500)]
    producer.close()
    assert all(f.done() and f.result().success for f in futures)
    with pytest.raises(RuntimeError):
        producer.send(Message("tclose", b"late"))


def test_constructor_needs_exactly_one_source():
    with pytest.raises(ValueError):
        Producer()
    with pytest.raises(ValueError):
        Producer(zk_connect="127.0.0.1:2181", brokers=["meta://127.0.0.1:1"])
    with pytest.raises(ValueError):
        Producer(brokers=["http://nope"])
    with pytest.raises(TypeError):
        Producer(brokers=["meta://127.0.0.1:1"], selector=42)


def test_threads_share_one_producer(broker, producer):
    producer.send(Message("tthreads", b"create"))
    results = []

    def worker(n):
        for i in range(100):
            results.append(producer.send(Message("tthreads", b"%d-%d" % (n, i))))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(results) == 600 and all(r.success for r in results)
    assert len({(r.partition, r.offset) for r in results}) == 600


def test_producer_under_gevent_monkey_patching(broker):
    run_gevent_script(url_of(broker))
