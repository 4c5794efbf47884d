"""A slave's disk filled at each step of its catch-up (issue 41 point 3), on a real tmpfs.

A slave copies its master's log chunk by chunk (``append_replicated``) while its own background work runs
between chunks (segments and index files prepared ahead, checkpoints, the key index following the log). The
disk is filled for real (a filler file leaving a few pages) so that ENOSPC meets each of those steps in turn:
a segment, a new index file, an index file's growth, a key-index file, a checkpoint; sometimes the slave is
killed while the disk is still full and reopened. Space then returns, the catch-up finishes, and every
``(topic, partition, offset)`` of the slave must read as the master's, before and after a reopen, with every
key found and ``--verify`` clean: a full disk never leaves an index unit pointing at nothing.
"""

import logging
import os
import random
import shutil

import pytest

from metaq.errors import DiskFull, StoreError
from metaq.protocol.message import encode_payload
from metaq.store.verify import verify_log
from tests.harness.store import NOW, open_store, read_all
from tests.harness.tmpfs import fill, tmpfs

pytestmark = [pytest.mark.fault, pytest.mark.root]

CONFIG = dict(segment_size=65536, index_file_units=1024, key_index_slots=64, key_index_entries=64, flush="async",
              disk_danger_ratio=1.0, disk_warn_ratio=1.0)
PARTS = [("test", p) for p in range(4)] + [("tx", 0), ("tx", 1)]
PAGE = 4096
#: Free pages left by the filler, one sweep each: from nothing to most of what the catch-up needs.
LEFTS = range(0, 200, 3)


def _step_of(text):
    """Which step of the catch-up a disk-full message names."""
    if "/commitlog/" in text:
        return "segment"
    if "/keyindex/" in text:
        return "key index"
    if "/index/" in text:
        return "index growth" if " grow " in text else "index file"
    return "checkpoint" if text.startswith("checkpoint") else "other"


def _free(mount):
    path = os.path.join(mount, "filler")
    if os.path.exists(path):
        os.unlink(path)


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    s = open_store(tmp_path_factory.mktemp("master") / "data", **CONFIG)
    rnd = random.Random(41)
    keys = {}
    for i in range(6000):
        topic, part = PARTS[rnd.randrange(len(PARTS))]
        key = "k%d" % i
        flag, data = encode_payload(b"%d-" % i + b"x" * rnd.choice([1, 20, 200]), "tag\x02KEYS\x01%s" % key)
        r = s.put(topic, part, flag, data, NOW)
        keys[key] = (topic, r.partition, r.offset)
    s.mark_flushed(s.flush_log())
    while s.follow_log():
        pass
    s.checkpoint(NOW)
    yield s, {k: read_all(s, *k) for k in PARTS}, keys
    s.close(NOW)


def _background(slave, turn, failures):
    """One of the slave's background steps, as the broker runs them between chunks; a full disk is noted."""
    try:
        if turn % 3 == 0:
            slave.prepare_ahead()
        elif turn % 3 == 1:
            slave.mark_flushed(slave.flush_log())
            slave.prepare_checkpoint()
            slave.checkpoint(NOW)
        else:
            slave.mark_flushed(slave.flush_log())
            while slave.follow_log():
                pass
    except (DiskFull, StoreError, OSError) as exc:
        failures.append(("checkpoint: " if turn % 3 == 1 else "") + str(exc))


def _catch_up(master_store, slave_dir, mount, left, rnd):
    """Copy the master's log into a fresh slave with ``left`` bytes free; returns (slave, disk-full messages)."""
    failures = []
    slave = open_store(slave_dir, **CONFIG)
    fill(mount, left)
    freed, turn = False, 0
    while slave.written_position < master_store.written_position:
        turn += 1
        assert turn < 50_000, "the catch-up does not move: %s" % failures[-3:]
        pos = slave.written_position
        data, _next = master_store.read_log(pos, rnd.choice([512, 4096, 20000]), upto="written")
        try:
            slave.append_replicated(pos, bytes(data), NOW, CONFIG["segment_size"])
        except DiskFull as exc:
            failures.append(str(exc))
            if len(failures) >= 3 and not freed:
                if left % 2:  # killed while the disk is full, started again (still full, then with space)
                    slave.abandon()
                    try:
                        slave = open_store(slave_dir, **CONFIG)
                    except (DiskFull, StoreError) as exc2:
                        failures.append(str(exc2))
                        _free(mount)
                        slave = open_store(slave_dir, **CONFIG)
                _free(mount)
                freed = True
        if rnd.random() < 0.5:
            _background(slave, turn, failures)
    slave.mark_flushed(slave.flush_log())
    while slave.follow_log():
        pass
    return slave, failures


