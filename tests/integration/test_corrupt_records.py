"""Issue 15 point 6, against a real broker: one flipped payload byte in an old segment, before the checkpoint.

Each test puts 40 messages of 32 KiB (two 1 MiB segments), stops the broker cleanly (so the restart skips the
recovery scan, as it would after any clean stop), flips one byte of message 5's payload in the first segment
file, restarts, and checks what a user would see: the get, the stats, the metaq client with and without
``skip_corrupt``, a RocketMQ pull, and ``metaq-server --verify``. The old broker served the damaged record.
"""

import glob
import logging
import os
import subprocess
import sys
import threading

import pytest

from metaq import errors
from metaq.client.consumer import Consumer
from metaq.client.local import rmq_config
from metaq.client.raw import RemotingClient
from metaq.protocol import events as ev
from metaq.protocol.message import iter_records
from metaq.protocol.rocketmq.bodies import decode_stored_messages
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from tests.harness.broker import url_of, wait_for
from tests.harness.rocketmq import pull

TOPIC, PARTITION, BAD, COUNT = "test", 0, 5, 40


def payload(i):
    return b"rec-%02d-" % i + bytes([97 + i % 26]) * (32 * 1024)


def flip_payload_byte(data_dir, i):
    """Flip one byte in the middle of message ``i``'s payload, in the segment file; returns the segment's name."""
    for seg in sorted(glob.glob(os.path.join(data_dir, "commitlog", "*"))):
        with open(seg, "r+b") as f:
            data = f.read()
            at = data.find(b"rec-%02d-" % i)
            if at < 0:
                continue
            where = at + 1000
            f.seek(where)
            f.write(bytes([data[where] ^ 0x04]))
            return os.path.basename(seg)
    raise AssertionError("message %d not found in any segment" % i)


@pytest.fixture
def corrupted(broker_factory, tmp_path):
    """A broker (text and remoting ports) restarted over a log whose message 5 has one flipped payload byte."""
    wd = tmp_path / "b"
    broker = broker_factory(rmq_config(wd / "data"), workdir=wd)
    with broker.client() as c:
        for i in range(COUNT):
            assert c.put_ok(TOPIC, payload(i), PARTITION)[2] == i
        assert int(c.stats_dict()["log_end_position"]) > 1 << 20  # a second segment: the first one is old
    assert broker.stop() == 0
    broker.segment = flip_payload_byte(broker.data_dir, BAD)
    assert broker.segment == "%020d" % 0
    broker.start()
    return broker


def records(reply):
    assert isinstance(reply, ev.Value), reply
    return [rec for rec, _end in iter_records(reply.body)]


def read_to_end(c, offset):
    """Every record from ``offset`` to the partition's end (a get carries at most max_transfer_size)."""
    out = []
    while True:
        reply = c.get(TOPIC, PARTITION, offset + len(out), 8 << 20)
        if isinstance(reply, ev.Result) and reply.code == 404:
            return out
        out.extend(records(reply))


def test_a_get_serves_the_records_before_it_then_answers_512_naming_it(corrupted):
    with corrupted.client() as c:
        before = records(c.get(TOPIC, PARTITION, 0, 8 << 20))
        assert [r.data[:7] for r in before] == [b"rec-%02d-" % i for i in range(BAD)]  # 0..4, intact
        bad = c.get(TOPIC, PARTITION, BAD)
        assert isinstance(bad, ev.Result) and bad.code == 512
        text = bad.body.decode()
        assert "topic test partition 0 offset 5" in text and "next offset 6" in text, text
        after = read_to_end(c, BAD + 1)
        assert [r.data for r in after] == [payload(i) for i in range(BAD + 1, COUNT)]
        assert c.stats_dict()["corrupt_reads"] == "1"
        assert records(c.get(TOPIC, PARTITION, 3, 8 << 20))[-1].data == payload(4)  # still stops before it
        assert c.get(TOPIC, PARTITION, BAD).code == 512
        assert c.stats_dict()["corrupt_reads"] == "2"
    log = corrupted.log_text(since_start=True)
    assert log.count("corrupt record: topic test partition 0 offset 5") == 1  # logged once, counted each time


def test_the_client_raises_a_clear_error_without_the_option(corrupted):
    with Consumer("grp", brokers=[url_of(corrupted)]) as consumer:
        assert len(consumer.fetch(TOPIC, "7-0", 0, max_size=8 << 20)) == BAD
        with pytest.raises(errors.CorruptRecord) as info:
            consumer.fetch(TOPIC, "7-0", BAD)
    exc = info.value
    assert (exc.topic, exc.partition, exc.offset, exc.next_offset) == (TOPIC, PARTITION, BAD, BAD + 1)
    assert "partition 0 offset 5" in str(exc)


