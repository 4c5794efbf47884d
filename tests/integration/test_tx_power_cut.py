"""The transaction journal's flush policies under a real power cut (docs/operating.md "Transactions").

The data dir is on ``tests/harness/fusefs.py``'s mount; the journal is the commit log's ``%TX%``, so its
durability is the log's fsync. ``commit``: the log is fsynced before each PREPARE, COMMIT and ROLLBACK is answered
(seen as the disk's fsyncs of the log between the request and its answer) and every decision survives a power cut
right after the last answer. ``os``: the journal is left to the log's own flush policy (here ``async`` with a long
interval): no fsync before the answers, and a cut right after them may lose decisions, while what the restarted
broker holds is still whole (a commit is all or nothing).
"""

import os

import pytest

from metaq.client.local import small_config
from tests.harness.broker import consume_all
from tests.harness.fusefs import FaultMount
from tests.harness.tx import ok, tput, tx

LOG = "/data/commitlog/"
KEY = "TX:s1:1"
XID = "XID:1:0a01:b1:test-rm"


def served(b):
    with b.client() as c:
        return {p: [(r.msg_id, r.payload) for r in consume_all(c, "tx", p)] for p in (0, 1)}


def decide(c):
    """A prepared XA branch (2 messages), a committed local transaction (2) and a rolled-back XA branch (1);
    returns [(what, time the request was sent, time the answer was read)]."""
    import time

    steps = []

    def step(what, key, kind, timeout=0, qualifier=None):
        sent = time.time()
        ok(tx(c, key, kind, timeout, qualifier))
        steps.append((what, sent, time.time()))

    for key, n in ((XID, 2), (XID3, 1)):
        ok(tx(c, key, "BEGIN", 30, "test-rm"))
        for i in range(n):
            tput(c, key, "tx", i % 2, b"%s-%d" % (key.encode(), i))
        c.send(b"transaction %s s1 END 0\r\n" % key.encode())  # no reply
        step("prepare", key, "PREPARE")
    ok(tx(c, KEY, "BEGIN"))
    for i in range(2):
        tput(c, KEY, "tx", i, b"local-%d" % i)
    step("commit", KEY, "COMMIT_ONE_PHASE")
    step("rollback", XID3, "ROLLBACK")
    return steps


XID3 = "XID:1:0a03:b1:test-rm"


@pytest.mark.fault
@pytest.mark.root
@pytest.mark.parametrize("policy", ["commit", "os"])
def test_journal_flush_policies_under_a_power_cut(broker_factory, tmp_path, policy):
    """See the module docstring."""
    fs = FaultMount(tmp_path, power=True).start()
    b = None
    try:
        b = broker_factory(small_config(os.path.join(fs.mountpoint, "data"),
                                        store={"flush": "async", "flush_interval_ms": 600_000,
                                               "flush_every_messages": 1_000_000},
                                        transactions={"journal_flush": policy}))
        with b.client() as c:
            steps = decide(c)
        log_syncs = fs.syncs(LOG)
        if policy == "commit":
            for what, sent, answered in steps:
                assert any(sent <= e["t0"] and e["t"] <= answered for e in log_syncs), (what, log_syncs)
        else:
            assert not any(e["t0"] >= steps[0][1] for e in log_syncs), log_syncs
        fs.power_cut()
        b.kill()
    finally:
        if b is not None:
            b.kill()
        fs.stop()
    b.config["broker"]["data_dir"] = os.path.join(fs.source, "data")
    b.start()
    with b.client() as c:
        in_doubt = [k for k in ok(tx(c, "null", "RECOVER", 0, "test-rm")).decode().split("\r\n") if k]
        got = served(b)
    payloads = sorted(p for part in got.values() for _, p in part)
    local = [p for p in payloads if p.startswith(b"local-")]
    assert not any(p.startswith(XID.encode()) or p.startswith(XID3.encode()) for p in payloads)
    print("\njournal_flush %s: after a power cut right after the answers: in doubt %s, committed messages %d of 2"
          % (policy, in_doubt, len(local)))
    if policy == "commit":
        assert in_doubt == [XID]  # prepared, kept; the rolled-back branch is gone
        assert local == [b"local-0", b"local-1"]
        with b.client() as c:  # and the prepared branch can still be decided
            ok(tx(c, XID, "COMMIT_TWO_PHASE"))
            assert sorted(p for part in served(b).values() for _, p in part) == sorted(
                local + [b"%s-%d" % (XID.encode(), i) for i in range(2)])
    else:
        assert set(in_doubt) <= {XID, XID3}
        assert len(local) in (0, 2)  # all or nothing
