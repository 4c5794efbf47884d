"""The key index (keys/index.py, keys/files.py): lookups equal a brute-force scan, rebuilds, retention, limits."""

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq.keys import limits as keys_limits
from metaq.errors import ClientError
from metaq.protocol.message import encode_payload
from metaq.protocol.properties import encode_attribute
from metaq.keys import index as keyindex
from metaq.keys.files import HEADER_SIZE, data_keys
from tests.harness.store import NOW, open_store

BIG = 1 << 62


def keyed(keys=None, uniq=None, tags=None, body=b"body"):
    props = {}
    if keys is not None:
        props["KEYS"] = " ".join(keys)
    if uniq is not None:
        props["UNIQ_KEY"] = uniq
    return encode_payload(body, encode_attribute(tags, props))


def put(s, topic, keys=None, uniq=None, now=NOW, partition=0, body=b"body"):
    flag, data = keyed(keys, uniq, body=body)
    return s.put(topic, partition, flag, data, now)


def flush(s):
    """Flush and index, as the server's flusher does (its indexer steps until the index reaches the flushed end)."""
    s.mark_flushed(s.flush_log())
    while s.follow_log():
        pass


def lookup_all(s, topic, key, since=0, until=BIG, page=keys_limits.MAX_KEY_QUERY_RESULTS):
    """Every page of a lookup: ``(positions newest first, pages)``."""
    out, cursor, pages = [], None, 0
    while True:
        p = keyindex.run(s.key_search(topic, key, since, until, page, cursor))
        pages += 1
        out.extend(r.position for r in p.records)
        if p.cursor is None:
            return out, pages
        assert pages < 10_000
        cursor = p.cursor


def brute(puts, topic, key, since=0, until=BIG):
    return [pos for pos, t, keys, ts in reversed(puts) if t == topic and key in keys and since <= ts <= until]


def test_keys_and_uniq_key_found_newest_first(data_dir):
    s = open_store(data_dir)
    a = put(s, "test", ["k1", "k2"], uniq="U1")
    b = put(s, "test", ["k1"])
    put(s, "other", ["k1"])
    flush(s)
    page = keyindex.run(s.key_search("test", "k1", 0, BIG, 10))
    assert [r.queue_offset for r in page.records] == [b.offset, a.offset]
    assert [r.queue_offset for r in keyindex.run(s.key_search("test", "U1", 0, BIG, 10)).records] == [a.offset]
    assert keyindex.run(s.key_search("test", "nope", 0, BIG, 10)).records == []
    assert page.cursor is None and page.indexed_to == s.flushed_position
    s.close(NOW)


def test_unflushed_records_are_indexed_after_their_flush(data_dir):
    s = open_store(data_dir)
    put(s, "test", ["k"])
    assert keyindex.run(s.key_search("test", "k", 0, BIG, 10)).records == []
    flush(s)
    assert len(keyindex.run(s.key_search("test", "k", 0, BIG, 10)).records) == 1
    s.close(NOW)


def test_plain_attributes_and_no_attribute_are_not_indexed(data_dir):
    s = open_store(data_dir)
    s.put("test", 0, *encode_payload(b"x", "KEYS\x01k"), NOW)  # no \x02: a plain MetaQ attribute
    s.put("test", 0, 0, b"KEYS\x01k", NOW)
    flush(s)
    assert s.keys.files == []
    s.close(NOW)


def test_keys_per_message_at_the_limit_and_one_past(data_dir):
    s = open_store(data_dir)
    keys = ["k%d" % i for i in range(keys_limits.MAX_KEYS_PER_MESSAGE + 1)]
    put(s, "test", keys)
    flush(s)
    found = [k for k in keys if keyindex.run(s.key_search("test", k, 0, BIG, 1)).records]
    assert found == keys[:keys_limits.MAX_KEYS_PER_MESSAGE]
    s.close(NOW)


