"""A damaged index unit never serves a record it does not name (found by a disk review: a unit of one topic
overwritten with another topic's served the other topic's message, with no error and nothing counted), and a unit
pointing outside the log is a corrupt record (512, with where to resume), not a bare 500; the records before it
are served. Every read path: views, joined (copied and checked in place), records, tag-filtered. A unit whose
record lies near (within ``UNIT_REPAIR_READ_BYTES`` between its neighbours') and in memory is instead rebuilt from
the log by the read that meets it, which then serves that record (issue 53 point 9)."""

import pytest

from metaq import errors
from metaq.store import limits as store_limits
from metaq.filters.wire import parse_tag_expression
from metaq.store.index import UNIT
from tests.harness.store import NOW, open_store

READS = {
    "views": lambda s, n: s.read("test", 0, n, 1 << 20).count,
    "joined": lambda s, n: s.read_joined("test", 0, n, 1 << 20).count,
    "mapped": lambda s, n: s.read_joined("test", 0, n, 1 << 20, mapped=True).count,
    "records": lambda s, n: len(s.read_records("test", 0, n, 100, 1 << 20)[0]),
    "tagged": lambda s, n: len(s.read_tagged("test", 0, n, parse_tag_expression("A"), 100, 1 << 20).hits),
}


@pytest.fixture
def store(tmp_path):
    s = open_store(tmp_path / "data", segment_size=1 << 20)
    for i in range(10):
        for partition in (0, 1):
            s.put("test", partition, 1, b"\x00\x00\x00\x01A" + b"p%d-%d" % (partition, i), NOW + i)  # tag "A"
    yield s
    s.close(NOW)


def damage(s, n, unit):
    f = s._parts[("test", 0)].files[0]
    f.view[n * 16:(n + 1) * 16] = unit


def unit_of(s, partition, n):
    return bytes(s._parts[("test", partition)].files[0].view[n * 16:(n + 1) * 16])


@pytest.mark.parametrize("read", sorted(READS))
@pytest.mark.parametrize("case", ["another partition's record", "its own earlier record", "outside the log",
                                  "zeroed"])
def test_a_damaged_unit_is_a_corrupt_record_and_the_records_before_it_are_served(store, read, case, monkeypatch):
    # rebuilding it on the spot would read more log than UNIT_REPAIR_READ_BYTES (here: any): a corrupt record
    monkeypatch.setattr(store_limits, "UNIT_REPAIR_READ_BYTES", -1)
    unit = damaged_unit(store, case)
    damage(store, 4, unit)
    assert READS[read](store, 0) == 4  # records 0..3, then it stops
    with pytest.raises(errors.CorruptRecord) as info:
        READS[read](store, 4)
    assert (info.value.offset, info.value.next_offset) == (4, 5)  # where a consumer that skips corrupt records goes on
    assert READS[read](store, 5) == 5  # the records after it are served


@pytest.mark.parametrize("read", sorted(READS))
@pytest.mark.parametrize("case", ["another partition's record", "its own earlier record", "outside the log",
                                  "zeroed"])
def test_a_damaged_unit_whose_record_is_near_and_in_memory_is_rebuilt_by_the_read(store, read, case, caplog):
    good = unit_of(store, 0, 4)
    damage(store, 4, damaged_unit(store, case))
    assert READS[read](store, 0) == 4  # records 0..3, then it stops: the read that starts at it rebuilds it
    assert READS[read](store, 4) == 6  # records 4..9, 4 the one its (rebuilt) unit names
    assert unit_of(store, 0, 4) == good
    assert store.reads.corrupt_reads == 0
    assert "index units 4..4 of test-0 did not name their records: 1 rebuilt" in caplog.text


def damaged_unit(store, case):
    tag = UNIT.unpack(unit_of(store, 0, 4))[2]  # kept: a tag-filtered read passes over a unit of another tag unread
    return {"another partition's record": unit_of(store, 1, 4), "its own earlier record": unit_of(store, 0, 1),
            "outside the log": UNIT.pack(1 << 40, 100, tag), "zeroed": UNIT.pack(0, 0, tag)}[case]
