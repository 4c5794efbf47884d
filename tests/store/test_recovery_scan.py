"""Recovery's batch scan (store/recovery_scan.py): the C helper and its pure-Python twin agree record for record
on torn and corrupted logs, both agree with the record-by-record reading of the log, and a whole recovery ends
the same (report, index files, what is served) with either."""

import os
import random
import shutil
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq.store import limits as store_limits
from metaq.store import recovery, recovery_scan
from metaq.store.index import UNIT
from metaq.store.record import BLANK_MAGIC, MARKER, check_record, decode_record, encode_record
from metaq.store.recovery_scan import scan_log_py, write_units_py
from tests.harness.native import both
from tests.harness.store import NOW, open_store, payload_of, read_all

try:
    from metaq.native._bytes import scan_log as scan_log_c, write_units as write_units_c
except ImportError:
    scan_log_c = write_units_c = None

needs_c = pytest.mark.skipif(scan_log_c is None, reason="metaq.native._bytes was not built")

TOPICS = ["a", "topic-b", "\u00e9t\u00e9"]
#: The test store's topics and their partitions (tests/harness/store.py).
STORE_TOPICS = {"test": 4, "topic-b": 2, "a": 1}
PARTITIONS = [(t, p) for t, n in STORE_TOPICS.items() for p in range(n)]


def attribute_data(tags, payload):
    """A record's data with an attribute block (flag 1): length, attribute, payload."""
    return struct.pack(">i", len(tags)) + tags + payload


@st.composite
def records(draw):
    """Encoded records of a few partitions: offsets mostly consecutive per partition, some jumps and repeats,
    some with attributes (tags, tags + properties, malformed blocks)."""
    out, next_offset = [], {}
    for _ in range(draw(st.integers(0, 14))):
        key = (draw(st.sampled_from(TOPICS)), draw(st.integers(0, 2)))
        off = next_offset.get(key, draw(st.integers(0, 5)))
        jump = draw(st.sampled_from([0, 0, 0, 0, 1, 7, -1]))
        off = max(0, off + jump)
        next_offset[key] = off + 1
        kind = draw(st.sampled_from(["plain", "tags", "props", "bad", "short"]))
        payload = draw(st.binary(max_size=40))
        if kind == "plain":
            flag, data = 0, payload
        elif kind == "tags":
            flag, data = 1, attribute_data(draw(st.binary(max_size=8)), payload)
        elif kind == "props":
            flag, data = 3, attribute_data(b"TagA\x02KEYS\x01k1", payload)
        elif kind == "bad":
            flag, data = 1, struct.pack(">i", draw(st.sampled_from([-1, 1000]))) + payload
        else:
            flag, data = 1, payload[:3]
        out.append(encode_record(key[0], key[1], off, NOW, NOW, draw(st.integers(-5, 10**12)), flag, data))
    return out


def damage(draw, buf):
    """Tear or corrupt the log as a crash or a bad disk would."""
    how = draw(st.sampled_from(["none", "truncate", "flip", "zero tail", "blank", "garbage", "flip crc"]))
    if not buf and how != "blank":
        return buf
    at = draw(st.integers(0, max(0, len(buf) - 1)))
    if how == "truncate":
        return buf[:at]
    if how == "flip":
        buf[at] ^= 1 << draw(st.integers(0, 7))
    elif how == "flip crc":
        starts = [0]
        while check_record(buf, starts[-1], len(buf)):
            starts.append(starts[-1] + check_record(buf, starts[-1], len(buf)))
        buf[draw(st.sampled_from(starts[:-1] or [0])) + 8 + draw(st.integers(0, 3))] ^= 0x10
    elif how == "zero tail":
        buf[at:] = bytes(len(buf) - at)
    elif how == "blank":
        tail = draw(st.integers(0, 40))
        buf += MARKER.pack(tail, BLANK_MAGIC)[:tail] + bytes(max(0, tail - 8))
    elif how == "garbage":
        buf[at:] = draw(st.binary(min_size=len(buf) - at, max_size=len(buf) - at))
    return buf


