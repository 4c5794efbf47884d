"""The broker's consumer-offset store over the text extension ``commit_offset`` / ``query_offset``."""

import json
import os
import time

from metaq.protocol import events as ev
from metaq.store.files import CONSUMER_OFFSETS_FILE, STATE_HEADER
from tests.harness.broker import wait_for


def commit(c, group, topic, partition, offset):
    return c.call(ev.CommitOffset(group, topic, partition, offset, c.opaque()))


def query(c, group, topic, partition):
    return c.call(ev.QueryOffset(group, topic, partition, c.opaque()))


def fill(c, topic, partition, n):
    for i in range(n):
        c.put_ok(topic, b"m%d" % i, partition)


def test_commit_then_query_per_group_and_partition(broker):
    with broker.client() as c:
        fill(c, "t1", 0, 5)
        fill(c, "t1", 1, 2)
        r = query(c, "billing", "t1", 0)
        assert r.code == 404 and b"billing" in r.body
        assert commit(c, "billing", "t1", 0, 3) == ev.Result(200, b"", r.opaque + 1)
        assert commit(c, "billing", "t1", 1, 2).code == 200
        assert commit(c, "audit", "t1", 0, 5).code == 200
        assert query(c, "billing", "t1", 0).body == b"3"
        assert query(c, "billing", "t1", 1).body == b"2"
        assert query(c, "audit", "t1", 0).body == b"5"
        assert query(c, "audit", "t1", 1).code == 404
        assert commit(c, "billing", "t1", 0, 4).code == 200  # moves forward
        assert commit(c, "billing", "t1", 0, 1).code == 200  # and back (a deliberate rewind)
        assert query(c, "billing", "t1", 0).body == b"1"
        lines = c.stats("groups").split("\r\n")
        assert "billing t1 0 offset 1 max_offset 5 lag 4 committed_ms" in " ".join(lines)
        row = [ln for ln in lines if ln.startswith("audit t1 0 ")][0].split()
        assert row[3:9] == ["offset", "5", "max_offset", "5", "lag", "0"]
        assert abs(int(row[10]) - time.time() * 1000) < 60_000


def test_bad_commits_are_refused_clearly_and_change_nothing(broker):
    with broker.client() as c:
        fill(c, "t1", 0, 3)
        assert commit(c, "g", "t1", 0, 2).code == 200
        r = commit(c, "g", "t1", 0, 4)
        assert r.code == 400 and b"out of range" in r.body and b"0..3" in r.body
        r = commit(c, "g", "t1", 9, 0)
        assert r.code == 400 and b"partition" in r.body
        r = commit(c, "bad/group", "t1", 0, 1)
        assert r.code == 400 and b"group" in r.body
        r = commit(c, "g", "bad/topic", 0, 1)
        assert r.code == 400
        c.send(b"commit_offset g t1 0 -1 77\r\n")
        r = c.read_event()
        assert r.code == 400 and r.opaque == 77 and b"offset" in r.body
        c.send(b"query_offset g t1 0\r\n")
        r = c.read_event()
        assert r.code == 400 and b"5 tokens" in r.body
        assert query(c, "g", "t1", 0).body == b"2"  # untouched, and the connection still works


def test_offsets_survive_clean_restart_and_kill_after_a_checkpoint(broker):
    with broker.client() as c:
        fill(c, "t1", 0, 10)
        assert commit(c, "g", "t1", 0, 7).code == 200
    assert broker.stop() == 0
    broker.start()
    with broker.client() as c:
        assert query(c, "g", "t1", 0).body == b"7"
        assert commit(c, "g", "t1", 0, 9).code == 200
    wait_for(lambda: ["g", "t1", 0, 9] in [row[:4] for row in saved_offsets(broker)], what="the commit in the file")
    broker.kill()
    broker.start()
    with broker.client() as c:
        assert query(c, "g", "t1", 0).body == b"9"


def saved_offsets(broker):
    """The rows of the broker's consumer-offsets file as it is on disk now (after the checkpoint that wrote it)."""
    try:
        with open(os.path.join(broker.data_dir, CONSUMER_OFFSETS_FILE), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    return json.loads(data[STATE_HEADER.size:])["offsets"] if len(data) > STATE_HEADER.size else []
