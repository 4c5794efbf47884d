"""The timer service's hand-off to its indexer: bounded, in log order, only durable consecutive records taken;
anything else leaves the indexer to read the log."""

from metaq.limits import MAX_TIMER_FRESH
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
    run = h.take(0, 10**9, 10**9)
    assert [r[0] for r in run] == list(range(MAX_TIMER_FRESH)) and h.taken == MAX_TIMER_FRESH
    assert h.head(MAX_TIMER_FRESH) is None  # the indexer reads that one from the log


def test_a_runs_records_end_where_they_lie_and_only_flushed_ones_are_taken():
    h = Handoff(TLEN)
    sizes = [10, 200, 30]
    log_end = 5000
    h.add_run(7, 70, ["a", "b", "c"], sizes, log_end)
    ends = [log_end - record_size(TLEN, 30) - record_size(TLEN, 200), log_end - record_size(TLEN, 30), log_end]
    assert h.head(7)[3] == ends[0]
    assert h.take(7, ends[1], 10) == [(7, 70, "a", ends[0]), (8, 71, "b", ends[1])]  # c is not durable yet
    assert h.take(9, ends[2] - 1, 10) == []
    assert h.take(9, ends[2], 10) == [(9, 72, "c", ends[2])]


def test_a_gap_or_an_offset_already_indexed_is_not_taken():
    h = Handoff(TLEN)
    for off in (3, 4, 6):  # 5 was written by someone else (not handed over)
        h.add(off, off, TimerCancel(off), off * 100)
    assert h.head(2) is None  # the indexer is before what was handed over: it reads the log
    assert h.head(4)[0] == 4  # 3 was indexed (from the log): dropped
    assert [r[0] for r in h.take(4, 10**6, 10)] == [4]  # stops at the gap
    assert h.head(5) is None and h.head(6)[0] == 6
    assert h.take(6, 10**6, 0) == []  # at most none
    h.clear()
    assert len(h) == 0 and h.head(6) is None


def test_at_the_byte_limit_the_data_is_kept_and_one_byte_past_it_is_left_to_the_log():
    from metaq.limits import MAX_TIMER_FRESH_BYTES
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
    assert [r[0] for r in h.take(0, 10**6, 10)] == [0, 1]
    assert h.nbytes == 0 and h.head(3)[2] == TimerCancel(7)
