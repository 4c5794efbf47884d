"""Filtered reads (filters/reads.py through MessageStore.read_tagged): only the wanted records read, the rest passed
over by their index unit's tag hash; collisions compared, never served; reads bounded by records, bytes and units."""

import pytest

from metaq.filters.wire import parse_tag_expression
from metaq.protocol.message import encode_payload
from metaq.protocol.tags import tag_code
from metaq.store.index import UNIT, UNIT_SIZE
from tests.harness.store import NOW, open_store


def tagged_store(tmp_path, tags):
    s = open_store(tmp_path / "f")
    for i, t in enumerate(tags):
        s.put("test", 0, *encode_payload(b"m%d" % i, None if t is None else t + "\x02KEYS\x01k"), NOW)
    return s


def test_read_tagged_reads_only_wanted_records_and_moves_past_the_rest(tmp_path):
    tags = ["A" if i % 10 == 3 else "B" for i in range(40)] + [None, "AB", "A"]
    s = tagged_store(tmp_path, tags)
    before = s.reads.log_read_bytes
    r = s.read_tagged("test", 0, 0, parse_tag_expression("A"), 100, 1 << 20)
    assert [h.offset for h in r.hits] == [3, 13, 23, 33, 42] and r.next_offset == 43
    assert r.skipped == 38 and s.reads.log_read_bytes - before == r.log_bytes == sum(h.size for h in r.hits)
    assert [rec.data[-2:] for rec in r.records()] == [b"m3", b"13", b"23", b"33", b"42"]
    # max_count stops right after the last record taken: nothing after it is passed over
    r = s.read_tagged("test", 0, 0, parse_tag_expression("A || None"), 2, 1 << 20)
    assert [h.offset for h in r.hits] == [3, 13] and r.next_offset == 14
    # max_bytes: one record always; the unwanted units after it are passed over, the next wanted record that
    # would pass the limit is left for the next read
    r = s.read_tagged("test", 0, 4, parse_tag_expression("A"), 100, 1)
    assert [h.offset for h in r.hits] == [13] and r.next_offset == 23
    # nothing wanted: the whole rest passed over, next offset the end
    r = s.read_tagged("test", 0, 0, parse_tag_expression("C"), 100, 1 << 20)
    assert r.hits == [] and r.next_offset == 43 and r.log_bytes == 0
    assert s.read_tagged("test", 0, 43, parse_tag_expression("A"), 1, 1).next_offset == 43  # the end
    with pytest.raises(Exception) as moved:
        s.read_tagged("test", 0, 44, parse_tag_expression("A"), 1, 1)
    assert type(moved.value).__name__ == "Moved" and moved.value.offset == 43
    s.close(NOW)


def test_joined_body_gives_each_record_its_offset(tmp_path):
    from metaq.filters.wire import OFFSET_FIELD, decode_tagged_body

    s = tagged_store(tmp_path, ["A", "B", "A"])
    r = s.read_tagged("test", 0, 0, parse_tag_expression("A"), 100, 1 << 20)
    body, n = r.joined()
    assert n == len(body)
    nxt, records = decode_tagged_body(OFFSET_FIELD.pack(r.next_offset) + body)
    assert nxt == 3 and [(o, rec.data[-2:]) for o, rec in records] == [(0, b"m0"), (2, b"m2")]
    s.close(NOW)


def test_a_hash_collision_is_never_served(tmp_path):
    """A unit whose hash says A but whose record's tags are B (as two tags sharing a hash would) is read,
    compared and passed over."""
    s = tagged_store(tmp_path, ["B", "A", "B"])
    p = s._parts[("test", 0)]
    f = p.file_for(0)
    phys, size, _tag = p.unit(0)
    UNIT.pack_into(f.mm, 0, phys, size, tag_code(b"A"))  # unit 0 now collides with A
    r = s.read_tagged("test", 0, 0, parse_tag_expression("A"), 100, 1 << 20)
    assert [h.offset for h in r.hits] == [1] and r.next_offset == 3
    assert r.log_bytes == 2 * size and r.skipped == 1  # the colliding record was read, the other B unit not
    s.close(NOW)


