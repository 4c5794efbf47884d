"""Index units that do not name their records are rebuilt from the log (issue 53 point 9): by recovery, and by
``check_units`` (a slave's, before each catch-up).

A lost write leaves a page of units empty, the first page of an index file where it showed: a restart trusted
them up to its checkpoint (it looks at each file's last unit) and a read then answered 512 (corrupt record,
commit-log position 0) for records intact in the log. Here the units are damaged on disk or in the live map: a
first page zeroed, a unit pointing at position 0 (another partition's record), a unit pointing into the middle of
its record; every record must then read as written, and what was rebuilt is counted.
A unit whose record the log no longer holds stays what it was (a corrupt record), logged.
"""

import logging
import os

import pytest

from metaq.store import limits as store_limits
from metaq.errors import CorruptRecord
from metaq.store.index import UNIT, UNIT_SIZE
from metaq.store.mapped import MappedFile
from tests.harness.store import NOW, open_store, payload_of, read_all

pytestmark = pytest.mark.fault  # files damaged

CFG = dict(segment_size=64 << 10, index_file_units=512)  # index files of two pages; several segments
COUNT = 2600


def payload(i):
    return b"m%05d-" % i + b"x" * (i % 40)


@pytest.fixture
def written(data_dir):
    """A store holding COUNT messages in test-1 (test-0 and test-2 between them), stopped cleanly; the payloads."""
    s = open_store(data_dir, **CFG)
    for i in range(COUNT):
        s.put("test", 1, 0, payload(i), NOW)
        s.put("test", i % 3 and 2, 0, b"other-%d" % i, NOW)
    s.close(NOW)
    return [payload(i) for i in range(COUNT)]


def index_path(data_dir, first_unit):
    return os.path.join(str(data_dir), "index", "test", "1", "%020d" % (first_unit * UNIT_SIZE))


def write_units(data_dir, first_unit, n, units):
    """Write ``units`` (bytes) at unit ``n`` of the index file starting at ``first_unit`` (its file, on disk)."""
    with open(index_path(data_dir, first_unit), "r+b") as f:
        f.seek((n - first_unit) * UNIT_SIZE)
        f.write(units)


def damage(data_dir):
    """The first page of a file zeroed, a file's first unit naming position 0 (another partition's record), another
    one naming its record's middle; returns how many units were damaged. Each file's last unit stays (a restart
    trusts the units below its checkpoint when those are used)."""
    write_units(data_dir, 512, 512, bytes(256 * UNIT_SIZE))  # the first page of the second file
    write_units(data_dir, 1024, 1024, UNIT.pack(0, 40, 0))
    with open(index_path(data_dir, 1536), "rb") as f:
        phys, size, tag = UNIT.unpack(f.read(UNIT_SIZE))
    write_units(data_dir, 1536, 1536, UNIT.pack(phys + 8, size, tag))
    return 256 + 1 + 1


def test_recovery_rebuilds_units_that_do_not_name_their_records_from_the_log(data_dir, written, caplog):
    caplog.set_level(logging.WARNING, logger="metaq")
    bad = damage(data_dir)
    s = open_store(data_dir, **CFG)  # a clean restart: the checkpoint trusts every file's last unit but one
    assert s.recovery.index_units_repaired == bad
    assert [payload_of(m) for m in read_all(s, "test", 1)] == written
    assert "index units 512..767 of test-1 did not name their records: 256 rebuilt" in caplog.text
    s.close(NOW)
    s = open_store(data_dir, **CFG)  # rebuilt on disk too: nothing to do the next time
    assert s.recovery.index_units_repaired == 0
    assert [payload_of(m) for m in read_all(s, "test", 1)] == written
    s.close(NOW)


def test_check_units_rebuilds_damaged_units_of_a_live_store(data_dir, written):
    s = open_store(data_dir, **CFG)
    bad = damage(data_dir)  # through the files: the store's maps see it (one page cache)
    with pytest.raises(CorruptRecord) as exc:
        s.read("test", 1, 512, 1 << 20)
    assert exc.value.offset == 512 and exc.value.position == 0
    assert s.check_units() == bad
    assert [payload_of(m) for m in read_all(s, "test", 1)] == written
    assert s.check_units() == 0
    s.close(NOW)


def test_a_unit_whose_record_is_gone_from_the_log_stays_corrupt_and_is_logged(data_dir, written, caplog):
    caplog.set_level(logging.WARNING, logger="metaq")
    with open(index_path(data_dir, 512), "r+b") as f:
        phys = UNIT.unpack(f.read(UNIT_SIZE))[0]
    write_units(data_dir, 512, 512, bytes(UNIT_SIZE))
    seg = os.path.join(str(data_dir), "commitlog", "%020d" % (phys - phys % CFG["segment_size"]))
    with open(seg, "r+b") as f:  # its record damaged too (one payload byte: it fails its CRC)
        f.seek(phys % CFG["segment_size"] + 60)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))
    s = open_store(data_dir, **CFG)
    assert s.recovery.index_units_repaired == 0
    assert "index units 512..512 of test-1 do not name their records" in caplog.text
    with pytest.raises(CorruptRecord) as exc:
        s.read("test", 1, 512, 1 << 20)
    assert exc.value.offset == 512
    assert [payload_of(m) for m in read_all(s, "test", 1, start=513)] == written[513:]
    s.close(NOW)


def _stretch(s, n):
    """The log bytes between the records before and after record ``n`` of test-1 (what a read's repair scans)."""
    p = s._parts[("test", 1)]
    before, after = p.unit(n - 1), p.unit(n + 1)
    return after[0] - (before[0] + before[1])


@pytest.mark.parametrize("past", [0, 1], ids=["at the limit", "one past it"])
def test_a_read_rebuilds_a_unit_when_the_stretch_is_within_the_limit_and_answers_512_past_it(
        data_dir, written, monkeypatch, past):
    s = open_store(data_dir, **CFG)
    monkeypatch.setattr(store_limits, "UNIT_REPAIR_READ_BYTES", _stretch(s, 1024) - past)
    p = s._parts[("test", 1)]
    good = p.unit(1024)
    f = p.file_for(1024)
    f.mm[(1024 - f.start) * UNIT_SIZE:(1025 - f.start) * UNIT_SIZE] = bytes(UNIT_SIZE)
    if past:
        with pytest.raises(CorruptRecord) as exc:
            s.read("test", 1, 1024, 1 << 20)
        assert exc.value.offset == 1024 and s.reads.corrupt_reads == 1
        assert p.unit(1024) == (0, 0, 0)  # left to check_units (the next start or catch-up)
    else:
        assert payload_of(bytes(s.read("test", 1, 1024, 1 << 20).views[0])) == written[1024]
        assert p.unit(1024) == good and s.reads.corrupt_reads == 0
    s.close(NOW)


def test_a_read_rebuilds_no_unit_from_pages_not_in_memory(data_dir, written, monkeypatch):
    s = open_store(data_dir, **CFG)
    p = s._parts[("test", 1)]
    f = p.file_for(1024)
    f.mm[(1024 - f.start) * UNIT_SIZE:(1025 - f.start) * UNIT_SIZE] = bytes(UNIT_SIZE)
    monkeypatch.setattr(MappedFile, "resident", lambda self, pos: False)  # as if every page were cold
    with pytest.raises(CorruptRecord):
        s.read("test", 1, 1024, 1 << 20)
    monkeypatch.undo()
    assert s.check_units() == 1  # what the next start or catch-up does, off the loop
    assert payload_of(bytes(s.read("test", 1, 1024, 1 << 20).views[0])) == written[1024]
    s.close(NOW)