def reference(buf, rel, size, base):
    """The records recovery's old loop visited one by one: (topic bytes, partition, offset, unit), and its stop."""
    out = []
    while size - rel >= 63:
        total = check_record(buf, rel, size)
        if not total:
            break
        r = decode_record(buf, rel, base + rel)
        out.append((r.topic.encode("utf-8"), r.partition, r.queue_offset, r.msg_id,
                    UNIT.pack(r.position, r.total_size, r.tag_hash)))
        rel += total
    return out, rel


def flatten(result):
    """Per topic-partition, the (offset, unit) of each record in log order, from a batch's runs."""
    _stop, _count, _max_id, units, runs = result
    per = {}
    for topic, part, first, at, n in runs:
        for k in range(n):
            per.setdefault((topic, part), []).append((first + k, bytes(units[(at + k) * 16:(at + k + 1) * 16])))
    return per


@pytest.mark.parametrize("scan", both(scan_log_py, "scan_log"))
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_each_finds_what_the_record_by_record_reading_finds(scan, data):
    buf = damage(data.draw, bytearray(b"".join(data.draw(records()))))
    base = data.draw(st.sampled_from([0, 4096, 1 << 40]))
    got = scan(bytes(buf), 0, len(buf), base, 1 << 20)
    want, stop = reference(bytes(buf), 0, len(buf), base)
    assert (got[0], got[1]) == (stop, len(want))
    assert got[2] == (max(w[3] for w in want) if want else None)
    per = {}
    for topic, part, off, _id, unit in want:
        per.setdefault((topic, part), []).append((off, unit))
    assert flatten(got) == per
    for topic, part, first, at, n in got[4]:  # each run: one partition's consecutive offsets
        assert [o for o, _u in flatten((0, 0, 0, got[3], [(topic, part, first, at, n)]))[(topic, part)]] == \
            list(range(first, first + n))


@needs_c
@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_c_scan_equals_the_twin_on_torn_and_corrupted_logs(data):
    buf = damage(data.draw, bytearray(b"".join(data.draw(records()))))
    rel = data.draw(st.integers(0, len(buf)))
    if data.draw(st.booleans()):  # mostly from a record boundary, as recovery does
        rel = 0
    size = data.draw(st.integers(rel, len(buf)))
    base = data.draw(st.sampled_from([0, 123, 1 << 33]))
    max_records = data.draw(st.integers(1, 20))
    got = scan_log_c(bytes(buf), rel, size, base, max_records)
    assert got == scan_log_py(bytes(buf), rel, size, base, max_records)
    assert got[1] == max_records or recovery.stop_reason(bytes(buf), memoryview(bytes(buf)), got[0], size)


@needs_c
@pytest.mark.parametrize("args", [(-1, 10, 5), (5, 4, 5), (0, 11, 5), (0, 10, 0)])
def test_both_refuse_bad_arguments_alike(args):
    rel, size, max_records = args
    for fn in (scan_log_c, scan_log_py):
        with pytest.raises(ValueError):
            fn(bytes(10), rel, size, 0, max_records)


@needs_c
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 6), st.binary(min_size=0, max_size=96), st.binary(min_size=0, max_size=96),
       st.integers(0, 3), st.integers(0, 3), st.integers(-1, 7))
def test_c_write_units_equals_the_twin(n_same, dst, src, at, src_at, n):
    dst = bytearray(dst + bytes(n_same * 16))
    src = bytes(src) + bytes(n_same * 16)
    at, src_at = at * 16, src_at * 16
    a, b = bytearray(dst), bytearray(dst)
    try:
        want = write_units_py(a, at, src, src_at, n)
    except ValueError:
        with pytest.raises(ValueError):
            write_units_c(b, at, src, src_at, n)
        return
    assert write_units_c(b, at, src, src_at, n) == want
    assert a == b


def many_records(n):
    return b"".join(encode_record("t", 0, i, NOW, NOW, i, 0, b"") for i in range(n))


@pytest.mark.parametrize("scan", [pytest.param(scan_log_c, marks=needs_c, id="built"),
                                  pytest.param(scan_log_py, id="python")])