def test_key_length_at_the_limit_and_one_past(data_dir):
    s = open_store(data_dir)
    at, past = "a" * keys_limits.MAX_KEY_BYTES, "b" * (keys_limits.MAX_KEY_BYTES + 1)
    put(s, "test", [at, past])
    flush(s)
    assert len(keyindex.run(s.key_search("test", at, 0, BIG, 1)).records) == 1
    with pytest.raises(ClientError):
        s.key_search("test", past, 0, BIG, 1)
    assert data_keys(*keyed([at, past])) == [at.encode()]
    s.close(NOW)


def test_ten_thousand_keys_in_one_message_cost_the_limit(data_dir):
    s = open_store(data_dir, segment_size=1 << 20)
    put(s, "test", ["k%d" % i for i in range(10_000)])
    flush(s)
    assert sum(f.count for f in s.keys.files) == keys_limits.MAX_KEYS_PER_MESSAGE
    s.close(NOW)


def test_a_page_is_bounded_and_the_cursor_returns_the_rest(data_dir):
    s = open_store(data_dir, segment_size=1 << 20, key_index_entries=64)
    puts = [put(s, "test", ["hot"]) for _ in range(300)]
    flush(s)
    first = keyindex.run(s.key_search("test", "hot", 0, BIG, 10 ** 9))
    assert len(first.records) == keys_limits.MAX_KEY_QUERY_RESULTS and first.cursor
    got, pages = lookup_all(s, "test", "hot", page=7)
    assert len(got) == 300 and len(set(got)) == 300 and pages >= 300 // 7
    assert [r.offset for r in puts] == sorted(r.offset for r in puts)
    s.close(NOW)


def test_the_scan_limit_ends_a_page_with_a_cursor(data_dir, monkeypatch):
    monkeypatch.setattr(keys_limits, "MAX_KEY_SCAN_ENTRIES", 5)
    s = open_store(data_dir, segment_size=1 << 20)
    for i in range(20):
        put(s, "test", ["hot"], now=NOW + i)
    flush(s)
    p = keyindex.run(s.key_search("test", "hot", 0, NOW + 2, 10))  # the 17 newest: walked, not taken
    assert p.records == [] and p.cursor is not None
    got, pages = lookup_all(s, "test", "hot", until=NOW + 9)
    assert len(got) == 10 and pages == 4
    s.close(NOW)


def test_bad_cursors_are_refused():
    for bad in ("x", "1:", ":1", "1:2:3", "9" * (keys_limits.MAX_KEY_CURSOR_BYTES + 1)):
        with pytest.raises(ClientError):
            keyindex.parse_cursor(bad)
    assert keyindex.parse_cursor("12:3") == (12, 3)
    assert keyindex.parse_cursor("1:" + "0" * (keys_limits.MAX_KEY_CURSOR_BYTES - 2)) == (1, 0)


def test_time_bounds(data_dir):
    s = open_store(data_dir)
    for i in range(10):
        put(s, "test", ["k"], now=NOW + 1000 * i)
    flush(s)
    got, _ = lookup_all(s, "test", "k", since=NOW + 3000, until=NOW + 5000)
    assert len(got) == 3
    s.close(NOW)


def test_kill_between_the_log_and_the_index_rebuilds_the_tail(data_dir):
    s = open_store(data_dir)
    put(s, "test", ["a"])
    flush(s)
    s.checkpoint(NOW)
    put(s, "test", ["a"])
    s.flush_log()  # durable in the log, never indexed: as a kill -9 before the index caught up
    s.abandon()
    s = open_store(data_dir)
    assert len(lookup_all(s, "test", "a")[0]) == 2
    s.close(NOW)


def test_entries_past_the_checkpoint_are_taken_out_and_rebuilt(data_dir):
    s = open_store(data_dir)
    put(s, "test", ["a"])
    flush(s)
    s.checkpoint(NOW)
    put(s, "test", ["b"])
    flush(s)  # indexed, not checkpointed
    s.abandon()
    s = open_store(data_dir)
    assert len(lookup_all(s, "test", "a")[0]) == 1
    assert len(lookup_all(s, "test", "b")[0]) == 1
    assert sum(f.count for f in s.keys.files) == 2
    s.close(NOW)


