"""What the differential fuzzers found, each kept as the smallest input that shows it, until the C helper and its
Python definition agree on it again."""

import pytest

from metaq import speedups
from metaq.store.record import encode_record
from tests.fuzz import differential

needs_c = pytest.mark.skipif(speedups.load("scan_log", None) is None,
                             reason="metaq._speedups was not built, or METAQ_PURE_PYTHON asks for the twins")


@needs_c
@pytest.mark.xfail(strict=True, raises=differential.Difference,
                   reason="scan_log in C writes an index unit's log position past int64 wrapped (base + the "
                          "record's place, unsigned), where scan_log_py's refuses it (struct.error): neither checks "
                          "base against size up front")
def test_scan_log_twins_agree_on_a_segment_whose_base_is_near_the_int64_bound():
    log = encode_record("t", 0, 0, 1, 1, 1, 0, b"hello") * 2
    differential._compare("metaq.store.recovery_scan", "scan_log", "scan_log_py", log, 0, len(log),
                          2 ** 63 - len(log) // 2, 10)  # the second record at 2 ** 63
