"""Issue 15 point 5 against a real broker: a topic flood stops at limits.max_topics with a clear 400, earlier
topics keep working, and the disk a new topic costs is a page of index, not a whole preallocated file."""

import os
import subprocess

from metaq.client.local import small_config
from metaq.protocol import events as ev


def du_bytes(path):
    """What ``du`` reports for ``path`` (allocated bytes), as a user would check it."""
    out = subprocess.run(["du", "-s", "-B1", str(path)], capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def test_a_topic_flood_past_max_topics_gets_a_clear_400_and_earlier_topics_keep_working(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "data", limits={"max_topics": 40, "max_partitions": 1000}))
    with b.client() as c:
        for i in range(40):  # at the limit
            c.put_ok("flood-%d" % i, b"m%d" % i, partition=0)
        r = c.put("flood-40", b"one past", partition=0)
        assert isinstance(r, ev.Result) and r.code == 400
        assert b"limits.max_topics" in r.body and b"flood-40" in r.body
        for i in range(41, 60):
            assert c.put("flood-%d" % i, b"x", partition=0).code == 400
        c.put_ok("flood-3", b"again", partition=0)  # earlier topics keep working
        assert [rec.data for rec in c.get_records("flood-3", 0, 0)] == [b"m3", b"again"]
        assert c.call(ev.Version(c.opaque())).code == 200
    b.stop()
    b.start()  # the limit holds across a restart; so do the topics
    with b.client() as c:
        assert c.put("flood-40", b"x", partition=0).code == 400
        assert [rec.data for rec in c.get_records("flood-39", 0, 0)] == [b"m39"]


def test_a_partition_flood_past_max_partitions(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "data", limits={"max_partitions": 5}))
    with b.client() as c:
        for topic, p in (("pa", 0), ("pa", 1), ("pb", 0), ("pb", 1), ("pc", 0)):  # "*": 2 partitions each
            c.put_ok(topic, b"x", partition=p)
        r = c.put("pc", b"x", partition=1)
        assert r.code == 400 and b"limits.max_partitions" in r.body
        c.put_ok("pa", b"y", partition=1)


def test_new_topics_cost_a_page_of_index_each(broker_factory, tmp_path):
    """200 topics at the default index_file_units (16 MiB files before: 3.2 GB); now about a page each."""
    data = tmp_path / "data"
    cfg = small_config(data, store={"index_file_units": 1 << 20})
    b = broker_factory(cfg)
    with b.client() as c:
        for i in range(200):
            c.put_ok("disk-%d" % i, b"x", partition=0)
    b.stop()
    index = du_bytes(data / "index")
    assert index <= 200 * 3 * 4096 + 4096, index  # a 4 KiB file and its two directories (a block each) per topic
    assert du_bytes(data) < index + 8 * (1 << 20)  # and the log's (small) segments
    sizes = {os.path.getsize(os.path.join(root, f)) for root, _d, files in os.walk(data / "index") for f in files}
    assert sizes == {4096}