def test_a_call_checks_at_most_recovery_scan_records(scan):
    n = store_limits.RECOVERY_SCAN_RECORDS
    one = len(encode_record("t", 0, 0, NOW, NOW, 0, 0, b""))
    buf = many_records(n + 1)
    stop, count, max_id, units, runs = scan(buf, 0, n * one, 0, n)  # at the limit: the whole segment
    assert (stop, count, max_id, len(units), runs) == (n * one, n, n - 1, 16 * n, [(b"t", 0, 0, 0, n)])
    stop, count, max_id, units, runs = scan(buf, 0, len(buf), 0, n)  # one past: the last record left for later
    assert (stop, count, runs) == (n * one, n, [(b"t", 0, 0, 0, n)])
    assert scan(buf, stop, len(buf), 0, n)[:3] == (len(buf), 1, n)


@pytest.fixture(params=["built", "python"])
def twin(request, monkeypatch):
    if request.param == "python":
        monkeypatch.setattr(recovery_scan, "scan_log", scan_log_py)
        monkeypatch.setattr(recovery_scan, "write_units", write_units_py)
    return request.param


def test_batches_of_a_store_give_the_same_recovery_as_one_batch(fast_dir, monkeypatch, twin):
    base = os.path.join(fast_dir, "base")
    s = open_store(base, segment_size=1 << 16)
    for i in range(1000):  # ~140 a partition: runs across index files of 64 units, and across two segments
        s.put(*PARTITIONS[i * 3 % len(PARTITIONS)], 0, b"m%d" % i, NOW + i)
    s.abandon()
    seen = []
    for batch in (store_limits.RECOVERY_SCAN_RECORDS, 7, 1):
        work = os.path.join(fast_dir, "work")
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(base, work)
        os.unlink(os.path.join(work, "checkpoint"))
        shutil.rmtree(os.path.join(work, "index"), ignore_errors=True)
        monkeypatch.setattr(store_limits, "RECOVERY_SCAN_RECORDS", batch)
        s = open_store(work, segment_size=1 << 16)
        r = s.recovery
        assert (r.records_scanned, r.index_units_rebuilt, r.stop_reason) == (1000, 1000, "zero header")
        seen.append([read_all(s, t, p) for t, p in PARTITIONS])
        s.abandon()
    written = [[b"m%d" % i for i in range(1000) if PARTITIONS[i * 3 % len(PARTITIONS)] == key] for key in PARTITIONS]
    assert [[payload_of(m) for m in msgs] for msgs in seen[0]] == written
    assert seen[0] == seen[1] == seen[2]


def store_state(data_dir):
    """Every file of a data directory (checkpoints, which hold times, aside) as bytes."""
    out = {}
    for d, _dirs, files in os.walk(data_dir):
        for f in files:
            if "checkpoint" not in f and "epoch" not in f:
                with open(os.path.join(d, f), "rb") as fh:
                    out[os.path.relpath(os.path.join(d, f), data_dir)] = fh.read()
    return out


def recover_with(src, work, use_twin, monkeypatch, force):
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(src, work)
    with monkeypatch.context() as m:
        if use_twin:
            m.setattr(recovery_scan, "scan_log", scan_log_py)
            m.setattr(recovery_scan, "write_units", write_units_py)
        try:
            s = open_store(work, force_recovery=force)
        except Exception as exc:  # CorruptLog: both must refuse alike
            return ("refused", type(exc).__name__, str(exc).replace(work, "DIR")), None
        r = s.recovery
        served = [read_all(s, t, p) for t, p in PARTITIONS]
        s.abandon()
    report = (r.records_scanned, r.scanned_bytes, r.truncated_bytes, r.truncated_records, r.index_units_rebuilt,
              r.index_units_dropped, r.stop_reason, r.full_scan, r.log_end)
    return report, (served, store_state(work))


