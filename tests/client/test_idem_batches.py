"""An idempotent batching Producer (``idempotent=True, batch_bytes=...``) against a real broker: ``send_async``
messages go in their partition's ``putb_idem`` batches, each with its own sequence in send order; a batch resent
after its connection was cut before the reply is stored once; plain, attributed and compressed messages share a
partition's sequences, and a run again with the same producer id is answered as duplicates with the stored
offsets; and the batches' encoder, the C helper's ``encode_idem_sub_records``, equal to the Python reference."""

import logging
import signal
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.client import Message, Producer
from metaq.idempotence.records import MAX_PID, MAX_SEQ, identity_in_attribute
from metaq.idempotence.wire import IdempotentPut, encode_idem_sub_records_py
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import decode_payload
from tests.harness.broker import consume_all, url_of
from tests.harness.faults import LinkProxy

try:
    from metaq.native._bytes import encode_idem_sub_records as _c
except ImportError:  # not built: the Python reference is what runs
    _c = None

PID = 77


@pytest.mark.skipif(_c is None, reason="metaq.native._bytes was not built")
@settings(max_examples=300, deadline=None)
@given(topic=st.binary(min_size=1, max_size=20).map(lambda b: bytes(0x21 + x % 94 for x in b)),
       partition=st.integers(0, 2**31 - 1), pid=st.integers(1, MAX_PID), seq0=st.integers(0, MAX_SEQ - 30),
       payloads=st.lists(st.binary(max_size=300), max_size=30))
def test_the_c_encoder_equals_the_python_reference(topic, partition, pid, seq0, payloads):
    assert _c(topic, partition, payloads, pid, seq0) == encode_idem_sub_records_py(topic, partition, payloads, pid,
                                                                                   seq0)
    with pytest.raises(TypeError, match="payload 1"):
        _c(topic, partition, [b"ok", "text"], pid, seq0)


def stored(broker, topic, partition):
    """``[(payload, attribute, (pid, seq))]`` of a partition, in offset order."""
    with broker.client() as c:
        out = []
        for rec in consume_all(c, topic, partition):
            attribute, payload = decode_payload(rec.flag, rec.data)
            out.append((payload, attribute, identity_in_attribute(attribute)))
        return out


def by_index(topic, partitions, message):
    """The partition of message ``b"m<i>..."``: ``i`` modulo the partitions known (1 before the topic exists)."""
    return partitions[int(message.body[1:].split(b" ")[0]) % len(partitions)]


def test_ten_thousand_send_async_are_stored_once_each_in_order(broker):
    n = 10_000
    with Producer(brokers=[url_of(broker)], idempotent=True, producer_id=PID, batch_bytes=64 * 1024,
                  selector=by_index) as p:
        futures = [p.send_async(Message("t-ib", b"m%d" % i)) for i in range(n)]  # the topic is created by them
        results = [f.result(60) for f in futures]
    assert all(r.success and not r.duplicate for r in results), [r for r in results if not r.success][:3]
    seen = 0
    for part in range(4):
        held = stored(broker, "t-ib", part)
        mine = [i for i, r in enumerate(results) if r.partition.partition == part]
        assert [payload for payload, _a, _id in held] == [b"m%d" % i for i in mine]  # once each, in send order
        assert [ident for _p, _a, ident in held] == [(PID, s) for s in range(len(held))]  # a sequence per message
        assert [results[i].offset for i in mine] == list(range(len(mine)))
        seen += len(held)
    assert seen == n


def test_send_async_messages_wait_in_their_batch_until_the_linger_or_a_flush(broker):
    with broker.client() as c:
        c.put_ok("t-iblinger", b"created", partition=3)
    with Producer(brokers=[url_of(broker)], idempotent=True, producer_id=PID, batch_bytes=64 * 1024,
                  linger_ms=60_000, selector=lambda topic, partitions, message: partitions[1]) as p:
        futures = [p.send_async(Message("t-iblinger", b"w%d" % i)) for i in range(100)]
        time.sleep(0.5)
        assert not any(f.done() for f in futures) and stored(broker, "t-iblinger", 1) == []  # gathering
        assert p.flush(timeout=10)
        assert [f.result().offset for f in futures] == list(range(100))
    assert [(payload, ident) for payload, _a, ident in stored(broker, "t-iblinger", 1)] == [
        (b"w%d" % i, (PID, i)) for i in range(100)]


