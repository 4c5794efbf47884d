"""client/divergence.py: the records a fetcher remembers to find where two logs diverge (no network)."""

import pytest

from metaq import errors
from metaq.client import limits as client_limits
from metaq.client.divergence import (MATCH, MISMATCH, UNKNOWN, Checkpoints, ReadsKept, probe_verdict,
                                     rewind_time_ms)
from metaq.protocol.msgid import id_timestamp_ms
from metaq.store.msgid import IdGenerator


def reread_for(cps, depth):
    """Records read again after a divergence ``depth`` records before the newest: from the newest kept one at or
    before that point."""
    points = [o for o, _id in cps.newest_first()]
    return points[0] - max(o for o in points if o <= points[0] - depth)


@pytest.mark.parametrize("start, count", [(0, 1), (0, 2), (7, 33), (1000, 1000), (0, 100_000)])
def test_a_divergence_d_back_is_found_with_at_most_3d_read_again(start, count):
    cps = Checkpoints()
    for n in range(start, start + count):
        cps.add(n, n + 1)
    assert all(reread_for(cps, d) <= 3 * d for d in range(count)), cps.newest_first()
    assert cps.newest_first()[-1] == (start, start + 1)  # the first record read stays
    assert all(cid == o + 1 for o, cid in cps.newest_first())  # each point keeps its own id
    assert len(cps) <= 2 * count.bit_length() + 1  # a few dozen points for any real read


def test_the_limit_holds_for_any_offsets_and_one_below_it_is_refused():
    cps = Checkpoints()
    offset = 0
    for k in range(63):  # reads spread over the whole 64-bit range: every level holds two blocks
        for step in (1, 1 << k):
            offset += step
            cps.add(offset, offset)
    assert len(cps) <= client_limits.MAX_FETCH_CHECKPOINTS
    assert Checkpoints(limit=client_limits.MAX_FETCH_CHECKPOINTS).limit == client_limits.MAX_FETCH_CHECKPOINTS
    with pytest.raises(ValueError, match="at least 129"):
        Checkpoints(limit=client_limits.MAX_FETCH_CHECKPOINTS - 1)


def test_last_cut_and_a_rewound_add_drop_what_lies_after():
    cps = Checkpoints()
    for n in range(10, 15):
        cps.add(n, n * 10)
    assert cps.last() == (14, 140)
    cps.cut(12)
    assert all(o < 12 for o, _ in cps.newest_first()) and cps.last() == cps.newest_first()[0]
    assert cps.last()[1] == cps.last()[0] * 10 and cps.newest_first()[-1] == (10, 100)
    cps.add(11, 999)  # read again from 11 on another log: the old 11 is replaced
    assert cps.last() == (11, 999) and (11, 110) not in cps.newest_first()
    for n in range(12, 40):  # and reading on keeps the bound
        cps.add(n, n)
    assert all(reread_for(cps, d) <= 3 * d for d in range(40 - 10))
    cps.clear()
    assert cps.last() is None and cps.newest_first() == []


@pytest.mark.parametrize("kind, moved_to, verdict", [
    ("value", None, MATCH), ("404", None, MATCH), ("412", None, MISMATCH),
    ("301", 5, UNKNOWN),  # past the broker's end: it does not hold offset 9
    ("301", 20, MATCH),  # below the broker's minimum: nothing older is held there
])
def test_probe_verdicts(kind, moved_to, verdict):
    assert probe_verdict(9, kind, moved_to) == verdict


def test_an_unknown_probe_reply_is_refused():
    with pytest.raises(ValueError, match="unknown probe reply"):
        probe_verdict(9, "500")


def test_the_time_fallback_goes_back_from_the_oldest_id():
    gen = IdGenerator(7)
    old, new = gen.next_id(1_700_000_000_000), gen.next_id(1_700_000_050_000)
    assert id_timestamp_ms(old) == 1_700_000_000_000
    assert rewind_time_ms([new, old]) == 1_700_000_000_000 - client_limits.DIVERGENCE_REWIND_MS
    with pytest.raises(errors.ClientError):
        rewind_time_ms([])


def read(first, last):
    cps = Checkpoints()
    for offset in range(first, last + 1):
        cps.add(offset, 1000 + offset)
    return cps


def test_reads_kept_are_taken_once_by_a_fetcher_starting_where_the_stopped_one_was():
    kept = ReadsKept(limit=4)
    cps = read(0, 99)
    kept.keep(("t", 0), 100, 1099, cps)
    assert kept.take(("t", 0), 100, 1099) is cps
    assert kept.take(("t", 0), 100, 1099) is None  # once
    kept.keep(("t", 0), 100, 1099, cps)
    assert kept.take(("t", 0), 100) is cps  # a commit without an id: the offset alone
    kept.keep(("t", 0), 100, -1, cps)  # a fetcher that knew no id (a seek, a 301)
    assert kept.take(("t", 0), 100, 1099) is cps
    for offset, msg_id in ((101, 1099), (100, 7)):  # another consumer moved it, or it is another record
        kept.keep(("t", 0), 100, 1099, cps)
        assert kept.take(("t", 0), offset, msg_id) is None
        assert len(kept) == 0  # dropped either way
    kept.keep(("t", 1), 5, -1, Checkpoints())  # nothing read: nothing kept
    assert len(kept) == 0


def test_reads_kept_hold_the_limit_and_drop_the_oldest_one_past_it():
    kept = ReadsKept(limit=client_limits.MAX_KEPT_FETCH_READS)
    for p in range(client_limits.MAX_KEPT_FETCH_READS):
        kept.keep(("t", p), 10, 1009, read(0, 9))
    assert len(kept) == client_limits.MAX_KEPT_FETCH_READS
    kept.keep(("t", "one past"), 10, 1009, read(0, 9))
    assert len(kept) == client_limits.MAX_KEPT_FETCH_READS
    assert kept.take(("t", 0), 10) is None  # the oldest went
    assert kept.take(("t", 1), 10) is not None and kept.take(("t", "one past"), 10) is not None
    with pytest.raises(ValueError):
        ReadsKept(limit=-1)
    none = ReadsKept(limit=0)
    none.keep(("t", 0), 10, 1009, read(0, 9))
    assert len(none) == 0
