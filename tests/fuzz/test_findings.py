"""What the differential fuzzers found, each kept as the smallest input that showed it, the C helper and its Python
definition agreeing on it now."""

import pytest

from metaq import speedups
from metaq.store.record import encode_record
from tests.fuzz import differential

needs_c = pytest.mark.skipif(speedups.load("scan_log", None) is None,
                             reason="metaq.native._bytes was not built, or METAQ_PURE_PYTHON asks for the twins")


@needs_c
def test_scan_log_twins_agree_on_a_segment_whose_base_is_near_the_int64_bound():
    """Found by the scan_log fuzzer: C wrapped a record's log position past int64 where Python refused it. Both
    now refuse a base that leaves the segment's positions past int64, with one ValueError."""
    log = encode_record("t", 0, 0, 1, 1, 1, 0, b"hello") * 2
    differential._compare("metaq.store.recovery_scan", "scan_log", "scan_log_py", log, 0, len(log),
                          2 ** 63 - len(log) // 2, 10)  # the second record at 2 ** 63
    assert differential.answer(speedups.load("scan_log", None), log, 0, len(log), 2 ** 63 - 1 - len(log), 10)[0] != \
        "raised"  # the last base that fits is scanned


def test_a_segment_name_past_int64_is_not_one_of_ours():
    """The same finding from the disk's side: a segment's base comes from its twenty-digit name, so a name past
    int64 (never written by a broker) is not read as a segment."""
    from metaq.store.files import parse_offset_name
    assert parse_offset_name("%020d" % (2 ** 63 - 1)) == 2 ** 63 - 1
    assert parse_offset_name("%020d" % 2 ** 63) is None
    assert parse_offset_name("9" * 20) is None
