"""The idempotent producer's sequence bookkeeping of one partition (``client/idempotence.Sequences``), pure: what a
batch refused as a gap may take (``rebase``), and the broker's gap refusal read (``gap_expected``)."""

import pytest

from metaq.errors import ClientError
from metaq.client.idempotence import Sequences, gap_expected
from metaq.idempotence.window import ProducerTable


def reserved(seqs, count):
    first = seqs.next
    seqs.next += count
    return first


def test_a_batch_refused_as_a_gap_takes_the_brokers_next_sequences_and_the_next_batch_follows_it():
    seqs = Sequences()
    a = reserved(seqs, 3)
    seqs.finished_run(a, 3)  # stored: 0..2
    failed = reserved(seqs, 4)
    seqs.finished_run(failed, 4)  # failed for good: 3..6 never stored
    b = reserved(seqs, 5)  # 7..11: the broker expects 3
    assert seqs.rebase(b, 5, 3) == 3
    assert (seqs.next, seqs.low) == (8, 3)
    seqs.finished_run(3, 5)
    assert seqs.low == 8 and reserved(seqs, 2) == 8  # the next batch follows the rebased one, no gap


@pytest.mark.parametrize("expected", [7, 8, -1])
def test_no_rebase_to_the_batchs_own_first_sequence_or_past_it(expected):
    seqs = Sequences()
    seqs.next = seqs.low = 7
    b = reserved(seqs, 2)
    assert seqs.rebase(b, 2, expected) is None
    assert (seqs.next, seqs.low) == (9, 7)


def test_no_rebase_when_another_send_holds_a_sequence_the_move_would_give_twice():
    seqs = Sequences()
    reserved(seqs, 3)
    seqs.finished_run(0, 3)
    b = reserved(seqs, 2)  # 3..4
    later = reserved(seqs, 1)  # 5: a send reserved after it (send_async without batches)
    assert seqs.rebase(b, 2, 1) is None
    seqs.finished(later)
    unanswered = reserved(seqs, 1)  # 6, unanswered, below the next batch
    c = reserved(seqs, 2)  # 7..8
    seqs.finished_run(b, 2)
    assert seqs.low == 6 and seqs.rebase(c, 2, 3) is None  # 6 is below it and unanswered
    seqs.finished(unanswered)
    assert seqs.rebase(c, 2, 3) == 3 and (seqs.next, seqs.low, seqs.ahead) == (5, 3, set())


def test_the_brokers_gap_refusal_is_read_and_no_other_refusal_is():
    table = ProducerTable()
    table.record(42, "orders", 2, 0, 0, 1000)
    from metaq.idempotence.state import Idempotence

    state = Idempotence.__new__(Idempotence)  # check_batch reads the table and admit only for this refusal
    state.table, state.refused_quota, state.different = table, 0, 0
    frame = (b"orders", 2, 0, None, None, None, 0, None, 42, 5)  # (topic, partition, ..., pid, seq) as scanned
    with pytest.raises(ClientError) as refused:
        state.check_batch("orders", [frame])
    assert gap_expected(str(refused.value)) == 1
    assert gap_expected("putb_idem: sub-record 5 of 7: sequence 1 of producer 42 (orders-2) was stored at offset 1 "
                        "with other content: a resend must be the same message; nothing was stored") is None
    assert gap_expected("message of 307200 bytes exceeds the limit") is None


def test_a_batch_refused_for_other_content_skips_above_every_sequence_given_then_rebases_to_the_brokers_next():
    seqs = Sequences()
    a = reserved(seqs, 10)  # 0..9: its outcome unknown (a copy of it may still be stored)
    seqs.finished_run(a, 10)
    b = reserved(seqs, 4)  # 10..13: refused as a gap, the broker expecting 0
    assert seqs.rebase(b, 4, 0) == 0 and (seqs.next, seqs.top) == (4, 14)
    # a's copy was stored after all: b, under 0..3, is refused for other content; it goes above all given so far
    assert seqs.skip(0, 4) == 14 and (seqs.next, seqs.low, seqs.top) == (18, 14, 18)
    assert seqs.rebase(14, 4, 10) == 10 and (seqs.next, seqs.top) == (14, 18)  # the broker holds 0..9: next 10
    seqs.finished_run(10, 4)
    assert seqs.low == 14 and reserved(seqs, 1) == 14


def test_a_release_gives_the_failed_batchs_sequences_to_the_next_only_when_no_other_send_holds_any():
    seqs = Sequences()
    a = reserved(seqs, 3)
    assert seqs.release(a, 3) and (seqs.next, seqs.low, seqs.top) == (0, 0, 3)
    a = reserved(seqs, 3)
    later = reserved(seqs, 1)  # a send reserved after it
    assert seqs.skip(a, 3) is None and (seqs.next, seqs.low) == (4, 0)  # not the newest reserved: nothing moves
    assert not seqs.release(a, 3) and (seqs.next, seqs.low) == (4, 3)  # its sequences stay, answered
    seqs.finished(later)
    assert seqs.low == 4