def test_a_torn_key_file_is_rebuilt_from_the_log(data_dir):
    s = open_store(data_dir)
    for i in range(5):
        put(s, "test", ["k%d" % i])
    flush(s)
    s.close(NOW)
    (path,) = [os.path.join(data_dir, "keyindex", n) for n in os.listdir(os.path.join(data_dir, "keyindex"))]
    with open(path, "r+b") as f:  # every slot points far past the entries
        f.seek(HEADER_SIZE)
        f.write(b"\xff" * 64 * 4)
    s = open_store(data_dir)
    assert s.keys.rebuilt_from is not None
    assert all(len(lookup_all(s, "test", "k%d" % i)[0]) == 1 for i in range(5))
    s.close(NOW)


def test_a_missing_checkpoint_rebuilds_everything(data_dir):
    s = open_store(data_dir)
    put(s, "test", ["k"])
    flush(s)
    s.close(NOW)
    os.unlink(os.path.join(data_dir, "key_checkpoint"))
    s = open_store(data_dir)
    assert len(lookup_all(s, "test", "k")[0]) == 1
    s.close(NOW)


def test_a_cut_log_takes_its_entries_out(data_dir):
    s = open_store(data_dir)
    put(s, "test", ["k"])
    flush(s)
    end = s.written_position
    put(s, "test", ["k"])
    flush(s)
    s.truncate_log(end, NOW)
    assert len(lookup_all(s, "test", "k")[0]) == 1
    put(s, "test", ["j"])
    flush(s)
    assert len(lookup_all(s, "test", "j")[0]) == 1 and len(lookup_all(s, "test", "k")[0]) == 1
    s.close(NOW)


def test_retention_drops_whole_files_and_skips_gone_records(data_dir):
    s = open_store(data_dir, key_index_entries=keys_limits.MAX_KEYS_PER_MESSAGE)
    for _ in range(200):
        put(s, "test", ["k"], body=b"x" * 200)
    flush(s)
    s.checkpoint(NOW)
    files_before = len(s.keys.files)
    r = s.retention(NOW + 1000 * 3600_000 * 1000)
    assert r.deleted_segments
    assert len(s.keys.files) < files_before
    assert s.keys.files[0].first <= s._log.start
    got, _ = lookup_all(s, "test", "k")
    assert got and all(p >= s._log.start for p in got)
    assert len(got) == sum(1 for _ in range(s.min_offset("test", 0), s.max_offset("test", 0)))
    s.close(NOW)


def test_a_search_survives_retention_during_its_walk(data_dir):
    s = open_store(data_dir, key_index_entries=keys_limits.MAX_KEYS_PER_MESSAGE)
    for _ in range(200):
        put(s, "test", ["k"], body=b"x" * 200)
    flush(s)
    s.checkpoint(NOW)
    search = s.key_search("test", "k", 0, BIG, 64)
    for _ in range(3):
        search.step()
    s.retention(NOW + 1000 * 3600_000 * 1000)
    page = keyindex.run(search)
    assert all(r.position >= s._log.start for r in page.records)
    s.close(NOW)


_ops = st.lists(st.tuples(st.sampled_from(["test", "tx"]), st.lists(st.sampled_from("abcdef"), max_size=4),
                          st.integers(0, 5), st.integers(0, 300)), min_size=1, max_size=60)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_ops, cut=st.sampled_from(["none", "checkpoint", "nocheckpoint", "torn"]))
