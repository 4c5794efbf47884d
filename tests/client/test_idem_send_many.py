"""``Producer.send_many`` of an idempotent producer against a real broker: ``putb_idem`` frames whose
sequences follow the partition's, a retry resending the same sequences (answered as duplicates, stored once),
a gap after a failed frame, a task run again with the same producer id answered as duplicates, split at
``MAX_IDEMPOTENT_BATCH_MESSAGES``."""

import signal
import time

from metaq.idempotence import limits as idempotence_limits
from metaq.client import Producer
from metaq.idempotence.records import identity_in_attribute
from metaq.protocol.message import decode_payload
from tests.harness.broker import consume_all, url_of

PID = 99


def identities(broker, topic, partition=0):
    with broker.client() as c:
        out = []
        for rec in consume_all(c, topic, partition):
            attribute, payload = decode_payload(rec.flag, rec.data)
            out.append((payload, identity_in_attribute(attribute)))
        return out


def test_frames_take_the_partitions_sequences_in_order_and_a_rerun_is_duplicates(broker):
    n = idempotence_limits.MAX_IDEMPOTENT_BATCH_MESSAGES * 2 + 5  # three frames
    payloads = [b"p%d" % k for k in range(n)]
    with Producer(brokers=[url_of(broker)], idempotent=True, producer_id=PID) as p:
        first = p.send_many("t-ism", payloads[:100], partition=0)
        rest = p.send_many("t-ism", payloads[100:], partition=0)
        r1, r2 = first.result(30), rest.result(30)
        assert r1.success and r2.success and (r1.duplicates, r2.duplicates) == (0, 0)
        assert list(r2.offsets()) == list(range(100, n))
    assert identities(broker, "t-ism") == [(payloads[k], (PID, k)) for k in range(n)]
    with Producer(brokers=[url_of(broker)], idempotent=True, producer_id=PID) as p:  # the task run again
        again = p.send_many("t-ism", payloads, partition=0).result(30)
        assert again.success and again.duplicates == n
        # below the window: a duplicate whose offset is no longer known
        older = n - idempotence_limits.IDEMPOTENCE_WINDOW
        assert list(again.offsets()) == [-1] * older + list(range(older, n))
        more = p.send_many("t-ism", [b"next"], partition=0).result(30)
        assert more.success and more.duplicates == 0 and list(more.offsets()) == [n]
    assert len(identities(broker, "t-ism")) == n + 1


def test_a_retry_resends_the_same_sequences_and_nothing_is_stored_twice(broker):
    payloads = [b"r%d" % k for k in range(300)]
    with Producer(brokers=[url_of(broker)], idempotent=True, producer_id=PID, send_timeout=0.5,
                  retry_deadline=20) as p:
        p.send_many("t-isr", [b"warm"], partition=0).result(10)  # connected, the partition known
        broker.proc.send_signal(signal.SIGSTOP)  # the frame is read and stored only once it continues
        try:
            future = p.send_many("t-isr", payloads, partition=0)
            time.sleep(1.5)  # past the send timeout: the frame is sent again
        finally:
            broker.proc.send_signal(signal.SIGCONT)
        result = future.result(30)
    assert result.success and list(result.offsets()) == list(range(1, 301))
    stored = identities(broker, "t-isr")
    assert stored == [(b"warm", (PID, 0))] + [(payloads[k], (PID, k + 1)) for k in range(300)]


def test_after_a_refused_frame_the_next_are_refused_as_a_gap(broker):
    with Producer(brokers=[url_of(broker)], idempotent=True, producer_id=PID) as p:
        assert p.send_many("t-isb", [b"a", b"b"], partition=0).result(10).success
        too_big = p.send_many("t-isb", [b"x" * (300 * 1024)], partition=0).result(10)  # the broker's limit: 256 KiB
        assert not too_big.success and too_big.stored == 0
        after = p.send_many("t-isb", [b"c"], partition=0).result(10)
        assert not after.success and "past the next one (2)" in str(after.error)
    with Producer(brokers=[url_of(broker)], idempotent=True, producer_id=PID + 1) as p:  # a new producer id
        assert p.send_many("t-isb", [b"c"], partition=0).result(10).success
    assert identities(broker, "t-isb") == [(b"a", (PID, 0)), (b"b", (PID, 1)), (b"c", (PID + 1, 0))]


def test_after_a_refused_frame_the_next_frames_of_a_producer_with_its_own_id_are_stored_in_order(broker):
    with Producer(brokers=[url_of(broker)], idempotent=True) as p:  # no producer_id: its own
        assert p.send_many("t-isgo", [b"a", b"b"], partition=0).result(10).success
        too_big = p.send_many("t-isgo", [b"x" * (300 * 1024)], partition=0).result(10)  # the broker's limit: 256 KiB
        assert not too_big.success and too_big.stored == 0
        after = p.send_many("t-isgo", [b"c", b"d"], partition=0).result(10)
        assert after.success and after.duplicates == 0
        pid = p.producer_id
    assert identities(broker, "t-isgo") == [(b"a", (pid, 0)), (b"b", (pid, 1)), (b"c", (pid, 2)), (b"d", (pid, 3))]
