"""Transactions across a real crash between the journal's COMMIT and the log (README "Transactions").

The data dir is on ``tests/harness/fusefs.py``'s mount. The commit log's writes and fsyncs are *stalled*: a
COMMIT's journal record is written and fsynced, its messages are appended (into the page cache, through the
mmap) and the broker waits for the log's flush, which cannot reach the disk. Then either

* kill -9 only: the page cache survives, the appends reach the disk afterwards; on restart the COMMIT is in
  the journal and its messages already in the log: nothing may be appended twice; or
* a power cut, then kill -9: the disk holds the journal's COMMIT and none of the appends; on restart the
  commit is completed: every message appended once, with the id it had before the crash.

Also the journal's flush policies: ``commit`` fsyncs before PREPARE, COMMIT and ROLLBACK are answered (seen
as the disk's fsyncs, and each decision survives a power cut right after its answer); ``interval`` fsyncs
within ``SWEEP_INTERVAL_S``; ``os`` leaves it to the kernel (a power cut may lose the last decisions).
"""

import glob
import os
import signal

import pytest

from metaq.client.local import small_config
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.text import serialize
from tests.harness.broker import consume_all, wait_for
from tests.harness.fusefs import FaultMount
from tests.harness.tx import ok, tx

LOG = "/data/commitlog/"
JOURNAL = "/data/transactions/"
KEY = "TX:s1:1"
XID = "XID:1:0a01:b1:test-rm"


def tput(c, key, partition, body):
    assert ok(c.call(ev.Put("tx", partition, 0, body, c.opaque(), metaq_checksum(body), key))) == \
        b"-1 %d -1" % partition


def log_records(root, since):
    """(msg_id, payload) of the valid records from log position ``since`` on in the segment files under
    ``root`` (the store's own format and CRC check)."""
    from metaq.store.record import check_record, decode_record

    out = []
    for seg in sorted(glob.glob(os.path.join(root, "data", "commitlog", "[0-9]" * 20))):
        start = int(os.path.basename(seg))
        with open(seg, "rb") as f:
            data = f.read()
        pos = max(0, since - start)
        while pos < len(data):
            total = check_record(data, pos, len(data))
            if not total:
                break
            rec = decode_record(data, pos)
            out.append((rec.msg_id, rec.data))  # no attribute: data is the payload
            pos += total
    return out


def journaled_ids(root, key):
    """{payload: msg id} as the journal's COMMIT of ``key`` under ``root`` gave them (ids in ``apply_order``)."""
    from metaq.transactions import records as R
    from metaq.transactions.journal import scan_records

    puts, commit = [], None
    for path in sorted(glob.glob(os.path.join(root, "data", "transactions", "journal.*"))):
        with open(path, "rb") as f:
            found, _end, _why = scan_records(f.read())
        for _pos, payload in found:
            rec = R.decode(bytes(payload))
            if isinstance(rec, R.Put) and rec.key == key:
                puts.append(rec)
            elif isinstance(rec, R.Commit) and rec.key == key:
                commit = rec
    assert commit is not None, "no COMMIT of %s in the journal on the disk" % key
    return {bytes(puts[i].data): mid for i, mid in zip(R.apply_order(puts), commit.ids)}


def served(b):
    with b.client() as c:
        return {p: [(r.msg_id, r.payload) for r in consume_all(c, "tx", p)] for p in (0, 1)}