def test_lookups_equal_a_brute_force_scan_and_survive_a_rebuild(fast_dir, ops, cut):
    d = os.path.join(fast_dir, "d%d" % abs(hash((tuple(map(str, ops)), cut))))
    sizes = dict(key_index_entries=keys_limits.MAX_KEYS_PER_MESSAGE, key_index_slots=3)
    s = open_store(d, **sizes)
    puts = []
    for i, (topic, keys, dt, size) in enumerate(ops):
        ts = NOW + dt * 1000
        r = put(s, topic, keys or None, now=ts, body=b"y" * size)
        puts.append((None, topic, set(keys), ts, r))
        if i % 7 == 3:
            flush(s)
        if i % 11 == 5:
            s.checkpoint(NOW)
    flush(s)
    recs = {(t, r.queue_offset): r.position for t in ("test", "tx") if s.max_offset(t, 0)
            for r in s.read_records(t, 0, 0, 10 ** 6, 1 << 30)[0]}
    puts = [(recs[(t, r.offset)], t, keys, ts) for _p, t, keys, ts, r in puts]

    def check():
        for topic in ("test", "tx"):
            for key in "abcdef":
                assert lookup_all(s, topic, key, page=3)[0] == brute(puts, topic, key)
                assert lookup_all(s, topic, key, since=NOW + 2000, until=NOW + 4000)[0] == \
                    brute(puts, topic, key, NOW + 2000, NOW + 4000)

    check()
    if cut == "checkpoint":
        s.close(NOW)
    else:
        s.abandon()
        if cut == "nocheckpoint":
            os.unlink(os.path.join(d, "key_checkpoint"))
        elif cut == "torn":
            for n in os.listdir(os.path.join(d, "keyindex")):
                with open(os.path.join(d, "keyindex", n), "r+b") as f:
                    f.seek(HEADER_SIZE + 4)
                    f.write(b"\xff\xff\xff\x7f")
    s = open_store(d, **sizes)
    check()
    s.close(NOW)


def test_indexing_goes_in_bounded_steps_and_a_record_larger_than_a_step_is_not_stuck(data_dir):
    """The flusher's indexer calls ``follow_log`` until it says it is done: each step walks the records that start
    within ``max_bytes`` (one at least), so a record larger than a step is indexed, never stuck behind."""
    s = open_store(data_dir, segment_size=1 << 20)
    step = 4096
    for i in range(40):
        body = b"x" * (10_000 if i % 10 == 3 else 100)  # every tenth a record larger than a step
        put(s, "tStep", [f"k{i}"], uniq=f"U{i}", body=body)
    s.mark_flushed(s.flush_log())
    steps = 0
    while s.follow_log(step):
        steps += 1
        assert steps < 1000
    assert s.keys.indexed_to == s.flushed_position and steps >= 4  # each large record a step of its own
    for i in range(40):
        assert len(keyindex.run(s.key_search("tStep", f"k{i}", 0, BIG, 10)).records) == 1, i
    s.close(NOW)


try:
    from metaq.native._bytes import keyed_records as keyed_records_c
except ImportError:
    keyed_records_c = None


@st.composite
def walked_logs(draw):
    """A run of records (with and without attributes, a topic of any length), then maybe damage: a blank
    marker, a size running past the end, a record too short to hold its flag, garbage, or nothing."""
    import struct

    from metaq.store.record import BLANK_MAGIC, MESSAGE_MAGIC, encode_record

    out = []
    for i in range(draw(st.integers(0, 8))):
        flag = draw(st.sampled_from([0, 1, 2, 3, -(1 << 31) + 1]))  # the last: the sign bit and the attribute bit
        topic = draw(st.sampled_from(["t", "topic-b", "\u00e9t\u00e9" * 9]))
        out.append(encode_record(topic, 0, i, NOW, NOW, i, flag, draw(st.binary(max_size=30))))
    buf = bytearray(b"".join(out))
    tail = draw(st.sampled_from(["none", "blank", "past end", "short", "negative topic", "garbage", "zero size"]))
    if tail == "blank":
        buf += struct.pack(">iI", 64, BLANK_MAGIC) + bytes(56)
    elif tail == "past end":
        buf += struct.pack(">iI", 10_000, MESSAGE_MAGIC) + bytes(50)
    elif tail == "short":  # a message marker whose size leaves no room for the header, then a record
        buf += struct.pack(">iI", 12, MESSAGE_MAGIC) + b"\xff" * 4 + encode_record("t", 0, 9, NOW, NOW, 9, 1, b"x")
    elif tail == "negative topic":
        rec = bytearray(encode_record("t", 0, 9, NOW, NOW, 9, 1, b"xyz"))
        rec[40:42] = struct.pack(">h", -3)
        buf += rec
    elif tail == "garbage":
        buf += draw(st.binary(min_size=1, max_size=40))
    elif tail == "zero size":
        buf += struct.pack(">iI", 0, MESSAGE_MAGIC) + bytes(8)
    return bytes(buf)


