"""A slave's disk filled at each step of its catch-up, then freed (issue 41 point 3), on real brokers.

The slave's data directory is a real tmpfs. Before each round a filler file takes all of it but a chosen number of
bytes, so that the round's catch-up meets ENOSPC at one chosen step: a partition's index file grown (a few KiB
free), new commit-log segments (less than a segment free), the checkpoint and every small state file (nothing
free; there the slave is also killed with kill -9 and started again on the full disk: it starts, the last
checkpoint staying in place), the first key index file (less than one free). Then the filler goes and the slave
must catch up. At the end every ``(topic, partition, offset)`` of the slave reads exactly as on its master, its key
index finds the last round's keys (nothing was written after that round's full disk: the follower tries again by
itself), a failed key index step or checkpoint is one log line rather than one per flush or interval, and
``metaq-server --verify`` of the slave's data dir finds nothing corrupt.
"""

import os
import subprocess
import sys
import time

import pytest

from metaq.keys import limits as keys_limits
from metaq.client.local import free_port, small_config
from metaq.keys.wire import decode_lookup_body
from metaq.protocol import events as ev
from metaq.protocol.properties import encode_attribute
from tests.harness.broker import consume_all, wait_for
from tests.harness.replication import caught_up, stats
from tests.harness.tmpfs import fill, tmpfs

pytestmark = [pytest.mark.fault, pytest.mark.root]

PARTS = [("t-a", p) for p in range(4)] + [("t-b", p) for p in range(4)]
SEGMENT = 1 << 20  # small_config's segment_size
INDEX_FILE = 4096 * 16  # small_config's index_file_units, 16-byte units
KEY_FILE = 64 + 4 * 4096 + 28 * 16384  # small_config's key_index_slots and key_index_entries

#: ``(step, bytes left free, what the round puts, what the step's ENOSPC names)``: each round's catch-up meets a full
#: disk at its step. A new partition's index file grows from one page; megabytes of records need new segments; with
#: nothing free, the checkpoint fails (records and units go to files already allocated); the first keyed records need
#: the first key index file. The key round comes last: nothing written after it, the key index must still catch up.
ROUNDS = [("index file", 12 << 10, "new partition", "/index/t-c/"),
          ("segment", SEGMENT // 2, "megabytes", "/commitlog/"),
          ("checkpoint", 0, "few", "checkpoint failed"),
          ("key index file", KEY_FILE // 2, "keyed", "/keyindex/")]


def load(broker, kind, seed):
    """Put a round's messages on ``broker``."""
    with broker.client(timeout=30) as c:
        if kind == "new partition":
            for i in range(1500):
                c.put_ok("t-c", b"%d-%d" % (seed, i), 0)
            return
        n, size = {"keyed": (200, 1), "megabytes": (6000, 40), "few": (40, 1), "plain": (800, 40)}[kind]
        for i in range(n):
            topic, part = PARTS[i % len(PARTS)]
            attr = encode_attribute(None, {"KEYS": "k%d-%d" % (seed, i)}) if kind == "keyed" else None
            c.put_ok(topic, (b"%d-%d-" % (seed, i)) * size, part, attr)


def keyed_at(client, i):
    """How many messages of the key round's ``i``-th key the broker's key index finds."""
    topic = PARTS[i % len(PARTS)][0]
    r = client.call(ev.Lookup(topic, "k%d-%d" % (len(ROUNDS), i), 0, 2**63 - 1, keys_limits.MAX_KEY_QUERY_RESULTS, "",
                              client.opaque()))
    assert r.code == 200, r
    return len(decode_lookup_body(r.body).items)


def space_lines(broker):
    return [line for line in broker.log_text().splitlines() if "No space left" in line or "short write" in line]


def test_a_slave_whose_disk_fills_at_each_step_of_its_catch_up_reads_as_its_master(broker_factory, tmp_path):
    mount = tmp_path / "slave"
    with tmpfs(mount, "48m"):
        rport = free_port()
        master = broker_factory(small_config(tmp_path / "m" / "data", replication={"port": rport}),
                                workdir=tmp_path / "m")
        slave = broker_factory(small_config(mount / "data"), workdir=tmp_path / "s",  # its log off the full disk
                               extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
        load(master, "plain", 0)
        wait_for(lambda: stats(slave)["log_end_position"] == stats(master)["log_end_position"], 30, "first copy")
        for seed, (step, leave, kind, mark) in enumerate(ROUNDS, 1):
            before = len(space_lines(slave))
            filler = fill(mount, leave)
            load(master, kind, seed)
            wait_for(lambda mark=mark, before=before: any(mark in line for line in space_lines(slave)[before:]), 20,
                     lambda step=step: "the %s step met ENOSPC: %s" % (step, slave.log_text()[-3000:]))
            time.sleep(0.3)
            if step == "checkpoint":  # a crash with the disk full: recovery starts from the checkpoint before
                slave.kill()
                slave.start()
                assert "the checkpoint after recovery was not written" in slave.log_text(since_start=True)
            os.unlink(filler)
            wait_for(lambda: stats(slave)["log_end_position"] == stats(master)["log_end_position"], 30,
                     lambda step=step: "the slave catches up after the %s step: %s" % (step, slave.log_text()[-2000:]))
        caught_up(master, slave)  # its partitions answer the master's ends, not only its log
        with master.client(timeout=30) as mc, slave.client(timeout=30) as sc:
            for topic, part in PARTS + [("t-c", 0)]:
                theirs, ours = consume_all(mc, topic, part), consume_all(sc, topic, part)
                assert len(ours) == len(theirs), (topic, part, len(ours), len(theirs))
                for offset, (a, b) in enumerate(zip(ours, theirs, strict=True)):
                    assert a == b, "%s-%d offset %d differs on the slave" % (topic, part, offset)
            wait_for(lambda: all(keyed_at(sc, i) == keyed_at(mc, i) == 1 for i in range(0, 200, 37)), 10,
                     "the slave's key index finds the key round's messages once space returns")
        assert slave.log_text().count("log follower: a step failed") == 1, "one line for one failure"
        assert slave.log_text().count("checkpoint failed") <= len(ROUNDS), "one line for each full disk at most"
        slave.stop()
        out = subprocess.run([sys.executable, "-m", "metaq.server", "-c", slave.config_path, "--verify"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and ", 0 corrupt" in out.stdout and "torn tail" not in out.stdout, out.stdout
