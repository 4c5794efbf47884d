"""Flushes that fail under load (fault-catalogue F5): a real FUSE fault filesystem under a real broker.

The data dir is on ``tests/harness/fusefs.py``'s mount. Mid-load a fault flag appears: with ``eio`` data written
back is lost and the next fsync of each file reports EIO, once (Linux's page cache over a failing disk,
"fsyncgate"); with ``enospc`` every write to the commit log fails with ENOSPC, which the kernel reports at the next
fsync.
The broker must acknowledge nothing it could not flush, never retry the flush, refuse writes from then on
without dying, keep serving what it acknowledged, and after a restart on what the filesystem really holds
(SOURCE, without the mount) have every acknowledged message and take writes again.
"""

import os
import socket
import threading
import time

import pytest

from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.protocol.text import TextParser, serialize
from metaq.client.local import small_config
from tests.harness.broker import consume_all, wait_for
from tests.harness.fusefs import FaultMount

TOPIC, PARTITIONS = "t-eio", 4
DEPTH = 32  # puts in flight per connection


class RecordingProducer(threading.Thread):
    """Pipelines puts on one connection and records every reply in order: (key, payload, code, body, time)."""

    def __init__(self, port, pid):
        super().__init__(daemon=True)
        self.port, self.pid = port, pid
        self.replies = []
        self.sent = {}  # opaque -> (partition, payload)
        self.stop = threading.Event()
        self.error = None
        self.refusals = 0

    def payload(self, seq):
        head = b"p%d-s%d-" % (self.pid, seq)
        return head + bytes([97 + seq % 26]) * (100 + (seq * 37) % 1900)

    def acked(self):
        return [r for r in self.replies if r[2] == 200]

    def refused(self):
        return [r for r in self.replies if r[2] != 200]

    def run(self):
        parser, seq, pending = TextParser(max_body=1 << 20), 0, set()
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=20) as sock:
                while not self.stop.is_set() or pending:
                    frames = []
                    while len(pending) < DEPTH and not self.stop.is_set():
                        seq += 1
                        body, part = self.payload(seq), seq % PARTITIONS
                        self.sent[seq] = (part, body)
                        pending.add(seq)
                        frames.append(serialize(ev.Put(TOPIC, part, 0, body, seq, metaq_checksum(body))))
                    if frames:
                        sock.sendall(b"".join(frames))
                    event = parser.next_event()
                    while event is NEED_DATA:
                        parser.receive_data(sock.recv(1 << 16))
                        event = parser.next_event()
                    if event is CLOSED:
                        raise AssertionError("the broker closed the connection")
                    pending.discard(event.opaque)
                    part, body = self.sent[event.opaque]
                    self.replies.append((event.opaque, part, event.code, bytes(event.body), time.time()))
                    if event.code != 200:
                        self.refusals += 1
        except Exception as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def offsets_of(replies):
    """{(partition, offset): opaque} of the acknowledged replies."""
    out = {}
    for opaque, _part, code, body, _t in replies:
        if code == 200:
            _mid, part, offset = (int(x) for x in body.split())
            out[(part, offset)] = opaque
    return out


def check_acked_present(client, producers):
    """Every acknowledged put is at its offset with its payload; returns (records per partition, lost)."""
    records = {p: consume_all(client, TOPIC, p) for p in range(PARTITIONS)}  # checksums verified while read
    lost = 0
    for prod in producers:
        for (part, offset), opaque in offsets_of(prod.replies).items():
            if offset >= len(records[part]):
                lost += 1
            else:
                assert records[part][offset].payload == prod.sent[opaque][1], (part, offset)
    return records, lost


def run_into_the_fault(b, fs, fault):
    """Pipelined puts from two connections; the fault switched on mid-load; returns (producers, t_flag)."""
    producers = [RecordingProducer(b.port, i) for i in range(2)]
    for p in producers:
        p.start()
    wait_for(lambda: all(len(p.acked()) >= 300 for p in producers), 20, "300 acks per producer before the fault")
    t_flag = fs.set_fault(fault)
    wait_for(lambda: all(p.refusals >= 50 for p in producers), 15,
             lambda: "50 refused puts per producer after the %s; acks since: %d"
             % (fault, sum(1 for p in producers for r in p.acked() if r[4] > t_flag)))
    for p in producers:
        p.stop.set()
        p.join(20)
        assert not p.is_alive() and p.error is None, p.error
    return producers, t_flag