@pytest.mark.skipif(keyed_records_c is None, reason="metaq.native._bytes was not built")
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(walked_logs(), st.integers(-2, 50), st.integers(-5, 2000), st.integers(-5, 2000))
def test_c_keyed_records_equals_the_twin(buf, rel, stop, end):
    """The key index's walk in C returns what its pure-Python twin returns (or refuses what it refuses), and
    the twin picks exactly the records whose flag has the attribute bit (what ``_index_record`` looks at)."""
    from metaq.keys.index import keyed_records_py
    from metaq.store.record import MARKER

    end = min(end, len(buf)) if end >= 0 else end
    try:
        want = keyed_records_py(buf, rel, stop, end)
    except ValueError:
        with pytest.raises(ValueError):
            keyed_records_c(buf, rel, stop, end)
        return
    assert keyed_records_c(buf, rel, stop, end) == want
    walked_to, keyed_at = want
    if rel == 0 and stop >= len(buf) and end == len(buf):  # the whole log: brute force over its records
        brute, at = [], 0
        while at < walked_to:
            total = MARKER.unpack_from(buf, at)[0]
            tlen = int.from_bytes(buf[at + 40:at + 42], "big", signed=True) if total >= 42 else -1
            if tlen >= 0 and 42 + tlen + 20 <= total and int.from_bytes(buf[at + 58 + tlen:at + 62 + tlen], "big") & 1:
                brute.append(at)
            at += total
        assert keyed_at == brute


def test_records_without_attributes_cost_no_python_call_each(data_dir, monkeypatch):
    """The catch-up looks at the records with attributes only (``_index_record`` once each): 1,000 plain puts and
    3 keyed ones cost 3 calls, and the keys are all found."""
    s = open_store(data_dir)
    try:
        calls = []
        real = keyindex.KeyIndex._index_record
        monkeypatch.setattr(keyindex.KeyIndex, "_index_record",
                            lambda self, *a: calls.append(a[2]) or real(self, *a))  # (map, rel, position, size)
        offsets = {}
        for i in range(1000):
            s.put("test", 1, 0, b"plain-%d" % i, NOW)
            if i % 400 == 7:
                offsets["k%d" % i] = put(s, "test", keys=["k%d" % i]).offset
        flush(s)
        assert len(calls) == 3
        found = []
        for key, offset in offsets.items():
            page = keyindex.run(s.key_search("test", key, 0, BIG, 10))
            assert [r.queue_offset for r in page.records] == [offset]
            found.extend(r.position for r in page.records)
        assert sorted(found) == sorted(calls)  # the records looked at are the keyed ones
    finally:
        s.close(NOW)


