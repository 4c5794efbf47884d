"""A `sync` slave on a small tmpfs that fills while it copies, its worker thread building segments and index files
ahead the whole time, as the broker runs it (issue 53 point 9): a loop over index-file boundaries and fill points.

Each run copies a master's log (two partitions crossing 4096-unit index files many times, 1 MiB segments) into a
slave on a 6 MiB tmpfs. A worker thread runs ``prepare_ahead`` beside every chunk (the hand-off of a file built
ahead is where a unit write was lost: the first page of an index file left empty, served as 512); checkpoints run
in their own thread now and then; a filler takes the disk at the run's fill point and comes and goes after it,
a full disk running retention (the oldest segments go) as the broker does; once the load is copied, space
returns. Then every unit from each partition's first offset must be the master's, live and after a kill -9 and
reopen, which must find nothing to rebuild.
"""

import os
import random
import subprocess
import threading

import pytest

from metaq.errors import DiskFull
from metaq.store.files import disk_usage
from tests.harness.store import NOW, open_store
from tests.harness.tmpfs import fill, tmpfs

pytestmark = [pytest.mark.fault, pytest.mark.root, pytest.mark.slow]

CFG = dict(segment_size=1 << 20, index_file_units=4096, flush="sync", disk_warn_ratio=0.75, disk_danger_ratio=0.9,
           key_index_slots=1024, key_index_entries=4096)
MESSAGES = 60_000
#: (seed, fill point in MiB of the slave's log): each run meets the index-file boundaries at other moments.
RUNS = [(seed, 1 + seed % 4) for seed in range(12)]


@pytest.fixture(scope="module")
def master(tmp_path_factory):
    s = open_store(tmp_path_factory.mktemp("master") / "data", **CFG)
    rnd = random.Random(53)
    for _ in range(MESSAGES):
        s.put("tj", rnd.randrange(2), 0, b"x" * rnd.choice([1, 10, 50]), NOW)
    s.mark_flushed(s.flush_log())
    yield s
    s.close(NOW)


class Worker(threading.Thread):
    """``prepare_ahead`` over and over until stopped (the broker's ahead worker); checkpoints now and then."""

    def __init__(self, store, seed):
        super().__init__(daemon=True)
        self.store, self.rnd, self.stopped, self.lock = store, random.Random(seed), False, threading.Lock()

    def run(self):
        while not self.stopped:
            with self.lock:
                try:
                    self.store.prepare_ahead()
                    if self.rnd.random() < 0.05:
                        self.store.checkpoint(NOW)
                except OSError:  # a full disk: the checkpoint tries again later, as the broker's does
                    pass


def _copy(master_store, slave_dir, mount, seed, fill_at):
    """Copy the master's log into a new slave, the disk filled from ``fill_at`` on; returns the slave."""
    rnd = random.Random(seed)
    slave = open_store(slave_dir, **CFG)
    worker = Worker(slave, seed)
    worker.start()
    filler = os.path.join(mount, "filler")
    refused = 0
    try:
        while slave.written_position < master_store.written_position:
            pos = slave.written_position
            if pos >= fill_at and refused < 200 and rnd.random() < 0.1:
                if os.path.exists(filler):
                    os.unlink(filler)
                else:
                    fill(mount, rnd.randrange(0, 64) * 4096)
            data, _next = master_store.read_log(pos, rnd.choice([4096, 20000, 65536]), upto="written")
            try:
                slave.append_replicated(pos, bytes(data), NOW, CFG["segment_size"])
            except DiskFull:
                refused += 1
                with worker.lock:
                    slave.retention(NOW, disk_usage(slave_dir).ratio)
                if refused == 200 and os.path.exists(filler):
                    os.unlink(filler)  # space returns for good
            slave.mark_flushed(slave.flush_log())
    finally:
        worker.stopped = True
        worker.join()
    return slave


def _assert_units_are_the_masters(slave, master_store, when):
    for key, p in slave._parts.items():
        theirs = master_store._parts[key]
        assert p.max == theirs.max, "%s: %s-%d ends at %d, the master's at %d" % ((when,) + key + (p.max, theirs.max))
        for n in range(p.min, p.max):
            ours = p.unit(n)
            assert ours is not None and ours[:2] == theirs.unit(n)[:2], "%s: %s-%d unit %d is %s, the master's %s" % (
                (when,) + key + (n, ours, theirs.unit(n)))


@pytest.mark.parametrize("seed,fill_mib", RUNS)
def test_a_slave_filled_while_it_copies_keeps_every_index_unit(master, tmp_path, seed, fill_mib):
    mount = tmp_path / "mnt"
    with tmpfs(mount, "6m"):
        slave_dir = os.path.join(str(mount), "s")
        slave = _copy(master, slave_dir, str(mount), seed, fill_mib << 20)
        _assert_units_are_the_masters(slave, master, "live")
        slave.abandon()  # as kill -9 leaves it
        subprocess.run(["mount", "-o", "remount,size=64m", str(mount)], check=True)
        slave = open_store(slave_dir, **CFG)
        assert slave.recovery.index_units_repaired == 0
        _assert_units_are_the_masters(slave, master, "reopened")
        slave.close(NOW)
