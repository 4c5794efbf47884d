"""The log's positions (``metaq.store.positions``): what a truncation tells a wait for a position. Pure."""

from metaq.store.positions import RECENT_CUTS, LogPositions


def cut_log(cuts):
    pos = LogPositions(async_visible=True)
    pos.written = 1000
    for at in cuts:
        pos.cut(at)
    return pos


def test_a_wait_is_told_of_a_cut_before_its_position_only_when_the_cut_came_after_it_began():
    pos = cut_log([])
    seen = pos.cuts
    assert not pos.cut_below(seen, 900)
    pos.cut(800)
    assert pos.written == 800
    assert pos.cut_below(seen, 900)  # its write was past the cut
    assert not pos.cut_below(seen, 800) and not pos.cut_below(seen, 500)  # at or below the cut: still there
    assert not pos.cut_below(pos.cuts, 900)  # a wait that began after the cut
    pos.written = 1200
    pos.cut(1100)
    assert pos.cut_below(seen, 900)  # the lowest cut since it began counts, not the last
    assert not pos.cut_below(seen + 1, 900)


def test_more_cuts_than_remembered_count_as_a_cut_below_any_position():
    pos = cut_log([])
    seen = pos.cuts
    for _ in range(RECENT_CUTS):
        pos.cut(990)
    assert pos.cut_below(seen, 995) and not pos.cut_below(seen, 990)  # at the limit: each one remembered
    pos.cut(990)
    assert pos.cut_below(seen, 10)  # one past: the first ones forgotten, so the wait cannot know
    assert not pos.cut_below(seen + 1, 990)


def test_a_flush_that_ran_across_a_cut_marks_nothing_past_the_cut_durable():
    """A flush covers what was written when it began; cut meanwhile and written again past the cut (other records,
    which its fdatasync may not have reached), the log is durable up to the cut only: a wait there must lead the
    next round, not be answered by this one."""
    pos = cut_log([])
    pos.flush_begins()
    pos.cut(800)
    pos.written = 1200
    pos.flushed_to(1000)
    assert pos.flushed == 800
    pos.flush_begins()  # the next one: no cut while it ran
    pos.flushed_to(1200)
    assert pos.flushed == 1200
    pos.cut(1100)  # no flush in progress: nothing to bound
    pos.written = 1300
    pos.flush_begins()
    pos.flushed_to(1300)
    assert pos.flushed == 1300
