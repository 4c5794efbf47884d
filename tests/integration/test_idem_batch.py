"""``putb_idem`` (a batch of idempotent puts) against real brokers: stored once, a resend answered with the
originals, a gap refused, a kill -9 then a resend, the limit, bad input refused whole, the flush modes."""

import signal
import socket

import pytest

from metaq.idempotence import limits as idempotence_limits
from metaq.client.local import free_port, small_config
from metaq.idempotence.records import identity_in_attribute
from metaq.idempotence.wire import IdempotentBatch, decode_idem_runs, idem_sub_record
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import decode_payload, encode_payload
from metaq.protocol.properties import split_attribute
from metaq.protocol.text import serialize
from tests.harness.broker import consume_all, wait_for
from tests.harness.replication import sync_pair

PID = 4242


def body_of(topic, items, pid=PID):
    """``items``: ``(partition, seq, payload)``: the batch's put_idem sub-records."""
    out = []
    for partition, seq, payload in items:
        flag, data = encode_payload(payload, None)
        out.append(idem_sub_record(topic.encode(), partition, flag, data, metaq_checksum(data), pid, seq))
    return b"".join(out)


def batch(topic, items, pid=PID, count=None, body=None, opaque=1):
    return IdempotentBatch(topic, len(items) if count is None else count,
                           body_of(topic, items, pid) if body is None else body, opaque)


def runs_of(c, event):
    r = c.call(event)
    assert isinstance(r, ev.Result) and r.code == 200, r
    return decode_idem_runs(r.body)


def refusal(c, event):
    r = c.call(event)
    assert isinstance(r, ev.Result) and r.code == 400, r
    return r.body.decode()


def view(c, topic, partition):
    """``[(payload, (pid, seq))]`` of the partition, in offset order."""
    out = []
    for rec in consume_all(c, topic, partition):
        attribute, payload = decode_payload(rec.flag, rec.data)
        out.append((payload, identity_in_attribute(attribute)))
        assert split_attribute(attribute)[0] is None
    return out


def seqs(n, partition=0, first=0):
    return [(partition, first + k, b"m%d" % (first + k)) for k in range(n)]


def test_a_batch_is_stored_once_and_a_resend_is_answered_with_the_originals(broker):
    items = seqs(50) + seqs(30, partition=1)
    with broker.client() as c:
        first = runs_of(c, batch("t-ib", items))
        assert [(p, o, n, d) for _i, p, o, n, d in first] == [(0, 0, 50, False), (1, 0, 30, False)]
        again = runs_of(c, batch("t-ib", items, opaque=2))  # the reply was lost: the same batch again
        assert [(p, o, n, d) for _i, p, o, n, d in again] == [(0, 0, 50, True), (1, 0, 30, True)]
        assert [r[0] for r in again] == [r[0] for r in first]  # the originals' message ids
        nxt = runs_of(c, batch("t-ib", seqs(10, first=50)))
        assert [(p, o, n, d) for _i, p, o, n, d in nxt] == [(0, 50, 10, False)]
        assert view(c, "t-ib", 0) == [(b"m%d" % k, (PID, k)) for k in range(60)]
        assert len(view(c, "t-ib", 1)) == 30
        stats = c.stats_dict()
        assert stats["idempotent_puts"] == "90" and stats["idempotent_duplicates"] == "80"


def test_a_partly_stored_batch_resent_is_duplicates_then_the_rest(broker):
    with broker.client() as c:
        runs_of(c, batch("t-ip", seqs(5)))
        runs = runs_of(c, batch("t-ip", seqs(8)))
        assert [(o, n, d) for _i, _p, o, n, d in runs] == [(0, 5, True), (5, 3, False)]
        assert [p for p, _ident in view(c, "t-ip", 0)] == [b"m%d" % k for k in range(8)]


def test_a_gap_is_refused_and_nothing_stored(broker):
    with broker.client() as c:
        runs_of(c, batch("t-ig", seqs(5)))
        why = refusal(c, batch("t-ig", seqs(3, first=6)))
        assert "past the next one (5)" in why and "nothing was stored" in why
        # two partitions, the second's gap: the first's good part is not stored either
        why = refusal(c, batch("t-ig", seqs(2, first=5) + seqs(2, partition=1, first=0) + [(0, 9, b"x")]))
        assert "sub-record 4 of 5" in why
        runs_of(c, batch("t-ig", seqs(1, partition=1)))
        why = refusal(c, batch("t-ig", seqs(2, first=5) + seqs(2, partition=1, first=3)))
        assert "t-ig-1" in why and "past the next one (1)" in why
        assert len(view(c, "t-ig", 0)) == 5 and len(view(c, "t-ig", 1)) == 1


def test_a_mismatched_resend_in_the_last_partition_refuses_the_batch_and_nothing_is_stored(broker):
    with broker.client() as c:
        runs_of(c, batch("t-im", seqs(2, partition=2)))  # partition 2 holds sequences 0 and 1
        stats = c.stats_dict()
        # partitions 0 and 1 new, then partition 2's sequence 1 resent with other content
        items = seqs(3) + seqs(2, partition=1) + [(2, 1, b"not m1"), (2, 2, b"m2")]
        why = refusal(c, batch("t-im", items))
        assert "sub-record 5 of 7: sequence 1 of producer %d (t-im-2) was stored at offset 1 with other content" \
            % PID in why and "nothing was stored" in why, why
        assert view(c, "t-im", 0) == [] and view(c, "t-im", 1) == []
        assert view(c, "t-im", 2) == [(b"m0", (PID, 0)), (b"m1", (PID, 1))]
        after = c.stats_dict()
        assert after["idempotent_puts"] == stats["idempotent_puts"]
        assert int(after["idempotent_refused_different"]) == int(stats["idempotent_refused_different"]) + 1
        # the same batch with the right resend: the new partitions stored, the resend a duplicate
        runs = runs_of(c, batch("t-im", seqs(3) + seqs(2, partition=1) + seqs(3, partition=2)))
        assert [(p, o, n, d) for _i, p, o, n, d in runs] == [(0, 0, 3, False), (1, 0, 2, False), (2, 0, 2, True),
                                                             (2, 2, 1, False)]


