"""The timer service's hand-off to the timer index's subscriber: bounded, in log order, a record taken only for its
offset and the log's message id there; anything else leaves the subscriber to decode the log."""

from metaq.timers.limits import MAX_TIMER_FRESH
from metaq.timers.records import TIMER_TOPIC, TimerCancel
from metaq.timers.handoff import Handoff
from metaq.store.record import record_size

TLEN = len(TIMER_TOPIC.encode())


def test_at_the_limit_every_record_is_kept_and_one_past_is_left_to_the_log():
    h = Handoff(TLEN)
    h.add_run(0, 100, [TimerCancel(i) for i in range(MAX_TIMER_FRESH - 1)], [16] * (MAX_TIMER_FRESH - 1), 10**9)
    h.add(MAX_TIMER_FRESH - 1, 100 + MAX_TIMER_FRESH - 1, TimerCancel(-1), 10**9)
    assert len(h) == MAX_TIMER_FRESH
    h.add(MAX_TIMER_FRESH, 0, TimerCancel(-2), 10**9)  # one past: not kept
    h.add_run(MAX_TIMER_FRESH, 0, [TimerCancel(-3)], [16], 10**9)
    assert len(h) == MAX_TIMER_FRESH
    assert [h.get(i, 100 + i) for i in range(MAX_TIMER_FRESH)][-2:] == [TimerCancel(MAX_TIMER_FRESH - 2),
                                                                         TimerCancel(-1)]
    assert h.taken == MAX_TIMER_FRESH and h.nbytes == 0
    assert h.get(MAX_TIMER_FRESH, 0) is None  # the subscriber decodes that one from the log


def test_a_runs_records_end_where_they_lie():
    h = Handoff(TLEN)
    sizes = [10, 200, 30]
    log_end = 5000
    h.add_run(7, 70, ["a", "b", "c"], sizes, log_end)
    ends = [log_end - record_size(TLEN, 30) - record_size(TLEN, 200), log_end - record_size(TLEN, 30), log_end]
    assert [h.head(7 + k)[3] for k in range(3)] == ends
    assert h.get(9, 72) == "c" and len(h) == 0


def test_a_record_whose_message_id_is_not_the_logs_is_not_taken():
    h = Handoff(TLEN)
    h.add(3, 30, TimerCancel(1), 100)
    assert h.get(3, 31) is None and h.taken == 0  # the log has another message there: decoded from the log
    assert h.get(3, 30) == TimerCancel(1) and h.taken == 1


def test_a_gap_or_an_offset_already_indexed_is_not_taken():
    h = Handoff(TLEN)
    for off in (3, 4, 6):  # 5 was written by someone else (not handed over)
        h.add(off, off, TimerCancel(off), off * 100)
    assert h.head(2) is None  # the indexer is before what was handed over: it reads the log
    assert h.head(4)[0] == 4  # 3 was indexed (from the log): dropped
    assert h.get(4, 4) == TimerCancel(4)
    assert h.get(5, 5) is None and h.head(6)[0] == 6  # the gap: from the log
    h.clear()
    assert len(h) == 0 and h.head(6) is None


def test_at_the_byte_limit_the_data_is_kept_and_one_byte_past_it_is_left_to_the_log():
    from metaq.timers.limits import MAX_TIMER_FRESH_BYTES
    from metaq.timers.records import TimerEntry

    def entry(n):
        return TimerEntry("t", 0, 0, 1, 5, 5, b"x" * n)

    h = Handoff(TLEN)
    half = MAX_TIMER_FRESH_BYTES // 2
    h.add(0, 0, entry(half), 10)
    h.add_run(1, 1, [entry(MAX_TIMER_FRESH_BYTES - half), entry(1)], [10, 10], 100)  # the limit, then one past
    assert len(h) == 2 and h.nbytes == MAX_TIMER_FRESH_BYTES
    h.add(3, 3, entry(1), 200)  # one byte past
    h.add(3, 3, TimerCancel(7), 200)  # a cancel holds no message data: kept
    assert h.get(0, 0) is not None and h.get(1, 1) is not None and h.get(2, 2) is None
    assert h.nbytes == 0 and h.head(3)[2] == TimerCancel(7)
