"""The timer service's delivery window (timers/window.py): bounded by rows and by bytes (at and one past each),
in due order, every pending row due before its end and none twice, with a real timers.db giving the rows."""

from metaq.timers.limits import MAX_TIMER_WINDOW_BYTES, MAX_TIMER_WINDOW_ROWS, TIMER_WINDOW_MS
from metaq.timers.records import TimerEntry
from metaq.timers.window import DeliveryWindow
from metaq.timers.index import TimerIndex

NOW = 1_790_000_000_000


def entry(due, size=10):
    return TimerEntry("t", 0, 0, 1, due, NOW, b"x" * size)


def index_with(tmp_path, entries):
    ix = TimerIndex(str(tmp_path))
    ix.apply(entries, len(entries), NOW)
    return ix


def load(win, ix, now=NOW):
    until = now + TIMER_WINDOW_MS
    rows, cut_due = ix.window_rows(None, until, win.max_rows, win.max_bytes)
    return win.load(rows, cut_due, until, now, set())


def test_a_load_stops_at_the_byte_limit_and_one_past_waits(tmp_path):
    per = MAX_TIMER_WINDOW_BYTES // 4
    ix = index_with(tmp_path, [(i, entry(NOW + 10 + i, per)) for i in range(6)])
    win = DeliveryWindow()
    load(win, ix)
    assert [item[1] for item in win.items] == [0, 1, 2, 3] and win.nbytes == MAX_TIMER_WINDOW_BYTES  # the limit
    assert win.cut and win.until == NOW + 14  # the fifth (one past) waits: due at the new end
    assert win.full(1)


def test_a_single_message_larger_than_the_budget_is_still_taken(tmp_path):
    ix = index_with(tmp_path, [(1, entry(NOW + 5, MAX_TIMER_WINDOW_BYTES + 1)), (2, entry(NOW + 6))])
    win = DeliveryWindow()
    load(win, ix)
    assert [item[1] for item in win.items] == [1] and win.cut


def test_a_full_window_gives_back_its_latest_rows_for_an_earlier_one():
    win = DeliveryWindow(max_rows=3)
    win.load([(i, NOW + 100 * i, "t", 0, 0, 1, NOW, b"x") for i in (1, 2, 3)], None, NOW + 1000, NOW, set())
    assert win.add([(9, entry(NOW + 150, 1))], set())  # earlier than the last: the last goes back
    assert [item[1] for item in win.items] == [1, 9, 2] and win.until == NOW + 300 and win.cut
    assert not win.add([(10, entry(NOW + 250, 1))], set())  # at the limit, later than the last: waits
    assert win.until == NOW + 250 and len(win) == 3


def test_the_row_limit_and_one_past(tmp_path):
    n = MAX_TIMER_WINDOW_ROWS + 1
    ix = index_with(tmp_path, [(i, entry(NOW + 1 + i // 2, 1)) for i in range(n)])
    win = DeliveryWindow()
    load(win, ix)
    assert len(win) < MAX_TIMER_WINDOW_ROWS + 1 and win.cut
    assert all(item[0] < win.until for item in win.items)


def test_an_extension_appends_in_due_order_none_twice(tmp_path):
    ix = index_with(tmp_path, [(i, entry(NOW + 10 + i // 3)) for i in range(60)])
    win = DeliveryWindow(max_rows=20)
    load(win, ix)
    start = win.until
    assert win.cut and len(win) < 20
    for _ in range(10):  # deliver some
        win.remove_at(0)
    rows_room, bytes_room = win.room()
    rows, cut_due = ix.window_rows(start, NOW + TIMER_WINDOW_MS, rows_room, bytes_room)
    taken = win.extend(start, rows, cut_due, NOW + TIMER_WINDOW_MS, NOW, set())
    assert taken
    ids = [item[1] for item in win.items]
    assert len(ids) == len(set(ids)) and [item[0] for item in win.items] == sorted(item[0] for item in win.items)
    assert all(item[0] < win.until for item in win.items) and win.nbytes == 10 * len(win)
    assert win.extend(start, rows, cut_due, NOW + TIMER_WINDOW_MS, NOW, set()) is None  # the end moved: dropped