@pytest.mark.parametrize("walk", [1, 200, 4096, None])
def test_the_c_walk_goes_in_bounded_pieces_and_finds_every_key(data_dir, monkeypatch, walk):
    """``catch_up`` asks the C walk for ``KEY_INDEX_WALK_BYTES`` of log at most per call (its list of keyed
    records stays bounded however long the range: the whole tail at open), and finds the same keys whether a
    piece ends inside a record (1, 200 bytes), past a few records, or the default."""
    spans = []
    real = keyindex.keyed_records
    limit = keys_limits.KEY_INDEX_WALK_BYTES if walk is None else walk
    if walk is not None:
        monkeypatch.setattr(keys_limits, "KEY_INDEX_WALK_BYTES", walk)

    def watched(buf, rel, stop, end):
        spans.append(stop - rel)
        return real(buf, rel, stop, end)

    monkeypatch.setattr(keyindex, "keyed_records", watched)
    s = open_store(data_dir)
    try:
        offsets = {}
        for i in range(60):
            s.put("test", i % 4, 0, b"p" * (i * 7), NOW)
            if i % 3 == 0:
                offsets["k%d" % i] = put(s, "test", keys=["k%d" % i], body=b"b" * i).offset
        s.mark_flushed(s.flush_log())
        s.follow_log(None)  # one step over the whole range, as the open's catch-up
        assert spans and max(spans) <= limit
        if walk == 1:
            assert len(spans) >= 80  # one record per piece
        for key, offset in offsets.items():
            page = keyindex.run(s.key_search("test", key, 0, BIG, 10))
            assert [r.queue_offset for r in page.records] == [offset]
    finally:
        s.close(NOW)


def test_records_with_properties_but_no_key_are_not_read_for_keys(data_dir, monkeypatch):
    """Records whose properties hold no key (an MQTT PUBLISH's) are passed over without a look at each
    (``with_key_marks``); a key among them is found, and a body that carries the text of a key property is read
    and found to hold no key."""
    s = open_store(data_dir)
    try:
        calls = []
        real = keyindex.KeyIndex._index_record
        monkeypatch.setattr(keyindex.KeyIndex, "_index_record",
                            lambda self, *a: calls.append(a[2]) or real(self, *a))
        offsets = {}
        for i in range(500):
            s.put("test", i % 2, *encode_payload(b"m%d" % i, encode_attribute(None, {"MQTT_NAME": "a/b"})), NOW)
            if i % 100 == 50:
                offsets["k%d" % i] = put(s, "test", keys=["k%d" % i], partition=i % 2).offset
            if i == 123:
                offsets["U%d" % i] = put(s, "test", uniq="U%d" % i).offset
        fake = put(s, "test", body=b"\x02KEYS\x01fake\x02UNIQ_KEY\x01fake2\x02")  # a mark in the body only
        flush(s)
        assert len(calls) == len(offsets) + 1
        for key, offset in offsets.items():
            page = keyindex.run(s.key_search("test", key, 0, BIG, 10))
            assert [r.queue_offset for r in page.records] == [offset]
        for key in ("fake", "fake2"):
            assert keyindex.run(s.key_search("test", key, 0, BIG, 10)).records == []
        assert fake.offset >= 0
    finally:
        s.close(NOW)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([None, "KEYS", "UNIQ_KEY", "OTHER"]),
                          st.sampled_from([b"", b"\x02KEYS\x01", b"\x02UNIQ_KEY\x01", b"xKEYS", b"\x02KEYS"])),
                min_size=1, max_size=12))
def test_with_key_marks_keeps_every_record_that_holds_a_key(recs):
    """``with_key_marks`` keeps every record whose properties hold a key, and besides them only records whose body
    carries a mark."""
    from metaq.keys.files import keys_of_properties
    buf, keyed, holding, marked = bytearray(), [], [], []
    for prop, body in recs:
        at = len(buf)
        keyed.append(at)
        attr = encode_attribute("t", {prop: "k1 k2"} if prop else {}).encode()
        buf += b"%4d" % len(attr) + attr + body
        i = attr.find(b"\x02")
        if keys_of_properties(attr[i + 1:]):
            holding.append(at)
        if body.endswith(b"\x01"):
            marked.append(at)
    got = keyindex.with_key_marks(bytes(buf), keyed, len(buf))
    assert set(holding) <= set(got) <= set(holding) | set(marked) and got == sorted(got)