def _cut_before_the_reply(p, broker, proxy, topic):
    """300 messages ``c0..c299`` sent by ``p`` in one batch that reaches the paused broker, whose connection (through
    ``proxy``) is cut before the reply: the batch is sent again on a new one. Their results."""
    broker.proc.send_signal(signal.SIGSTOP)  # the batch reaches the broker, which answers only later
    try:
        futures = [p.send_async(Message(topic, b"c%d" % i)) for i in range(300)]
        p.flush(timeout=0.5)  # one batch of the 300, sent now
        time.sleep(1.0)
        proxy.cut()  # the connection goes before the reply: the batch is sent again on a new one
    finally:
        broker.proc.send_signal(signal.SIGCONT)
    time.sleep(0.5)
    proxy.heal()
    return [f.result(60) for f in futures]


def test_a_batch_resent_after_its_connection_was_cut_before_the_reply_is_stored_once(broker):
    with broker.client() as c:
        c.put_ok("t-ibcut", b"created", partition=3)  # the topic's 4 partitions are known from the start
    proxy = LinkProxy(("127.0.0.1", broker.port)).start()
    try:
        with Producer(brokers=["meta://%s" % proxy.address], idempotent=True, producer_id=PID,
                      batch_bytes=64 * 1024, linger_ms=5000, send_timeout=2, retry_deadline=30,
                      selector=lambda topic, partitions, message: partitions[0]) as p:
            assert p.send(Message("t-ibcut", b"warm")).success  # connected
            results = _cut_before_the_reply(p, broker, proxy, "t-ibcut")
    finally:
        proxy.close()
    assert all(r.success for r in results), [r for r in results if not r.success][:3]
    # stored when first sent (its resend answered with the originals), or first stored by the resend: whole either way
    assert len({r.duplicate for r in results}) == 1
    assert [r.offset for r in results] == list(range(1, 301))  # the stored offsets, duplicates or not
    held = stored(broker, "t-ibcut", 0)
    assert [(payload, ident) for payload, _a, ident in held] == (
        [(b"warm", (PID, 0))] + [(b"c%d" % i, (PID, i + 1)) for i in range(300)])


def test_plain_attributed_and_compressed_messages_share_the_sequences_and_a_rerun_is_duplicates(broker):
    def messages():
        out = []
        for i in range(40):
            if i % 4 == 0:
                out.append(Message("t-ibmix", b"m%d" % i))
            elif i % 4 == 1:
                out.append(Message("t-ibmix", b"m%d attributed" % i, attribute="kind=%d" % i))
            elif i % 4 == 2:
                out.append(Message("t-ibmix", b"m%d keyed" % i, key=b"k%d" % i, properties={"P": "v"}))
            else:  # compressed: it cannot share a putb_idem, so it goes alone in its turn
                out.append(Message("t-ibmix", b"m%d " % i + b"z" * 3000))
        return out

    with broker.client() as c:
        c.put_ok("t-ibmix", b"created", partition=3)
    options = dict(brokers=[url_of(broker)], idempotent=True, producer_id=PID, batch_bytes=16 * 1024,
                   compress_over=1000, selector=by_index)
    with Producer(**options) as p:
        first = [f.result(30) for f in [p.send_async(m) for m in messages()]]
    assert all(r.success and not r.duplicate for r in first), [r for r in first if not r.success][:3]
    sent = messages()
    for part in range(4):
        held = [h for h in stored(broker, "t-ibmix", part) if h[0] != b"created"]
        mine = [m for i, m in enumerate(sent) if i % 4 == part]
        assert [payload for payload, _a, _id in held] == [m.body for m in mine]
        assert [ident for _p, _a, ident in held] == [(PID, s) for s in range(10)]
        for (_payload, attribute, _id), m in zip(held, mine, strict=True):
            if m.attribute is not None:
                assert attribute.startswith(m.attribute)
    with Producer(**options) as p:  # run again with the same id: every message is one the broker holds
        again = [f.result(30) for f in [p.send_async(m) for m in messages()]]
    assert all(r.success and r.duplicate for r in again)
    assert [(r.partition, r.offset, r.msg_id) for r in again] == [(r.partition, r.offset, r.msg_id) for r in first]
    assert sum(len(stored(broker, "t-ibmix", part)) for part in range(4)) == 41