def check_replies(producers, reason):
    """(b): per connection, nothing acknowledged after the first failure; the failures say why.

    Returns (acks after the first failed flush, time.time() of the first refusal).
    """
    acks_after_failure, first_refusals = 0, []
    for p in producers:
        codes = [r[2] for r in p.replies]
        first_bad = next(i for i, code in enumerate(codes) if code != 200)
        first_refusals.append(p.replies[first_bad])
        acks_after_failure += sum(1 for code in codes[first_bad:] if code == 200)
    assert acks_after_failure == 0
    refused = [r for p in producers for r in p.refused()]
    bodies = sorted({r[3] for r in refused})
    flush_failures = [r for r in refused if r[2] == 500]  # the puts the failed flush covered
    assert flush_failures and all(b"flush failed" in r[3] and reason in r[3] for r in flush_failures), bodies[:3]
    refusals = [r for r in refused if r[2] != 500]  # the puts after it
    assert refusals and all(r[2] == 503 and b"refused after a failed flush" in r[3] and b"restart the broker" in r[3]
                            for r in refusals), bodies[:3]
    return acks_after_failure, min(r[4] for r in first_refusals)


@pytest.mark.fault
@pytest.mark.root
@pytest.mark.parametrize("fault, reason", [("eio", b"Input/output error"), ("enospc", b"No space left on device")])
def test_failed_flush_acks_nothing_more_refuses_writes_and_loses_nothing_acked(broker_factory, tmp_path, fault,
                                                                                reason):
    fs = FaultMount(tmp_path).start()  # fails (does not skip) where FUSE cannot be mounted
    b = None
    try:
        # 4 MiB segments: no roll during the run (tests/store/test_flush_thread.py covers a roll's directory fsync)
        b = broker_factory(small_config(os.path.join(fs.mountpoint, "data"),
                                        store={"flush": "sync", "segment_size": 4 << 20}))
        with b.client() as c:
            c.put_ok(TOPIC, b"before the load", 0)
        producers, t_flag = run_into_the_fault(b, fs, fault)
        faults = [e for e in fs.events() if e["fault"] == fault]
        assert faults, "the filesystem injected no %s" % fault
        acks_after_failure, t_refusal = check_replies(producers, reason)

        # (c) the broker stays up, says why it refuses writes, and serves what it acknowledged
        assert b.proc.poll() is None
        with b.client() as c:
            assert c.stats_dict()["writes_refused"] == "true"
            r = c.put(TOPIC, b"refused", 1)
            assert r.code == 503 and b"failed flush" in r.body, r
            assert check_acked_present(c, producers)[1] == 0
        log = b.log_text()
        assert "CRITICAL" in log and log.count("flush failed; refusing further writes") == 1  # no retry
        failed_segment_fsyncs = [e for e in faults if e["op"] == "fsync" and e["path"].startswith("/data/commitlog/")]
        assert len(failed_segment_fsyncs) <= 1, faults  # nor a retry hidden in the shutdown below
        assert b.stop() == 1  # SIGTERM: no flush retried, no checkpoint, exit status 1
        assert "broker stopped after a failed flush" in b.log_text()
    finally:
        if b is not None:
            b.kill()
        fs.stop()

    # (a)+(d): restart on what the filesystem really holds (SOURCE, no FUSE): every ack is there, writes work
    assert not os.path.exists(os.path.join(fs.source, "data", "clean_shutdown"))
    b.config["broker"]["data_dir"] = os.path.join(fs.source, "data")
    b.start()
    assert "recovery scanned" in b.log_text(since_start=True)
    with b.client() as c:
        assert c.stats_dict()["writes_refused"] == "false"
        records, lost = check_acked_present(c, producers)
        assert lost == 0, "%d acknowledged puts are not on the disk" % lost
        sent = {body for p in producers for _part, body in p.sent.values()} | {b"before the load"}
        assert all(rec.payload in sent for recs in records.values() for rec in recs)  # no phantom record
        for part in range(PARTITIONS):
            assert c.put_ok(TOPIC, b"after the restart", part)[2] == len(records[part])
    acked = sum(len(p.acked()) for p in producers) + 1
    present = sum(len(recs) for recs in records.values())
    print("\nF5 %s: %d acked, %d acks after the first failed flush, 0 acked lost; first fault %.1f ms and first "
          "refusal %.1f ms after the flag; %d unacked puts present after the restart; faults: %s"
          % (fault, acked, acks_after_failure, (faults[0]["t"] - t_flag) * 1000, (t_refusal - t_flag) * 1000,
             present - acked, ", ".join("%s %s" % (e["op"], e["path"]) for e in faults[:4])))