@pytest.mark.parametrize("budget_records", [1, 2, 3])
def test_colliding_records_count_toward_the_byte_bound(tmp_path, budget_records):
    """CRC-32 collisions can be forged: records whose units collide with the wanted tag are read and compared,
    and what they read counts toward ``max_bytes`` as a hit does. With room for k records a read reads k (one
    at least) and ends before the next, which the following read starts at: nothing wanted is skipped."""
    s = tagged_store(tmp_path, ["B", "B", "B", "A"])
    p = s._parts[("test", 0)]
    f = p.file_for(0)
    for n in range(3):  # units 0..2 now collide with A
        phys, size, _tag = p.unit(n)
        UNIT.pack_into(f.mm, n * UNIT_SIZE, phys, size, tag_code(b"A"))
    size = p.unit(0)[1]
    filt = parse_tag_expression("A")
    r = s.read_tagged("test", 0, 0, filt, 100, budget_records * size)
    assert r.log_bytes == budget_records * size and r.next_offset == budget_records
    assert r.hits == []
    seen, offset = [], r.next_offset
    while True:  # the following reads go on from there and find A
        r = s.read_tagged("test", 0, offset, filt, 100, budget_records * size)
        seen += [h.offset for h in r.hits]
        if r.next_offset == offset or r.next_offset >= 4:
            break
        offset = r.next_offset
    assert seen == [3]
    s.close(NOW)


@pytest.mark.parametrize("extra", [0, 1])
def test_a_scan_stops_at_the_unit_limit(tmp_path, monkeypatch, extra):
    """At most MAX_FILTER_SCAN_UNITS units per read: exactly that many unwanted ones end the read there; one more
    unit (the wanted one) is left for the next read, never skipped."""
    from metaq.store import store as store_module

    limit = 50
    monkeypatch.setattr(store_module, "MAX_FILTER_SCAN_UNITS", limit)
    s = tagged_store(tmp_path, ["B"] * (limit - 1 + extra) + ["A"])
    filt = parse_tag_expression("A")
    r = s.read_tagged("test", 0, 0, filt, 100, 1 << 20)
    if extra == 0:  # the wanted record is the limit-th unit: found
        assert [h.offset for h in r.hits] == [limit - 1] and r.next_offset == limit
    else:  # it is one past the limit: this read ends before it, the next finds it
        assert r.hits == [] and r.next_offset == limit and r.skipped == limit
        r = s.read_tagged("test", 0, r.next_offset, filt, 100, 1 << 20)
        assert [h.offset for h in r.hits] == [limit]
    assert len(s.tagged_index_ranges("test", 0, 0)) == 1
    f, a, b = s.tagged_index_ranges("test", 0, 0)[0]
    assert (a, b) == (0, min(limit, limit + extra) * UNIT_SIZE)
    s.close(NOW)


def test_a_corrupt_wanted_record_is_refused_and_counted(tmp_path):
    s = tagged_store(tmp_path, ["B", "A", "A"])
    phys, size, _tag = s._parts[("test", 0)].unit(1)
    seg = s._log.segment_at(phys)
    seg.view[phys - seg.start + size - 1] ^= 0xFF  # a byte of record 1's payload flipped
    with pytest.raises(Exception) as corrupt:
        s.read_tagged("test", 0, 0, parse_tag_expression("A"), 100, 1 << 20)
    assert type(corrupt.value).__name__ == "CorruptRecord" and corrupt.value.next_offset == 2
    assert s.reads.corrupt_reads == 1
    r = s.read_tagged("test", 0, 2, parse_tag_expression("A"), 100, 1 << 20)
    assert [h.offset for h in r.hits] == [2]
    s.close(NOW)
