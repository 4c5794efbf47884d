"""Every writer of an index unit writes the same tag hash: the tags' (the attribute before ``\\x02``) alone.

The put path, the burst writer (C and Python), the put_idem paths (general, burst scanner in C and Python),
recovery's rebuild and a slave's apply all agree, and each unit's hash is ``tag_code`` of the tags as the
protocol defines them; a data dir written the old way (whole-attribute hashes, no ``tag_format``) is rebuilt
on open before anything reads it.
"""

import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq.filters.wire import parse_tag_expression
from metaq.protocol import burst, events as ev
from metaq.idempotence.wire import IdempotentPut
from metaq.idempotence import burst as idemburst
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.message import encode_payload
from metaq.protocol.tags import tag_code
from metaq.protocol.text import serialize
from metaq.store import batch, recovery_scan
from metaq.store.files import CHECKPOINT_MAGIC
from metaq.store.index import TAG_FORMAT, UNIT, UNIT_SIZE
from tests.harness.store import NOW, open_store

SEG = 4096

#: Attributes as the three front-ends store them: plain MetaQ ones, RocketMQ ones (tags, \x02, properties).
tag_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x01\x02"), max_size=12)
attributes = st.one_of(
    st.none(),
    tag_text,
    st.builds(lambda t, k, v: "%s\x02KEYS\x01%s\x02U\x01%s" % (t, k, v), tag_text, tag_text, tag_text),
    st.builds(lambda t: t + "\x02", tag_text),
)


def expected_tags(attribute):
    return b"" if attribute is None else attribute.split("\x02")[0].encode("utf-8")


def units_of(store, topic, partition):
    p = store._parts[(topic, partition)]
    return [(n, phys, size, tag) for n, phys, size, tag in p.units(p.min, p.max)]


def put_frames(messages):
    buf = b"".join(serialize(ev.Put("test", 0, flag, data, i, metaq_checksum(data)))
                   for i, (flag, data) in enumerate(messages))
    return buf


def idem_frames(messages, pid, first_seq):
    return b"".join(serialize(IdempotentPut("test", 1, flag, data, i, metaq_checksum(data), pid, first_seq + i))
                    for i, (flag, data) in enumerate(messages))


@pytest.fixture(params=["built", "python"])
def twin(request, monkeypatch):
    """The C scanners and writer and recovery's scan (when built), or their pure-Python twins."""
    if request.param == "python":
        monkeypatch.setattr(batch, "write_run", batch.write_run_py)
        monkeypatch.setattr(recovery_scan, "scan_log", recovery_scan.scan_log_py)
        monkeypatch.setattr(recovery_scan, "write_units", recovery_scan.write_units_py)
        return burst.scan_puts_py, idemburst.scan_idem_burst_py
    if burst.scan_puts is burst.scan_puts_py:
        pytest.skip("the C helper is not built")
    return burst.scan_puts, idemburst.scan_idem_burst


def write_every_way(store, attrs, scan_puts, scan_idem):
    """The same messages through put (partition 0), put_burst (2), put_idempotent (1), the put_idem burst (3)."""
    msgs = [encode_payload(b"p%d" % i, a) for i, a in enumerate(attrs)]
    for flag, data in msgs:
        store.put("test", 0, flag, data, NOW)
    store.put("test", 2, 0, b"first", NOW)  # a partition's first put takes the general path
    buf = put_frames(msgs).replace(b"put test 0 ", b"put test 2 ")
    frames, stop = scan_puts(buf, 0, len(buf), 1 << 20, 1024)
    assert stop == len(buf)
    i = by_burst = 0
    while i < len(frames):
        taken, _runs = store.put_burst(frames[i:], buf, NOW)
        by_burst += taken
        if not taken:
            f = frames[i]
            store.put("test", 2, f[2], bytes(buf[f[4]:f[4] + f[5]]), NOW)
            taken = 1
        i += taken
    for seq, (flag, data) in enumerate(msgs):
        store.put_idempotent("test", 1, flag, data, NOW, 7, seq)
    store.put_idempotent("test", 3, 0, b"first", NOW, 8, 0)
    buf = idem_frames(msgs, 8, 1).replace(b"put_idem test 1 ", b"put_idem test 3 ")
    frames, data, stop = scan_idem(buf, 0, len(buf), 1 << 20, 1024)
    assert stop == len(buf) and len(frames) == len(msgs)
    i = by_run = 0
    while i < len(frames):  # as the broker: a run where it can, the general path at an index file's end
        taken, _runs = store.put_idempotent_run(frames[i:], data, NOW)
        by_run += taken
        if not taken:
            f = frames[i]
            store.put_idempotent_prepared("test", 3, f[2], data[f[4]:f[4] + f[5]], NOW, f[8], f[9], f[6] & 0x7FFFFFFF)
            taken = 1
        i += taken
    assert by_burst and by_run  # the fast paths wrote units (not only the general path)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(attributes, min_size=1, max_size=30))