def test_after_a_refused_batch_the_next_are_refused_as_a_gap(broker):
    with broker.client() as c:
        c.put_ok("t-ibgap", b"created", partition=3)
    options = dict(brokers=[url_of(broker)], idempotent=True, batch_bytes=1 << 20, retry_deadline=5,
                   selector=lambda topic, partitions, message: partitions[0])
    with Producer(producer_id=PID, **options) as p:
        assert all(p.send(Message("t-ibgap", body)).success for body in (b"a", b"b"))
        too_big = p.send(Message("t-ibgap", b"x" * (300 * 1024)))  # one batch, over the broker's 256 KiB: 400
        assert not too_big.success and "exceeds the limit" in str(too_big.error)
        after = p.send(Message("t-ibgap", b"c"))
        assert not after.success and "past the next one (2)" in str(after.error)
    with Producer(producer_id=PID + 1, **options) as p:  # a new producer id
        assert p.send(Message("t-ibgap", b"c")).success
    assert [(payload, ident) for payload, _a, ident in stored(broker, "t-ibgap", 0)] == [
        (b"a", (PID, 0)), (b"b", (PID, 1)), (b"c", (PID + 1, 0))]


def test_after_a_batch_refused_for_good_mid_stream_the_later_messages_are_stored_once_each_in_order(broker):
    with broker.client() as c:
        c.put_ok("t-ibgo", b"created", partition=3)
    bodies = [b"x" * (300 * 1024) if i in (20, 41) else b"g%d" % i for i in range(60)]  # two over 256 KiB
    with Producer(brokers=[url_of(broker)], idempotent=True, batch_bytes=64 * 1024, linger_ms=20,
                  retry_deadline=10, selector=lambda topic, partitions, message: partitions[1]) as p:
        pid = p.producer_id  # its own: no producer made later sends under it
        results = []
        for i, body in enumerate(bodies):
            results.append(p.send_async(Message("t-ibgo", body)))
            if i % 7 == 6:
                time.sleep(0.03)  # the stream goes in several batches around the refused ones
        results = [f.result(30) for f in results]
        last = p.send(Message("t-ibgo", b"last"))
    refused = [i for i, r in enumerate(results) if not r.success]
    assert refused == [20, 41] and all("exceeds the limit" in str(results[i].error) for i in refused)
    assert last.success and not last.duplicate
    kept = [b for i, b in enumerate(bodies) if i not in refused] + [b"last"]
    held = stored(broker, "t-ibgo", 1)
    assert [payload for payload, _a, _id in held] == kept  # once each, in send order
    assert [ident for _p, _a, ident in held] == [(pid, s) for s in range(len(kept))]  # refused ones' sequences reused
    assert [r.offset for r in results if r.success] + [last.offset] == list(range(len(kept)))