def _assert_same(slave, expected, keys, when):
    for key in PARTS:
        got = read_all(slave, *key)
        assert len(got) == len(expected[key]), "%s: %s-%d holds %d messages, the master %d" % (
            when, key[0], key[1], len(got), len(expected[key]))
        for offset, (ours, theirs) in enumerate(zip(got, expected[key], strict=True)):
            assert ours == theirs, "%s: %s-%d offset %d differs from the master's" % (when, key[0], key[1], offset)
    for name in list(keys)[::97]:
        found = _lookup(slave, keys[name][0], name)
        assert len(found) == 1, "%s: key %s found %d times" % (when, name, len(found))


def _lookup(store, topic, key):
    """The records a key lookup finds (one page, every step taken)."""
    search = store.key_search(topic, key, 0, NOW + 1, 10)
    while not search.done:
        search.step()
    return search.page().records


def test_a_slave_filled_at_each_step_of_its_catch_up_holds_the_masters_log(master, tmp_path, caplog):
    master_store, expected, keys = master
    caplog.set_level(logging.WARNING, logger="metaq")
    mount = tmp_path / "mnt"
    met = set()
    with tmpfs(mount, "4m"):
        for left in LEFTS:
            slave_dir = os.path.join(str(mount), "s")
            shutil.rmtree(slave_dir, ignore_errors=True)
            _free(mount)
            slave, failures = _catch_up(master_store, slave_dir, str(mount), left * PAGE, random.Random(left))
            # what the background work met and logged (it works ahead: its own failures are not raised)
            logged = [r.getMessage() for r in caplog.records if "No space left" in r.getMessage()]
            caplog.clear()
            met.update(_step_of(f) for f in failures + logged)
            _assert_same(slave, expected, keys, "live, %d pages left" % left)
            slave.abandon()  # as kill -9 leaves it
            slave = open_store(slave_dir, **CONFIG)
            _assert_same(slave, expected, keys, "reopened, %d pages left" % left)
            slave.close(NOW)
            report = verify_log(slave_dir)
            assert not report.corrupt and report.torn_tail is None, report.summary()
    assert {"segment", "index file", "index growth", "key index", "checkpoint"} <= met, met


def test_the_key_index_resumes_where_a_full_disk_stopped_it(tmp_path):
    # entries added before a new key file met ENOSPC stay; the next step starts after them, never again
    # from the record it had reached before (every entry twice, then a file created under a name in use)
    mount = tmp_path / "mnt"
    with tmpfs(mount, "2m"):
        s = open_store(mount / "data", **CONFIG)
        names = []

        def put(n):
            for i in range(len(names), len(names) + n):
                flag, data = encode_payload(b"x", "t\x02KEYS\x01key%d" % i)
                s.put("test", i % 4, flag, data, NOW)
                names.append("key%d" % i)
            s.mark_flushed(s.flush_log())

        put(100)  # two key files: 64 entries and 36
        while s.follow_log():
            pass
        before = s.keys.indexed_to
        put(300)
        fill(str(mount), 0)
        with pytest.raises(DiskFull):
            while s.follow_log():
                pass
        stopped = s.keys.indexed_to
        assert before < stopped < s.written_position, "the second file filled up, then no third one"
        for _ in range(3):  # a full disk refuses again without losing its place
            with pytest.raises(DiskFull):
                s.follow_log()
            assert s.keys.indexed_to == stopped
        _free(str(mount))
        while s.follow_log():
            pass
        assert s.keys.indexed_to == s.written_position
        for name in names:
            assert len(_lookup(s, "test", name)) == 1, name
        s.close(NOW)