@pytest.mark.fault
@pytest.mark.root
@pytest.mark.parametrize("power_cut", [False, True], ids=["kill-9", "power-cut"])
def test_crash_between_the_journals_commit_and_the_log_completes_the_commit_exactly_once(broker_factory, tmp_path,
                                                                                       power_cut):
    fs = FaultMount(tmp_path, power=True, stall_prefix=LOG).start()
    b = None
    bodies = [b"tx-message-%d-" % i + b"m" * (50 * i) for i in range(6)]
    try:
        b = broker_factory(small_config(os.path.join(fs.mountpoint, "data"), store={"flush": "sync"}))
        with b.client() as c:
            before = [c.put_ok("tx", b"before-%d" % p, p) for p in (0, 1)]
            log_end = int(c.stats_dict()["log_end_position"])
            ok(tx(c, KEY, "BEGIN"))
            for i, body in enumerate(bodies):
                tput(c, KEY, i % 2, body)
            fs.set_fault("stall")
            c.send(serialize(ev.Transaction(KEY, "s1", "COMMIT_ONE_PHASE", c.opaque(), 0, None)))
            stall = wait_for(lambda: fs.stalls(LOG), 20, "the commit's log flush reached the stalled disk")[0]
            journal_syncs = [e for e in fs.syncs(JOURNAL) if e["t"] <= stall["t"]]
            assert journal_syncs, "the journal was not fsynced before the commit's appends were flushed"
            if power_cut:
                cut = fs.power_cut()  # the stalled writeback is dropped from now on
            # SIGKILL; a thread waiting on a page under (stalled) writeback leaves the kernel only once the
            # stall ends: the broker dies then, having run no more of its own code
            b.proc.send_signal(signal.SIGKILL)
            fs.set_fault("stall", on=False)
            b.proc.wait(30)
        if not power_cut:
            fs.syncfs()  # the killed broker's dirty pages reach the disk, as they would on their own
    finally:
        if fs.stall_flag:
            fs.set_fault("stall", on=False)
        if b is not None:
            b.kill()
        fs.stop()
    on_disk = log_records(fs.source, log_end)
    ids = journaled_ids(fs.source, KEY)  # the COMMIT is on the disk, with the ids the messages were given
    assert sorted(ids) == sorted(bodies)
    if power_cut:
        assert on_disk == [], "the cut should have left none of the appends"  # the test's premise
        assert cut["t"] > stall["t"]
    else:  # the premise: the appends reached the disk already, with the journaled ids
        assert sorted(on_disk) == sorted((mid, body) for body, mid in ids.items())
    b.config["broker"]["data_dir"] = os.path.join(fs.source, "data")
    b.start()
    got = served(b)  # at once: the completed commit is flushed before the broker serves (was: after its first
    # flush round, flush_interval_ms later, and after the journal's DONE record was already durable)
    for p in (0, 1):
        assert got[p][0] == (before[p][0], b"before-%d" % p)
        rest = got[p][1:]
        assert sorted(body for _, body in rest) == sorted(bodies[p::2])  # every message once, nothing else
        assert all(mid == ids[body] for mid, body in rest), (rest, ids)  # with the id it had before the crash
    with b.client() as c:
        assert ok(tx(c, "null", "RECOVER")) == b""
        r = tx(c, KEY, "COMMIT_ONE_PHASE")  # the commit is done: a retried COMMIT completes nothing
        assert r.code == 500, r
    log = b.log_text(since_start=True)
    print("\ncrash between journal COMMIT and log (%s): %d messages on the disk before the restart, %d served "
          "after it, ids kept; journal fsyncs before the stall: %d"
          % ("power cut" if power_cut else "kill -9", len(on_disk), sum(len(g) - 1 for g in got.values()),
             len(journal_syncs)))
    assert "recovery" in log


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
            tput(c, key, i % 2, b"%s-%d" % (key.encode(), i))
        c.send(b"transaction %s s1 END 0\r\n" % key.encode())  # no reply
        step("prepare", key, "PREPARE")
    ok(tx(c, KEY, "BEGIN"))
    for i in range(2):
        tput(c, KEY, i, b"local-%d" % i)
    step("commit", KEY, "COMMIT_ONE_PHASE")
    step("rollback", XID3, "ROLLBACK")
    return steps


XID3 = "XID:1:0a03:b1:test-rm"


@pytest.mark.fault
@pytest.mark.root
@pytest.mark.parametrize("policy", ["commit", "interval", "os"])
def test_journal_flush_policies_under_a_power_cut(broker_factory, tmp_path, policy):
    """``commit``: the journal is fsynced before each PREPARE, COMMIT and ROLLBACK is answered (the disk's fsync
    of the journal completes between the request and its answer) and every decision survives a power cut right
    after the last answer. ``interval``: fsynced within ``SWEEP_INTERVAL_S`` (waited for), then the decisions
    survive the cut. ``os``: no fsync before the answers; a cut right after them loses the decisions the kernel
    had not written back, and what the restarted broker holds is still whole (a commit is all or nothing)."""
    fs = FaultMount(tmp_path, power=True).start()
    b = None
    try:
        b = broker_factory(small_config(os.path.join(fs.mountpoint, "data"), store={"flush": "sync"},
                                        transactions={"journal_flush": policy}))
        with b.client() as c:
            steps = decide(c)
        journal_syncs = fs.syncs(JOURNAL)
        if policy == "commit":
            for what, sent, answered in steps:
                assert any(sent <= e["t0"] and e["t"] <= answered for e in journal_syncs), (what, journal_syncs)
        elif policy == "interval":
            wait_for(lambda: any(e["t0"] >= steps[-1][2] for e in fs.syncs(JOURNAL)), 10,
                     "the journal fsynced by the interval sweep after the last answer")
        else:
            assert not any(e["t0"] >= steps[0][1] for e in journal_syncs), journal_syncs
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
    if policy in ("commit", "interval"):
        assert in_doubt == [XID]  # prepared, kept; the rolled-back branch is gone
        assert local == [b"local-0", b"local-1"]
        with b.client() as c:  # and the prepared branch can still be decided
            ok(tx(c, XID, "COMMIT_TWO_PHASE"))
            assert sorted(p for part in served(b).values() for _, p in part) == sorted(
                local + [b"%s-%d" % (XID.encode(), i) for i in range(2)])
    else:
        assert set(in_doubt) <= {XID, XID3}
        assert len(local) in (0, 2)  # all or nothing
