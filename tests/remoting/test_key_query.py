"""QUERY_MESSAGE (12) and the view by unique id over a real broker's key index (README "Key index")."""

import time

import pytest

from bench.rocketmq_peer import run_peer
from metaq.keys import limits as keys_limits
from metaq.client.local import ns_of
from metaq.client.raw import RemotingClient
from metaq.protocol.rocketmq.bodies import decode_stored_messages
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from tests.harness.broker import wait_for
from tests.harness.rocketmq import require_official_client, send_v1

FAST = {"store": {"flush": "async", "flush_interval_ms": 50}}


def rport(broker):
    return broker.config["remoting"]["port"]


def query(rc, topic, key, max_num=32, begin=0, end=None, unique=False):
    fields = {"topic": topic, "key": key, "maxNum": max_num, "beginTimestamp": begin,
              "endTimestamp": int(time.time() * 1000) + 60_000 if end is None else end}
    if unique:
        fields["_UNIQUE_KEY_QUERY"] = "true"
    return rc.call(R.QUERY_MESSAGE, fields)


def found(rc, topic, key, at_least=1, **kw):
    """The stored messages a query returns once the index has caught up with ``at_least`` of them (the index
    follows the flushes, a flush round at a time), or what it returns after 10 s."""
    deadline = time.monotonic() + 10
    while True:
        r = query(rc, topic, key, **kw)
        got = decode_stored_messages(r.body) if r.code == C.SUCCESS else []
        if len(got) >= at_least or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def test_keys_and_unique_keys_found_and_unknown_keys_not(rmq_factory):
    b = rmq_factory(**FAST)
    with RemotingClient(rport(b)) as rc:
        for i in range(5):
            assert send_v1(rc, "tQ", b"m%d" % i, props={"KEYS": "order-%d shared" % i, "UNIQ_KEY": "U%d" % i}).code == 0
        newest_first = [b"m4", b"m3", b"m2", b"m1", b"m0"]
        assert [m.body for m in found(rc, "tQ", "shared", at_least=5)] == newest_first
        assert [m.body for m in found(rc, "tQ", "order-3")] == [b"m3"]
        assert [m.body for m in found(rc, "tQ", "U2", unique=True)] == [b"m2"]
        r = query(rc, "tQ", "nothing")
        assert r.code == C.QUERY_NOT_FOUND and int(r.ext_fields["indexLastUpdatePhyoffset"]) > 0
        assert query(rc, "other", "shared").code == C.QUERY_NOT_FOUND  # keys belong to their topic
        assert query(rc, "tQ", "shared", end=1).code == C.QUERY_NOT_FOUND  # outside the time window
        assert len(found(rc, "tQ", "shared", max_num=2)) == 2


def test_max_num_and_key_length_are_bounded(rmq_factory):
    b = rmq_factory(**FAST)
    with RemotingClient(rport(b)) as rc:
        most = keys_limits.MAX_KEY_QUERY_RESULTS
        for i in range(most + 1):
            send_v1(rc, "tB", b"x", props={"KEYS": "hot last" if i == most else "hot"})
        assert found(rc, "tB", "last")  # the index follows the log in order: every one of them is in
        assert len(found(rc, "tB", "hot", max_num=10 ** 9)) == most
        assert query(rc, "tB", "k" * (keys_limits.MAX_KEY_BYTES + 1)).code != C.SUCCESS
        assert query(rc, "tB", "hot").code == C.SUCCESS  # the connection still serves


@pytest.mark.slow
@pytest.mark.fault
def test_keys_sent_by_the_official_client_are_found_after_a_kill_9(rmq_factory, tmp_path):
    require_official_client()
    b = rmq_factory(**FAST)
    sent = [s for s in run_peer(tmp_path / "p", "produce", "--ns", ns_of(b), "--topic", "tOK", "--count", 50)
            if "msg_id" in s]
    assert len(sent) == 50
    with RemotingClient(rport(b)) as rc:
        assert [m.body for m in found(rc, "tOK", "m-key-7")] == [b"m-7"]
    with b.client() as c:  # past a flush (a kill -9 keeps the page cache anyway; the index is rebuilt from the log)
        wait_for(lambda: (lambda st: st["log_flushed_position"] == st["log_end_position"])(c.stats_dict()),
                 what="the log flushed")
    b.kill()
    b.start()
    with RemotingClient(rport(b)) as rc:
        for s in (sent[0], sent[31], sent[-1]):
            [m] = found(rc, "tOK", "m-key-%d" % s["i"])
            assert m.body == b"m-%d" % s["i"]
            [v] = found(rc, "tOK", s["msg_id"], unique=True)
            assert v.body == m.body


def test_pipelined_queries_never_read_are_held_by_the_reply_budget(rmq_factory):
    """QUERY_MESSAGE pages hold their bytes of the connection's reply budget until sent, as pulls do: a client
    that pipelines 40 queries of a ~3 MB page and reads nothing stops its own queries instead of growing the
    broker by 120 MB; once it reads, every answer comes, each whole."""
    b = rmq_factory(limits={"max_body_bytes": 128 << 10}, store={"flush": "async", "flush_interval_ms": 50,
                                                                 "segment_size": 8 << 20})
    body = b"p" * (48 << 10)
    with RemotingClient(rport(b)) as rc:
        for _ in range(keys_limits.MAX_KEY_QUERY_RESULTS):
            assert send_v1(rc, "tQB", body, props={"KEYS": "popular"}).code == 0
        most = keys_limits.MAX_KEY_QUERY_RESULTS
        assert len(found(rc, "tQB", "popular", at_least=most, max_num=64)) == most
        rss = [int(line.split()[1]) for line in open("/proc/%d/status" % b.proc.pid) if line.startswith("VmRSS")][0]
        fields = {"topic": "tQB", "key": "popular", "maxNum": 64, "beginTimestamp": 0, "endTimestamp": 2**62}
        sent = [rc.request(R.QUERY_MESSAGE, fields) for _ in range(40)]
        time.sleep(2.0)  # the broker answers what the budget lets it and holds the rest unread
        grown = [int(line.split()[1]) for line in open("/proc/%d/status" % b.proc.pid)
                 if line.startswith("VmRSS")][0] - rss
        answers = [rc.response(opaque) for opaque in sent]
    assert grown < 40_000, grown  # KiB: a few pages held, not 40 (about 120 MB)
    assert all(a.code == C.SUCCESS and len(decode_stored_messages(a.body)) == keys_limits.MAX_KEY_QUERY_RESULTS
               for a in answers)
