"""Times for replay (``metaq.client.replay``): datetimes and ms, naive datetimes as local time; no network."""

import time
from datetime import datetime, timedelta, timezone

import pytest

from metaq.client.replay import check_offset, start_from_time, to_timestamp_ms

#: 2026-01-01T00:00:00Z
JAN1_MS = 1_767_225_600_000


@pytest.fixture
def tokyo(monkeypatch):
    """The process's local zone is Asia/Tokyo (UTC+9, no daylight saving) for the test."""
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_aware_datetimes_are_taken_in_their_own_zone():
    assert to_timestamp_ms(datetime(2026, 1, 1, tzinfo=timezone.utc)) == JAN1_MS
    assert to_timestamp_ms(datetime(2026, 1, 1, 1, 30, tzinfo=timezone(timedelta(hours=1, minutes=30)))) == JAN1_MS
    assert to_timestamp_ms(datetime(2026, 1, 1, 0, 0, 0, 1500, tzinfo=timezone.utc)) == JAN1_MS + 2  # rounded


def test_a_naive_datetime_is_local_time(tokyo):
    assert to_timestamp_ms(datetime(2026, 1, 1, 9, 0)) == JAN1_MS  # 09:00 in Tokyo is midnight UTC
    assert to_timestamp_ms(datetime(2026, 1, 1, 0, 0)) == JAN1_MS - 9 * 3600_000  # not taken as UTC
    ten_ago = datetime.now() - timedelta(minutes=10)  # what a user writes: "ten minutes ago"
    assert abs(to_timestamp_ms(ten_ago) - (time.time() - 600) * 1000) < 5000


def test_ints_are_milliseconds_since_the_epoch():
    assert to_timestamp_ms(JAN1_MS) == JAN1_MS
    assert to_timestamp_ms(0) == 0
    assert to_timestamp_ms(2**63 - 1) == 2**63 - 1


@pytest.mark.parametrize("bad", [-1, 2**63, True, 1.5e12, "1767225600000", "2026-01-01", None,
                                 datetime(1969, 12, 31, 23, 59, tzinfo=timezone.utc)])
def test_anything_else_is_a_value_error(bad):
    with pytest.raises(ValueError) as info:
        to_timestamp_ms(bad)
    assert "Unix epoch" in str(info.value)


def test_start_from_takes_the_two_words_or_a_time():
    assert start_from_time("earliest") is None and start_from_time("latest") is None
    assert start_from_time(datetime(2026, 1, 1, tzinfo=timezone.utc)) == JAN1_MS
    assert start_from_time(JAN1_MS) == JAN1_MS
    for bad in ("newest", "", -5):
        with pytest.raises(ValueError):
            start_from_time(bad)


def test_seek_offsets_are_non_negative_ints():
    assert check_offset(0) == 0 and check_offset(2**62) == 2**62
    for bad in (-1, 1.0, "3", None, False):
        with pytest.raises(ValueError) as info:
            check_offset(bad)
        assert "an offset (an int >= 0) or a time (a datetime)" in str(info.value)