def test_bad_input_is_refused_naming_the_first_bad_sub_record(broker):
    good = seqs(6)
    body = body_of("t-ibad", good)
    bad_sum = body.replace(b" %d %d 2 0\r\n" % (metaq_checksum(b"m2"), PID),
                           b" %d %d 2 0\r\n" % (metaq_checksum(b"m2") ^ 1, PID))
    assert bad_sum != body
    cases = {
        "not consecutive": (batch("t-ibad", good[:3] + [(0, 4, b"m4")]), "sub-record 3 of 4"),
        "checksum": (batch("t-ibad", good, body=bad_sum), "sub-record 2 of 6"),
        "other producer": (IdempotentBatch("t-ibad", 2, body_of("t-ibad", good[:1]) +
                                           body_of("t-ibad", good[1:2], pid=PID + 1), 1), "sub-record 1 of 2"),
        "other topic": (IdempotentBatch("t-ibad", 2, body_of("t-ibad", good[:1]) + body_of("t-x", good[1:2]), 1),
                        "sub-record 1 of 2"),
        "partition": (batch("t-ibad", good[:2] + [(9, 0, b"z")]), "sub-record 2 of 3"),
        "count says more": (batch("t-ibad", good, count=7), "the count says 7"),
        "truncated": (batch("t-ibad", good, body=body[:-1]), "sub-record 5 of 6"),
    }
    with broker.client() as c:
        for name, (event, words) in cases.items():
            why = refusal(c, event)
            assert words in why and "nothing was stored" in why, (name, why)
        assert view(c, "t-ibad", 0) == []
        runs_of(c, batch("t-ibad", good))  # the connection goes on; sequence 0 was never taken
        assert len(view(c, "t-ibad", 0)) == 6


def test_the_limit_at_and_one_past(broker):
    limit = idempotence_limits.MAX_IDEMPOTENT_BATCH_MESSAGES
    with broker.client() as c:
        runs = runs_of(c, batch("t-il", seqs(limit)))
        assert sum(r[3] for r in runs) == limit
        r = c.call(batch("t-il", seqs(limit + 1, first=limit)))
        assert isinstance(r, ev.Result) and r.code == 400 and b"count" in r.body, r
        assert len(view(c, "t-il", 0)) == limit


@pytest.mark.fault
def test_a_batch_across_a_kill_then_resent_is_stored_once(broker_factory, tmp_path):
    cfg = small_config(str(tmp_path / "b" / "data"), store={"checkpoint_interval_ms": 600000})
    cfg["broker"]["port"] = free_port()
    b = broker_factory(cfg, workdir=tmp_path / "b")
    items = seqs(200)
    with b.client() as c:
        runs_of(c, batch("t-ik", seqs(3, partition=1)))
    sock = socket.create_connection(("127.0.0.1", b.port))
    sock.sendall(serialize(batch("t-ik", items)))
    with b.client() as c:  # handled once the partition shows it; its reply is never read
        wait_for(lambda: len(consume_all(c, "t-ik", 0)) == 200, 10, "the batch stored")
    b.kill()
    sock.close()
    b.start()
    with b.client() as c:
        runs = runs_of(c, batch("t-ik", items))
        assert [(o, n, d) for _i, _p, o, n, d in runs] == [(0, 200, True)]
        runs = runs_of(c, batch("t-ik", seqs(5, first=200)))
        assert [(o, n, d) for _i, _p, o, n, d in runs] == [(200, 5, False)]
        assert [p for p, _i in view(c, "t-ik", 0)] == [b"m%d" % k for k in range(205)]


def test_async_flush_mode_stores_and_answers(broker_factory, tmp_path):
    b = broker_factory(small_config(str(tmp_path / "d"), store={"flush": "async"}))
    with b.client() as c:
        assert [(o, n) for _i, _p, o, n, _d in runs_of(c, batch("t-ia", seqs(20)))] == [(0, 20)]
        assert [(o, n, d) for _i, _p, o, n, d in runs_of(c, batch("t-ia", seqs(20)))] == [(0, 20, True)]
        assert len(view(c, "t-ia", 0)) == 20


@pytest.mark.slow
def test_sync_replication_answers_once_a_slave_has_the_batch(broker_factory, tmp_path):
    master, slave = sync_pair(broker_factory, tmp_path, sync_timeout_ms=500)
    with master.client() as c:
        runs = runs_of(c, batch("t-ir", seqs(100)))
        with slave.client() as s:
            assert s.get_records("t-ir", 0, 99)[0].msg_id == runs[0][0] + 99  # answered: the slave has it
        slave.proc.send_signal(signal.SIGSTOP)  # connected but silent: no slave confirms the next batch
        try:
            r = c.call(batch("t-ir", seqs(10, first=100)))
            assert r.code == 503 and b"FLUSH_SLAVE_TIMEOUT" in r.body, r
        finally:
            slave.proc.send_signal(signal.SIGCONT)
        runs = runs_of(c, batch("t-ir", seqs(10, first=100)))  # stored on the master: the resend is duplicates
        assert [(o, n, d) for _i, _p, o, n, d in runs] == [(100, 10, True)]
        assert len(view(c, "t-ir", 0)) == 110