def test_every_writer_writes_the_tags_hash(tmp_path_factory, twin, attrs):
    base = tmp_path_factory.mktemp("tags")
    master = open_store(base / "m", segment_size=SEG)
    write_every_way(master, attrs, *twin)
    want = [tag_code(expected_tags(a)) for a in attrs]
    assert [u[3] for u in units_of(master, "test", 0)] == want
    assert [u[3] for u in units_of(master, "test", 2)][1:] == want
    assert [u[3] for u in units_of(master, "test", 1)] == want
    assert [u[3] for u in units_of(master, "test", 3)][1:] == want
    before = {p: units_of(master, "test", p) for p in range(4)}

    # a slave applying the master's log builds the same units
    master.mark_flushed(master.flush_log())
    slave = open_store(base / "s", segment_size=SEG)
    pos = 0
    while True:
        chunk, nxt = master.read_log(pos, 5000)
        if not len(chunk):
            break
        slave.append_replicated(pos, bytes(chunk), NOW, master_segment_size=SEG)
        pos = nxt
    assert {p: units_of(slave, "test", p) for p in range(4)} == before
    slave.close(NOW)

    # recovery rebuilding every unit from the log (the index files lost) builds the same units
    master.close(NOW)
    for p in range(4):
        master_dir = master.dirs.partition_dir("test", p)
        for name in os.listdir(master_dir):
            os.unlink(os.path.join(master_dir, name))
    again = open_store(base / "m", segment_size=SEG)
    assert again.recovery.full_scan
    assert {p: units_of(again, "test", p) for p in range(4)} == before
    again.close(NOW)


def test_a_remoting_attribute_hashes_its_tags_only():
    from metaq.store.record import record_tags, tag_hash

    flag, data = encode_payload(b"body", "TagA\x02KEYS\x01k1\x02METAQ_PID\x017\x02")
    assert record_tags(flag, data) == b"TagA" and tag_hash(flag, data) == metaq_checksum(b"TagA")
    assert tag_hash(*encode_payload(b"x", "TagA")) == tag_hash(flag, data)
    assert tag_hash(*encode_payload(b"x", "\x02KEYS\x01k")) == 0 == tag_hash(0, b"x") == tag_code(b"")
    assert tag_hash(1, b"\xff\xff\xff\xff") == 0  # a malformed block: no tags


# -- upgrade: a data dir written the old way ------------------------------------------------------------------

def old_hash(flag, data):
    """The tag hash of brokers before TAG_FORMAT 2: the checksum of the whole attribute."""
    (n,) = struct.unpack_from(">i", data, 0)
    return metaq_checksum(data[4:4 + n])


def make_old(store, keys):
    """Turn ``store``'s data dir into one an older broker wrote: whole-attribute hashes, no tag_format."""
    for key in keys:
        p = store._parts[key]
        for n, phys, size, _tag in list(p.units(p.min, p.max)):
            rec = store.record_at(phys)
            f = p.file_for(n)
            UNIT.pack_into(f.mm, (n - f.start) * UNIT_SIZE, phys, size, old_hash(rec.flag, rec.data) if rec.flag & 1
                           else 0)
        p.dirty = True
    store.close(NOW)
    dirs = store.dirs
    for path in (dirs.checkpoint,):
        state = dirs.read_state(path, CHECKPOINT_MAGIC)
        assert state.pop("tag_format") == TAG_FORMAT
        dirs.write_state(path, CHECKPOINT_MAGIC, state)  # as an older broker wrote it: no tag_format


@pytest.mark.parametrize("clean", [True, False])
def test_an_old_data_dir_is_rebuilt_before_a_filtered_read(tmp_path, clean):
    d = tmp_path / "data"
    s = open_store(d)
    attrs = ["TagA\x02KEYS\x01k%d" % i if i % 10 == 3 else "TagB\x02KEYS\x01k%d" % i for i in range(100)]
    for i, a in enumerate(attrs):
        s.put("test", 0, *encode_payload(b"m%d" % i, a), NOW)
    s.mark_flushed(s.flush_log())
    s.checkpoint(NOW)
    make_old(s, [("test", 0)])
    if not clean:
        os.unlink(s.dirs.clean_shutdown)
    old = open_store(d)  # an old unit's hash (TagA + properties) matches no filter on TagA: it must be rebuilt
    assert old.recovery.full_scan and "older format" in old.recovery.untrusted_index
    r = old.read_tagged("test", 0, 0, parse_tag_expression("TagA"), 100, 1 << 20)
    assert [h.offset for h in r.hits] == [i for i in range(100) if i % 10 == 3]
    old.close(NOW)
    again = open_store(d)  # the rebuilt units were checkpointed with the format: a clean restart now
    assert again.recovery.clean_shutdown and again.recovery.untrusted_index is None
    again.close(NOW)


def test_plain_text_attributes_keep_their_hash_across_the_upgrade(tmp_path):
    """A plain MetaQ attribute (no \\x02) hashes the same either way: an old unit of one is already right."""
    flag, data = encode_payload(b"x", "color=red")
    from metaq.store.record import tag_hash

    assert old_hash(flag, data) == tag_hash(flag, data)