@needs_c
@pytest.mark.parametrize("seed", range(16))
def test_c_and_twin_recover_a_damaged_store_alike(fast_dir, monkeypatch, seed):
    rnd = random.Random(seed)
    base = os.path.join(fast_dir, "base")
    s = open_store(base)  # 4 KiB segments: the damage lands in various segments
    for i in range(rnd.randint(20, 120)):
        tags = rnd.choice([b"", b"T1", b"T2\x02p"])
        data = attribute_data(tags, b"x" * rnd.randint(0, 300)) if tags else b"y" * rnd.randint(0, 300)
        s.put(*rnd.choice(PARTITIONS), 1 if tags else 0, data, NOW + i)
    end = s.written_position
    s.abandon()
    if seed % 3 == 0:
        os.unlink(os.path.join(base, "checkpoint"))
    if seed % 3 == 1:  # every unit rebuilt from the log
        shutil.rmtree(os.path.join(base, "index"))
    for _ in range(1 + seed % 2):
        start = rnd.randrange(max(0, end - 3000), end)  # the last one or two segments
        path = os.path.join(base, "commitlog", "%020d" % (start // 4096 * 4096))
        at = start % 4096
        with open(path, "r+b") as f:
            f.seek(at)
            kind = rnd.choice(["flip", "zero", "garbage"])
            if kind == "flip":
                b = f.read(1)
                f.seek(at)
                f.write(bytes([b[0] ^ (1 << rnd.randrange(8))]))
            elif kind == "zero":
                f.write(bytes(os.path.getsize(path) - at))
            else:
                f.write(rnd.randbytes(rnd.randint(1, min(200, 4096 - at))))
    force = seed % 4 == 1  # else damage with valid records after it is refused (CorruptLog), alike
    built = recover_with(base, os.path.join(fast_dir, "c"), False, monkeypatch, force)
    python = recover_with(base, os.path.join(fast_dir, "py"), True, monkeypatch, force)
    assert built == python


@needs_c
@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 3000), st.lists(st.tuples(st.integers(0, 2999), st.integers(1, 255)), max_size=3),
       st.integers(-2, 3002), st.integers(-2, 3002))
def test_c_nonzero_end_equals_the_twin(n, marks, start, end):
    """What recovery's examine measures after its stop point: long zero runs with a few non-zero bytes."""
    from metaq.native._bytes import nonzero_end as nonzero_end_c
    from metaq.store.mapped import nonzero_end_py

    buf = bytearray(n)
    for at, value in marks:
        if at < n:
            buf[at] = value
    buf = bytes(buf)
    try:
        want = nonzero_end_py(buf, start, end)
    except ValueError:
        with pytest.raises(ValueError):
            nonzero_end_c(buf, start, end)
        return
    assert nonzero_end_c(buf, start, end) == want
    assert want == (start if end <= start or not buf[start:end].strip(b"\0") else
                    max(start, end - (len(buf[start:end]) - len(buf[start:end].rstrip(b"\0")))))


@pytest.mark.parametrize("marks", [[], [0], [5000], [5000, 3 << 20], [(4 << 20) - 1], [4096, 8191, 1 << 20]])
@pytest.mark.parametrize("prealloc", [False, True])
def test_nonzero_end_of_a_file_with_holes_reads_only_its_data(tmp_path, marks, prealloc):
    """Holes (a sparse file; or preallocated, never written: a segment's tail) count as zeros, and a non-zero
    byte after a hole is still found, from any start."""
    from metaq.store.mapped import MappedFile

    path = str(tmp_path / "seg")
    with open(path, "wb") as f:
        f.truncate(4 << 20)
    if prealloc:
        fd = os.open(path, os.O_RDWR)
        os.posix_fallocate(fd, 0, 4 << 20)
        os.close(fd)
    f = MappedFile.open(path)
    for at in marks:
        f.mm[at] = 7
    data = bytes(f.mm)
    for start in (0, 1, 4095, 4096, 5001, 1 << 20, (4 << 20) - 1, 4 << 20):
        for end in (None, 6000, 3 << 20):
            e = f.size if end is None else end
            want = start + len(data[start:e].rstrip(b"\0")) if e > start else start
            assert f.nonzero_end(start, end) == want, (start, end)
    f.close()
