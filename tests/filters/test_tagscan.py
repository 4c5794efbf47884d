"""filters/text.py: a get_tags' reads over a store whose log changes between them (no network).

A read that passed over units moves the get's offset; a long poll's later reads, and the reply its timeout sends,
must be about the log as it is: if a failover's cut rewrote the record before that offset meanwhile, the get scans
again from its own offset (the client never saw what was passed over) rather than send an offset (and, with
``:passed``, an id) of another log."""

from types import SimpleNamespace

import pytest

from metaq.protocol import events as ev
from metaq.filters.wire import decode_tagged_reply, parse_tag_expression
from metaq.filters.text import TagScan


class Store:
    """``ids``: {offset: msg_id} of the partition; every record passed over (nothing wanted)."""

    def __init__(self, ids):
        self.ids = ids

    def tagged_index_ranges(self, topic, partition, offset):
        return []  # resident: nothing to bring in

    def msg_id_at(self, topic, partition, offset, ranges=False):
        return [] if ranges else self.ids.get(offset)

    def read_tagged(self, topic, partition, offset, filt, max_count, max_bytes):
        end = max(self.ids) + 1
        return SimpleNamespace(hits=0, skipped=end - offset, next_offset=end)

    def max_offset(self, topic, partition):
        return max(self.ids) + 1


def scan(store, passed=True, expect=None, topic="t"):
    e = ev.GetTags(topic, "g", 0, 0, 1 << 20, "a", 5, 1000, parse_tag_expression("a"), expect, passed)
    stats = SimpleNamespace(filter_skipped_units=0, on_get=lambda topic, missed: None)
    return TagScan(store, stats, e, 1 << 20)


def body_of(reply):
    return reply.split(b"\r\n", 1)[1]


def test_a_long_polls_reply_names_the_record_its_scan_passed_and_a_cut_since_makes_it_scan_again():
    store = Store({o: 100 + o for o in range(10)})
    s = scan(store)
    assert s.read() is None  # passed over 0..9, at the end: the poll waits from 10
    nxt, passed_id, records = decode_tagged_reply(body_of(s.miss()), True)
    assert (nxt, passed_id, records) == (10, 109, [])  # the timeout's reply names the record before 10
    store.ids = {o: 200 + o for o in range(12)}  # a failover's cut rewrote 0..9 while it waited, and wrote on
    assert s.read() is None  # the next read sees offset 9 changed: scans again from the request's offset
    nxt, passed_id, _records = decode_tagged_reply(body_of(s.miss()), True)
    assert (nxt, passed_id) == (12, 211)  # of the log as it is now, never 109 or the old offset alone


def test_a_timeout_after_a_cut_answers_a_404_at_the_requests_offset():
    store = Store({o: 100 + o for o in range(10)})
    s = scan(store, passed=False)
    assert s.read() is None
    assert s.read() is None  # nothing changed: waits on
    assert body_of(s.miss()) == (10).to_bytes(8, "big")
    store.ids[9] = 999  # cut and rewritten, no read since: the timeout's reply
    assert s.miss().startswith(b"result 404 ") and b"position 0" in s.miss()  # the client asks again from 0


def cold_record_head(tmp_path, n=7000):
    """A store of 20,000 records of "test"-0 reopened, record ``n``'s index unit and header paged out (skips where
    pages cannot be evicted); ``(store, n, its msg id, the index MappedFile)``. The caller closes the store."""
    from tests.harness.store import NOW, open_store
    from tests.store.test_time_search import filesystem_of, fill, page_out

    if filesystem_of(tmp_path / "data") == "tmpfs":
        pytest.skip("tmpfs pages are the files themselves: they cannot be evicted")
    s = open_store(tmp_path / "data", flush="async", segment_size=1 << 20, index_file_units=1 << 16)
    fill(s, [NOW + i for i in range(20000)])
    s.close(NOW + 1)
    s = open_store(tmp_path / "data", now=NOW + 2, flush="async", segment_size=1 << 20, index_file_units=1 << 16)
    want = s.msg_id_at("test", 0, n)
    [(segment, _start, _end)] = s.msg_id_at("test", 0, n, ranges=True)
    index = s.tagged_index_ranges("test", 0, n)[0][0]
    if not (page_out(segment) and page_out(index)):
        s.close(NOW + 3)
        pytest.skip("this kernel has no MADV_PAGEOUT")
    return s, n, want, index


def test_a_cold_index_unit_is_brought_in_then_the_header_it_points_to(tmp_path):
    # the record before a get_tags' next offset was passed over: its index unit and log page may both be cold
    from tests.harness.store import NOW

    s, n, want, index = cold_record_head(tmp_path)
    [(first, unit, _end)] = s.msg_id_at("test", 0, n, ranges=True)
    assert first is index and not index.resident(unit)  # the unit alone: the header is not known yet
    assert scan(s, topic="test").bring_in_before(n + 1)  # the record before offset n + 1: cold pages, brought in
    [(header_file, start, end)] = s.msg_id_at("test", 0, n, ranges=True)  # named once the unit is resident
    assert index.resident(unit) and all(header_file.resident(pos) for pos in range(start - start % 4096, end, 4096))
    assert s.msg_id_at("test", 0, n) == want
    s.close(NOW + 3)