def test_the_client_with_skip_corrupt_logs_it_and_reads_every_later_message(corrupted, caplog, tmp_path):
    caplog.set_level(logging.WARNING, logger="metaq.client")
    with Consumer("grp", brokers=[url_of(corrupted)], skip_corrupt=True) as consumer:
        msgs = consumer.fetch(TOPIC, "7-0", BAD, max_size=8 << 20)
        assert msgs and [m.offset for m in msgs] == list(range(BAD + 1, BAD + 1 + len(msgs)))
        assert [m.body for m in msgs] == [payload(m.offset) for m in msgs]
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("topic test partition 0 offset 5" in line and "skipping corrupt record" in line for line in lines)

    caplog.clear()
    got, done = [], threading.Event()

    def handler(message):
        got.append(message.offset)
        if message.offset == COUNT - 1:
            done.set()

    consumer = Consumer("subscriber", brokers=[url_of(corrupted)], skip_corrupt=True, long_poll_ms=500,
                        max_size=8 << 20, recover_dir=str(tmp_path / "recover"))
    with consumer.subscribe(TOPIC, handler).start():
        assert done.wait(30), got
    assert [o for o in got] == [o for o in range(COUNT) if o != BAD]
    assert any("offset 5" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_a_remoting_pull_answers_system_error_naming_it(corrupted):
    with RemotingClient(corrupted.config["remoting"]["port"]) as rc:
        first = pull(rc, TOPIC, PARTITION, 0, max_nums=32)
        assert first.code == C.SUCCESS
        assert [m.body[:7] for m in decode_stored_messages(first.body)] == [b"rec-%02d-" % i for i in range(BAD)]
        bad = pull(rc, TOPIC, PARTITION, BAD)
        assert bad.code == C.SYSTEM_ERROR
        assert "CORRUPT_RECORD" in bad.remark and "topic test partition 0 offset 5" in bad.remark, bad.remark
        assert int(bad.ext_fields["nextBeginOffset"]) == BAD + 1
        after = pull(rc, TOPIC, PARTITION, BAD + 1, max_nums=32)
        assert after.code == C.SUCCESS and decode_stored_messages(after.body)[0].body == payload(BAD + 1)
    with corrupted.client() as c:
        assert c.stats_dict()["corrupt_reads"] == "1"


def verify(broker):
    return subprocess.run([sys.executable, "-m", "metaq.server", "-c", broker.config_path, "--verify"],
                          capture_output=True, text=True, timeout=120, cwd=str(broker.workdir))


def test_verify_finds_it_and_refuses_a_running_broker(corrupted):
    running = verify(corrupted)
    assert running.returncode == 2 and "in use" in running.stderr, running
    assert corrupted.stop() == 0
    found = verify(corrupted)
    assert found.returncode == 1, found
    lines = found.stdout.splitlines()
    corrupt = [line for line in lines if line.startswith("corrupt:")]
    assert len(corrupt) == 1, found.stdout
    assert corrupted.segment in corrupt[0] and "topic test partition 0 offset 5" in corrupt[0]
    assert "CRC mismatch" in corrupt[0]
    assert "%d records" % (COUNT - 1) in lines[-1] and "1 corrupt" in lines[-1]


def test_verify_exits_zero_on_a_clean_log(broker):
    with broker.client() as c:
        for i in range(COUNT):
            c.put_ok(TOPIC, payload(i), i % 2)
    assert broker.stop() == 0
    clean = verify(broker)
    assert clean.returncode == 0, clean
    assert "%d records" % COUNT in clean.stdout and "0 corrupt" in clean.stdout
    assert not [line for line in clean.stdout.splitlines() if line.startswith("corrupt:")]


def test_the_replication_master_ships_everything_before_it_and_not_it(broker_factory, tmp_path):
    from metaq.client.local import free_port, small_config
    from tests.harness.replication import master_config

    rport = free_port()
    master = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    with master.client() as c:
        for i in range(COUNT):
            c.put_ok(TOPIC, payload(i), PARTITION)
    assert master.stop() == 0
    flip_payload_byte(master.data_dir, BAD)
    master.start()
    wd = tmp_path / "s"
    slave = broker_factory(small_config(wd / "data"), workdir=wd,
                           extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    wait_for(lambda: "corrupt record: topic test partition 0 offset 5" in slave.log_text(), 20,
             lambda: "the slave hears why the link ended:\n" + slave.log_text())
    assert "cannot copy past commit-log position" in master.log_text(since_start=True)
    with slave.client() as c:
        got = read_to_end(c, 0)
        assert [r.data for r in got] == [payload(i) for i in range(BAD)]  # everything before it, intact
        assert c.stats_dict()["replication_link"] == "down"


def test_a_corrupt_delayed_entry_is_dropped_with_a_log_line_and_the_others_are_delivered(broker_factory, tmp_path):
    from tests.harness.delay import delay_stats, put_delayed_ok

    wd = tmp_path / "d"
    broker = broker_factory(rmq_config(wd / "data", delay={"levels": "1s 2s 8s"}), workdir=wd)
    with broker.client() as c:
        ids = [put_delayed_ok(c, "t-later", b"delayed-%02d-" % i + b"q" * 200, 3)[0] for i in range(3)]
    assert broker.stop() == 0  # long before they are due
    flip_payload_byte_of(broker.data_dir, b"delayed-01-")
    broker.start()

    def delivered():
        with broker.client() as c:
            got = read_to_end_of(c, "t-later", 0)
        return got if len(got) >= 2 else None
    got = wait_for(delivered, 30, "the two intact delayed messages")
    assert [r.msg_id for r in got] == [ids[0], ids[2]]
    assert "level 3 entry 1 is corrupt and is dropped" in broker.log_text(since_start=True)
    with broker.client() as c:
        assert delay_stats(c)[1]["dropped"] == 1
        assert int(c.stats_dict()["corrupt_reads"]) >= 1


def flip_payload_byte_of(data_dir, marker):
    for seg in sorted(glob.glob(os.path.join(data_dir, "commitlog", "*"))):
        with open(seg, "r+b") as f:
            data = f.read()
            at = data.find(marker)
            if at >= 0:
                f.seek(at + 100)
                f.write(bytes([data[at + 100] ^ 0x01]))
                return
    raise AssertionError("%r not found" % marker)


def read_to_end_of(c, topic, partition):
    out = []
    while True:
        reply = c.get(topic, partition, len(out), 8 << 20)
        if isinstance(reply, ev.Result):
            return out
        out.extend(records(reply))
