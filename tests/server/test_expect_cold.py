"""A get's expect, and each of a get_prio's (loop/expect.py), names any offset the broker holds: its index
unit and record header may be cold, and are brought in off the event loop before they are compared (no network)."""

from types import SimpleNamespace

import gevent
import pytest

from metaq import errors
from metaq.loop import coldpages
from metaq.loop.expect import check_held


def test_a_cold_expect_is_brought_in_off_the_loop_then_compared(tmp_path, monkeypatch):
    from tests.harness.store import NOW
    from tests.filters.test_tagscan import cold_record_head

    s, n, want, _index = cold_record_head(tmp_path)
    try:
        pool, applied = gevent.get_hub().threadpool, []

        def apply(f, args=()):  # the pool's own, noted: a populate run off the loop
            applied.append(f)
            return pool.apply(f, args)

        hub = SimpleNamespace(threadpool=SimpleNamespace(apply=apply))
        monkeypatch.setattr(coldpages, "gevent", SimpleNamespace(get_hub=lambda: hub))
        with pytest.raises(errors.Diverged, match="offset %d holds message %d here, not %d" % (n, want, want + 1)):
            check_held(s, "test", 0, (n, want + 1))
        # the unit, then the header it points to: both populated in the pool
        assert [f.__name__ for f in applied] == ["populate", "populate"]
        [(header_file, start, end)] = s.msg_id_at("test", 0, n, ranges=True)
        assert all(header_file.resident(pos) for pos in range(start - start % 4096, end, 4096))
        check_held(s, "test", 0, (n, want))  # the same id: no error, and nothing cold any more
        assert len(applied) == 2
    finally:
        s.close(NOW + 3)
