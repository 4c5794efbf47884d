"""The idempotent Producer (idempotent=True) against a real broker: sequences, duplicates, refusals."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.idempotence import limits as idempotence_limits
from metaq.client import Consumer, KeySelector, Message, Producer
from metaq.client.producer import _Sequences
from metaq.idempotence.records import identity_in_attribute
from metaq.protocol.message import decode_payload
from tests.harness.broker import consume_all, url_of


def identities(broker, topic, partition):
    with broker.client() as c:
        return [identity_in_attribute(decode_payload(r.flag, r.data)[0]) for r in consume_all(c, topic, partition)]


def test_sequences_per_partition_in_send_order_past_the_window(broker):
    n = idempotence_limits.IDEMPOTENCE_WINDOW * 2 + 100  # send_async waits for room once a window is unanswered
    with Producer(brokers=[url_of(broker)], idempotent=True, producer_id=5,
                  selector=lambda topic, partitions, message: partitions[int(message.body) % len(partitions)]) as p:
        results = [p.send(Message("t-seq", b"0"))]  # creates the topic (partition 0): then its 4 are known
        futures = [p.send_async(Message("t-seq", b"%d" % i)) for i in range(1, n)]
        results += [f.result(60) for f in futures]
    assert all(r.success and not r.duplicate for r in results)
    for part in range(4):
        assert identities(broker, "t-seq", part) == [(5, s) for s in range(len(range(part, n, 4)))]


def test_a_restarted_producer_with_the_same_id_stores_nothing_twice(broker):
    """A retried Spark task: the same producer id, the same messages in the same order per partition."""
    msgs = [b"a", b"b", b"c"]
    with broker.client() as c:
        c.put_ok("t-again", b"created", partition=3)  # the topic's 4 partitions are known from the start
    with Producer(brokers=[url_of(broker)], idempotent=True, producer_id=1234, selector=KeySelector()) as p:
        first = [p.send(Message("t-again", m, key=b"k")) for m in msgs[:2]]  # the first run died after two
    with Producer(brokers=[url_of(broker)], idempotent=True, producer_id=1234, selector=KeySelector()) as p:
        second = [p.send(Message("t-again", m, key=b"k")) for m in msgs]
    assert [r.duplicate for r in second] == [True, True, False]
    assert [(r.partition, r.offset, r.msg_id) for r in second[:2]] == [(r.partition, r.offset, r.msg_id)
                                                                       for r in first]
    part = second[0].partition.partition
    with broker.client() as c:
        assert [r.payload for r in consume_all(c, "t-again", part) if r.payload != b"created"] == msgs


def test_without_batches_the_sends_after_one_refused_for_good_are_stored_once_each(broker):
    """Each message its own put_idem: a sequence refused for good is a gap inside the window, which the broker
    stores past, so the partition's later sends go on, whether the producer id was given or not."""
    with broker.client() as c:
        c.put_ok("t-single-go", b"created", partition=3)
    for chosen, part in ((4321, 1), (None, 2)):
        with Producer(brokers=[url_of(broker)], idempotent=True, producer_id=chosen, retry_deadline=5,
                      selector=lambda topic, partitions, message, part=part: partitions[part]) as p:
            results = [p.send(Message("t-single-go", body)) for body in (b"a", b"x" * (300 * 1024), b"b", b"c")]
            pid = p.producer_id
        assert [r.success for r in results] == [True, False, True, True]
        assert "exceeds the limit" in str(results[1].error)
        assert identities(broker, "t-single-go", part) == [(pid, 0), (pid, 2), (pid, 3)]


def test_consumers_see_the_users_attribute_and_the_identity_as_properties(broker):
    with Producer(brokers=[url_of(broker)], idempotent=True, producer_id=9) as p:
        r = p.send(Message("t-cons", b"body", attribute="kind=x", properties={"KEYS": "k1"}))
    consumer = Consumer("g-idem", brokers=[url_of(broker)])
    try:
        [got] = consumer.fetch("t-cons", str(r.partition), r.offset)
    finally:
        consumer.close()
    assert (got.body, got.attribute) == (b"body", "kind=x")
    assert got.properties == {"KEYS": "k1", "METAQ_PID": "9", "METAQ_SEQ": "0"}


def test_what_idempotence_refuses(broker):
    with pytest.raises(ValueError, match="idempotent=True"):
        Producer(brokers=[url_of(broker)], producer_id=3)
    for bad in (0, -1, 2**63, True, "7"):
        with pytest.raises(ValueError, match="producer_id must be"):
            Producer(brokers=[url_of(broker)], idempotent=True, producer_id=bad)
    with Producer(brokers=[url_of(broker)], idempotent=True) as p:
        assert 1 <= p.producer_id < 2**63
        with pytest.raises(ValueError, match="delayed"):
            p.send(Message("t-ref", b"x", delay_level=1))
        with pytest.raises(ValueError, match="transactions"):
            p.transaction()
        with pytest.raises(ValueError, match="send_oneway"):
            p.send_oneway(Message("t-ref", b"x"))
    with broker.client() as c:
        assert all(consume_all(c, "t-ref", part) == [] for part in range(4))


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40).flatmap(lambda n: st.permutations(range(n))))
def test_the_window_low_is_the_oldest_unanswered_sequence_whatever_the_reply_order(order):
    """The client's count of a partition's unanswered sequences (what holds a send back at IDEMPOTENCE_WINDOW)."""
    seqs = _Sequences()
    seqs.next = len(order)
    answered = set()
    for seq in order + order[:3]:  # and a few answered twice (a reply after a timeout's)
        seqs.finished(seq)
        answered.add(seq)
        assert seqs.low == min(set(range(seqs.next)) - answered, default=seqs.next)
