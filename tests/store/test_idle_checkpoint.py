"""The periodic checkpoint rewrites no file when nothing changed (``MessageStore.checkpoint(now, if_changed=True)``):
an idle broker wrote its checkpoint and key checkpoint, with ~4 fsyncs, every interval (``strace``: 45 fsyncs in
10 s). Open, a cut and close always write; the clean restart still pairs with the last checkpoint written."""

import os

from metaq.keys import index as keyindex
from tests.harness.store import NOW, open_store
from tests.keys.test_index import flush, put


def stamp(path):
    st = os.stat(path)
    return st.st_ino, st.st_mtime_ns, open(path, "rb").read()


def files(s):
    return {"checkpoint": stamp(s.dirs.checkpoint), "keys": stamp(s.dirs.key_checkpoint)}


def test_nothing_changed_nothing_rewritten_then_a_put_rewrites_both(data_dir):
    s = open_store(data_dir, flush="sync")
    try:
        put(s, "test", keys=["k1"])
        flush(s)
        s.checkpoint(NOW, True)
        written = files(s)
        for later in (1, 2, 3):  # idle: three more periodic checkpoints
            assert s.checkpoint(NOW + later * 1000, True) == s.flushed_position
        assert files(s) == written

        put(s, "test", keys=["k2"])
        flush(s)
        s.checkpoint(NOW + 5000, True)
        after = files(s)
        assert after["checkpoint"] != written["checkpoint"] and after["keys"] != written["keys"]
        assert len(keyindex.run(s.key_search("test", "k2", 0, 1 << 62, 10)).records) == 1
    finally:
        s.close(NOW)


def test_a_put_without_keys_rewrites_the_checkpoint_and_the_forced_one_always_writes(data_dir):
    s = open_store(data_dir, flush="sync")
    try:
        s.put("test", 0, 0, b"plain", NOW)
        s.mark_flushed(s.flush_log())
        s.checkpoint(NOW, True)
        first = stamp(s.dirs.checkpoint)
        s.put("test", 1, 0, b"plain", NOW)  # another partition: a new index file, a new position
        s.mark_flushed(s.flush_log())
        s.checkpoint(NOW, True)
        second = stamp(s.dirs.checkpoint)
        assert second != first
        s.checkpoint(NOW)  # not if_changed (open, a cut, close): written however idle
        assert stamp(s.dirs.checkpoint) != second  # the content too: a new random serial
    finally:
        s.close(NOW)


def test_ids_handed_out_while_the_log_stood_still_are_checkpointed(data_dir):
    """A transaction's commit takes its ids before its append (a full disk may refuse that): the periodic checkpoint
    must still record them, or a restart after kill -9 could hand one out again (review of 10a89be)."""
    s = open_store(data_dir, flush="sync")
    s.put("test", 0, 0, b"x", NOW)
    s.mark_flushed(s.flush_log())
    s.checkpoint(NOW, True)
    handed = [s.new_msg_id(NOW) for _ in range(3)]
    s.checkpoint(NOW + 1000, True)
    s.abandon()  # kill -9
    s = open_store(data_dir, flush="sync")
    try:
        assert s.new_msg_id(NOW) > max(handed)
    finally:
        s.close(NOW)


def test_a_crash_after_skipped_checkpoints_trusts_them_no_full_scan_no_key_rebuild(data_dir):
    s = open_store(data_dir, flush="sync", retention_hours=1.0)
    for i in range(200):
        put(s, "test", keys=["k%d" % i])
    flush(s)
    s.checkpoint(NOW, True)
    s.retention(NOW + 10 * 3_600_000)  # whatever it deletes, the skipped checkpoints after it stay true
    for later in (1, 2, 3):
        s.checkpoint(NOW + later, True)
    s.abandon()  # kill -9: no clean-shutdown marker, recovery goes by the checkpoints on disk
    s = open_store(data_dir, flush="sync")
    try:
        report = s.recovery
        assert not report.clean_shutdown and not report.full_scan and report.untrusted_index is None
        assert s.keys.rebuilt_from is None
        assert len(keyindex.run(s.key_search("test", "k199", 0, 1 << 62, 10)).records) == 1
    finally:
        s.close(NOW)


def test_a_restart_after_skipped_checkpoints_is_clean_and_reads_everything(data_dir):
    s = open_store(data_dir, flush="sync")
    for i in range(20):
        s.put("test", i % 2, 0, b"m%d" % i, NOW)
    s.mark_flushed(s.flush_log())
    s.checkpoint(NOW, True)
    s.checkpoint(NOW + 1000, True)  # skipped
    s.close(NOW + 2000)
    s = open_store(data_dir, flush="sync")
    try:
        assert s.recovery.clean_shutdown  # the marker pairs with the checkpoint close wrote
        got = [bytes(v[20:]) for p in (0, 1) for v in s.read("test", p, 0, 1 << 20).views]
        assert sorted(got) == sorted(b"m%d" % i for i in range(20))
    finally:
        s.close(NOW)
