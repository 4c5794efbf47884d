"""server/text/tagscan.py: a get_tags' reads over a store whose log changes between them (no network).

A read that passed over units moves the get's offset; a long poll's later reads, and the reply its timeout sends,
must be about the log that scan read: if a failover's cut rewrote the record before that offset meanwhile, the
get answers 412 rather than send an offset (and, with ``:passed``, an id) of another log."""

from types import SimpleNamespace

import pytest

from metaq import errors
from metaq.protocol import events as ev
from metaq.protocol.tags import decode_tagged_reply, parse_tag_expression
from metaq.server.text.tagscan import TagScan


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


def scan(store, passed=True, expect=None):
    e = ev.GetTags("t", "g", 0, 0, 1 << 20, "a", 5, 1000, parse_tag_expression("a"), expect, passed)
    stats = SimpleNamespace(filter_skipped_units=0, on_get=lambda topic, missed: None)
    return TagScan(SimpleNamespace(store=store, stats=stats), e, 1 << 20)


def body_of(reply):
    return reply.split(b"\r\n", 1)[1]


def test_a_long_polls_reply_names_the_record_its_scan_passed_not_one_written_since():
    store = Store({o: 100 + o for o in range(10)})
    s = scan(store)
    assert s.read() is None  # passed over 0..9, at the end: the poll waits from 10
    nxt, passed_id, records = decode_tagged_reply(body_of(s.miss()), True)
    assert (nxt, passed_id, records) == (10, 109, [])  # the timeout's reply names the record before 10
    store.ids[9] = 999  # a failover's cut rewrote offset 9 while it waited
    with pytest.raises(errors.Diverged, match="offset 9 changed"):
        s.read()  # the next read checks it
    assert s.miss().startswith(b"result 412 ") and b"diverged: t-0 offset 9 changed" in s.miss()  # the timeout too


def test_a_plain_get_tags_is_checked_the_same_and_its_reply_has_no_id():
    store = Store({o: 100 + o for o in range(10)})
    s = scan(store, passed=False)
    assert s.read() is None
    assert s.read() is None  # nothing changed: waits on
    assert body_of(s.miss()) == (10).to_bytes(8, "big")
    store.ids[9] = 999
    with pytest.raises(errors.Diverged):
        s.read()
    assert s.miss().startswith(b"result 412 ")
