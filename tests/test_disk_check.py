"""The run's own disk check (tests/conftest.py): a disk above the brokers' danger mark stops the run with one clear
reason instead of hundreds of refused puts (a CI run once failed 258 tests that way)."""

from metaq.store.files import DiskUsage
from tests.conftest import disk_verdict

GIB = 1 << 30


def test_a_disk_above_the_danger_mark_refuses_the_run_and_says_how_much_to_free():
    usage = DiskUsage(used_bytes=935 * GIB, available_bytes=65 * GIB)  # 93.5 %
    refuse, message = disk_verdict(usage, 0.90, peak_bytes=6 * GIB)
    assert refuse
    assert "93.5% full" in message and "danger mark 90%" in message
    assert "Free 41.0 GiB" in message  # 935 + 6 - 900


def test_a_disk_that_a_full_run_would_push_over_the_mark_is_warned_about_not_refused():
    usage = DiskUsage(used_bytes=897 * GIB, available_bytes=103 * GIB)  # 89.7 %: 6 GiB more crosses 90 %
    refuse, message = disk_verdict(usage, 0.90, peak_bytes=6 * GIB)
    assert not refuse
    assert "may cross" in message


def test_one_byte_below_the_peak_margin_is_room_enough():
    usage = DiskUsage(used_bytes=894 * GIB - 1, available_bytes=106 * GIB + 1)
    assert disk_verdict(usage, 0.90, peak_bytes=6 * GIB) == (False, None)
    usage = DiskUsage(used_bytes=894 * GIB, available_bytes=106 * GIB)
    assert disk_verdict(usage, 0.90, peak_bytes=6 * GIB)[0] is False
    assert disk_verdict(usage, 0.90, peak_bytes=6 * GIB)[1] is not None
