"""Crash, shutdown and corruption of a real broker process (fault-catalogue F1, F3)."""

import glob
import os
import random
import time

import pytest

from metaq.protocol import events as ev
from metaq.client.local import small_config
from tests.harness.broker import consume_all, wait_for
from tests.harness.load import check_acked_present, check_running, collect, start_load


def run_load_and_kill(broker, seconds, producers=3):
    threads = start_load(broker, producers)
    wait_for(lambda: all(t.acked or not t.is_alive() for t in threads), what="every producer acknowledged")
    time.sleep(seconds)  # then a random moment of the load
    with broker.client() as c:  # the load goes through the put-burst fast path (server/fastput.py)
        assert int(c.stats_dict()["burst_puts"]) > 0
    check_running(threads)
    broker.kill()
    return collect(threads)


@pytest.mark.fault
@pytest.mark.slow
def test_kill_9_under_pipelined_load_sync_mode_loses_no_acknowledged_message(broker_factory, tmp_path):
    b = broker_factory(small_config(tmp_path / "data", store={"flush": "sync"}))
    total = 0
    for _ in range(3):
        acked = run_load_and_kill(b, 0.5 + random.random() * 0.5)
        assert acked, "the load produced nothing before the kill"
        total += len(acked)
        b.start()
        assert "recovery scanned" in b.log_text(since_start=True)
        assert check_acked_present(b, acked) == 0
    # the next put lands right after the recovered end
    with b.client() as c:
        before = int(c.call(ev.Offset("t-a", "g", 0, 1 << 40, 1)).body)
        assert c.put_ok("t-a", b"after", 0)[2] == before
    assert total > 300


@pytest.mark.fault
@pytest.mark.slow
def test_kill_9_async_mode_serves_nothing_corrupt_and_loses_nothing(broker_factory, tmp_path):
    """README: in async mode a process crash loses nothing (the page cache survives); only an OS crash or power
    loss loses up to the flush window."""
    flush_every = 200
    b = broker_factory(small_config(tmp_path / "data", store={"flush": "async",
                                                              "flush_every_messages": flush_every,
                                                              "flush_interval_ms": 100}))
    for _ in range(2):
        acked = run_load_and_kill(b, 0.6)
        assert acked
        b.start()
        assert check_acked_present(b, acked) == 0  # and every served record passed its CRC check


@pytest.mark.fault
def test_sigterm_finishes_in_flight_requests_and_marks_a_clean_shutdown(broker):
    producers = start_load(broker, 2)
    wait_for(lambda: all(t.acked or not t.is_alive() for t in producers), what="every producer acknowledged")
    check_running(producers)
    assert broker.stop() == 0
    acked = collect(producers)
    log = broker.log_text()
    assert "broker stopped cleanly" in log
    assert os.path.exists(os.path.join(broker.data_dir, "clean_shutdown"))
    broker.start()
    assert "clean restart: recovery scan skipped" in broker.log_text(since_start=True)
    assert check_acked_present(broker, acked) == 0


def last_segment(data_dir):
    return sorted(glob.glob(os.path.join(data_dir, "commitlog", "*")))[-1]


@pytest.mark.fault
def test_torn_tail_is_cut_and_reported(broker):
    with broker.client() as c:
        for i in range(20):
            c.put_ok("test", b"rec-%02d-" % i + b"z" * 300, 0)
        end = int(c.stats_dict()["log_end_position"])
    broker.kill()
    seg = last_segment(broker.data_dir)
    seg_start = int(os.path.basename(seg))
    with open(seg, "r+b") as f:  # tear the last record: its last 100 bytes never reached the disk
        f.seek(end - seg_start - 100)
        f.write(b"\0" * 100)
    broker.start()
    log = broker.log_text(since_start=True)
    assert "cut a torn tail" in log and "1 records" in log
    with broker.client() as c:
        records = consume_all(c, "test", 0)
        assert [r.payload[:7] for r in records] == [b"rec-%02d-" % i for i in range(19)]
        assert c.put_ok("test", b"next", 0)[2] == 19


@pytest.mark.fault
def test_flipped_byte_mid_log_refuses_to_start_unless_forced(broker):
    with broker.client() as c:
        for i in range(20):
            c.put_ok("test", b"rec-%02d-" % i + b"z" * 300, 1)
    broker.kill()
    seg = last_segment(broker.data_dir)
    with open(seg, "r+b") as f:  # flip one bit in the payload of record 5
        where = f.read(1 << 20).index(b"rec-05-") + 50
        f.seek(where)
        byte = f.read(1)
        f.seek(where)
        f.write(bytes([byte[0] ^ 0x10]))
    broker.start(expect_ready=False)
    assert broker.wait_exit(30) == 1
    log = broker.log_text(since_start=True)
    assert "refusing to start" in log and os.path.basename(seg) in log and "--force-recovery" in log
    broker.extra_args = ["--force-recovery"]
    broker.start()
    with broker.client() as c:
        records = consume_all(c, "test", 1)
        assert 0 < len(records) < 20
        assert [r.payload[:7] for r in records] == [b"rec-%02d-" % i for i in range(len(records))]


def test_sigint_is_a_graceful_shutdown_too(broker):
    import signal

    with broker.client() as c:
        c.put_ok("test", b"kept", 0)
    broker.proc.send_signal(signal.SIGINT)
    assert broker.wait_exit(30) == 0
    assert "received SIGINT" in broker.log_text() and "broker stopped cleanly" in broker.log_text()
    broker.start()
    with broker.client() as c:
        [rec] = c.get_records("test", 0, 0)
        assert rec.payload == b"kept"