def test_after_a_refused_batch_a_batch_resent_after_its_connection_was_cut_is_stored_once(broker):
    with broker.client() as c:
        c.put_ok("t-ibgocut", b"created", partition=3)
    proxy = LinkProxy(("127.0.0.1", broker.port)).start()
    try:
        with Producer(brokers=["meta://%s" % proxy.address], idempotent=True, batch_bytes=64 * 1024,
                      linger_ms=5000, send_timeout=2, retry_deadline=30,
                      selector=lambda topic, partitions, message: partitions[0]) as p:
            assert p.send(Message("t-ibgocut", b"warm")).success
            assert not p.send(Message("t-ibgocut", b"x" * (300 * 1024))).success  # refused for good: 400
            results = _cut_before_the_reply(p, broker, proxy, "t-ibgocut")
            pid = p.producer_id
    finally:
        proxy.close()
    assert all(r.success for r in results), [r for r in results if not r.success][:3]
    assert [r.offset for r in results] == list(range(1, 301))  # the stored offsets, duplicates or not
    held = stored(broker, "t-ibgocut", 0)
    assert [(payload, ident) for payload, _a, ident in held] == (
        [(b"warm", (pid, 0))] + [(b"c%d" % i, (pid, i + 1)) for i in range(300)])


def test_after_a_batch_whose_outcome_is_unknown_the_next_refused_as_a_gap_is_sent_again_and_stored(broker, caplog):
    caplog.set_level(logging.INFO, logger="metaq.client.batching")
    with broker.client() as c:
        c.put_ok("t-ibgorebase", b"created", partition=3)
    proxy = LinkProxy(("127.0.0.1", broker.port)).start()
    try:
        with Producer(brokers=["meta://%s" % proxy.address], idempotent=True, batch_bytes=64 * 1024, linger_ms=0,
                      send_timeout=0.5, selector=lambda topic, partitions, message: partitions[2]) as p:
            assert p.send(Message("t-ibgorebase", b"warm")).success  # sequence 0
            proxy.cut()  # every attempt of the next batch loses its connection: its outcome is unknown
            lost = p.send(Message("t-ibgorebase", b"lost"), timeout=1.0)  # sequence 1: its retries run out
            assert not lost.success
            proxy.heal()
            # the next batch goes under sequence 2; the broker expects 1 (the lost batch never reached it), refuses it
            # as a gap, and it is sent again from sequence 1
            results = [f.result(30) for f in [p.send_async(Message("t-ibgorebase", b"n%d" % i)) for i in range(50)]]
            pid = p.producer_id
    finally:
        proxy.close()
    assert all(r.success and not r.duplicate for r in results), [r for r in results if not r.success][:3]
    assert [r.offset for r in results] == list(range(1, 51))
    assert [(payload, ident) for payload, _a, ident in stored(broker, "t-ibgorebase", 2)] == (
        [(b"warm", (pid, 0))] + [(b"n%d" % i, (pid, i + 1)) for i in range(50)])
    assert "refused (a gap) at sequence 2: sent again from sequence 1" in caplog.text


def test_a_batch_refused_for_other_content_under_its_sequences_is_sent_again_above_them_and_stored(broker, caplog):
    caplog.set_level(logging.INFO, logger="metaq.client.batching")
    with broker.client() as c:
        c.put_ok("t-ibgoother", b"created", partition=3)
        with Producer(brokers=[url_of(broker)], idempotent=True, batch_bytes=64 * 1024, linger_ms=0,
                      selector=lambda topic, partitions, message: partitions[1]) as p:
            assert p.send(Message("t-ibgoother", b"warm")).success  # sequence 0
            pid = p.producer_id
            # what a late copy of a batch of unknown outcome does: other messages stored under its next sequences
            for seq in (1, 2):
                body = b"late%d" % seq
                r = c.call(IdempotentPut("t-ibgoother", 1, 0, body, c.opaque(), metaq_checksum(body), pid, seq))
                assert r.code == 200, r
            results = [f.result(30) for f in [p.send_async(Message("t-ibgoother", b"n%d" % i)) for i in range(20)]]
    assert all(r.success and not r.duplicate for r in results), [r for r in results if not r.success][:3]
    assert [r.offset for r in results] == list(range(3, 23))
    assert [(payload, ident) for payload, _a, ident in stored(broker, "t-ibgoother", 1)] == (
        [(b"warm", (pid, 0)), (b"late1", (pid, 1)), (b"late2", (pid, 2))]
        + [(b"n%d" % i, (pid, i + 3)) for i in range(20)])
    assert "refused (other content) at sequence 1" in caplog.text
