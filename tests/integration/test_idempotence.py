"""Issue 18 point 4 with real brokers: put_idem stores a message once across resends, kill -9, restarts and a
failover to a slave, and the idempotent Producer keeps every message exactly once through a broker restart."""

import os
import socket
import threading
import time

import pytest

from metaq import admincli as admin
from metaq.client import Message, Producer
from metaq.client.local import free_port, small_config
from metaq.protocol import events as ev
from metaq.idempotence.wire import IdempotentPut
from metaq.protocol.checksum import metaq_checksum
from metaq.timers.levels import SCHEDULE_TOPIC
from metaq.idempotence.records import identity_in_attribute
from metaq.protocol.message import decode_payload, encode_payload
from metaq.protocol.properties import split_attribute
from metaq.protocol.text import serialize
from tests.harness.broker import consume_all, url_of, wait_for
from tests.harness.replication import caught_up, master_config, stats

PID = 77


def idem(topic, partition, body, seq, pid=PID, attribute=None, opaque=1):
    flag, data = encode_payload(body, attribute)
    return IdempotentPut(topic, partition, flag, data, opaque, metaq_checksum(data), pid, seq)


def reply_of(c, event):
    """``(code, tokens)`` of the broker's answer to ``event``."""
    r = c.call(event)
    assert isinstance(r, ev.Result), r
    return r.code, r.body.decode("utf-8", "replace").split()


def user_view(records):
    """``[(attribute as the client shows it, payload, identity)]``."""
    out = []
    for rec in records:
        attribute, payload = decode_payload(rec.flag, rec.data)
        out.append((split_attribute(attribute)[0], payload, identity_in_attribute(attribute)))
    return out


def fixed_port_config(workdir, **sections):
    cfg = small_config(os.path.join(str(workdir), "data"), **sections)
    cfg["broker"]["port"] = free_port()
    return cfg


def test_a_resend_is_answered_with_the_original_and_stored_once(broker):
    with broker.client() as c:
        code, first = reply_of(c, idem("t-idem", 1, b"hello", 0, attribute="color=red"))
        assert code == 200 and len(first) == 3
        code, again = reply_of(c, idem("t-idem", 1, b"hello", 0, attribute="color=red"))
        assert code == 200 and again == first + ["dup"]
        # two copies pipelined in one write (a resend racing its original): one record
        c.send(serialize(idem("t-idem", 1, b"second", 1, opaque=5)) + serialize(idem("t-idem", 1, b"second", 1,
                                                                                      opaque=6)))
        a, b = c.read_event(), c.read_event()
        assert a.body.split()[:3] == b.body.split()[:3] and b.body.endswith(b" dup")
        assert user_view(consume_all(c, "t-idem", 1)) == [("color=red", b"hello", (PID, 0)),
                                                         (None, b"second", (PID, 1))]
        s = c.stats_dict()
        assert (s["idempotent_puts"], s["idempotent_duplicates"], s["idempotent_producers"]) == ("2", "2", "1")


def test_bad_put_idem_is_refused_and_nothing_stored(broker):
    with broker.client() as c:
        flag, data = encode_payload(b"x", None)
        code, words = reply_of(c, IdempotentPut("t-idem", 0, flag, data, 1, metaq_checksum(data) ^ 1, PID, 0))
        assert code == 400 and "Checksum failure" in " ".join(words)
        c.send(b"put_idem t-idem -1 1 0 -1 5 0 9\r\nx")
        r = c.read_event()
        assert r.code == 400 and b"invalid partition '-1'" in r.body
        code, words = reply_of(c, idem("t-idem", 9, b"x", 0))  # the topic has 4 partitions
        assert code == 400
        flag, data = encode_payload(b"x", "a\x02METAQ_PID\x015\x02METAQ_SEQ\x010\x02")  # forged on a plain put
        r = c.call(ev.Put("t-idem", 0, flag, data, 3, metaq_checksum(data)))
        assert r.code == 400 and b"reserved properties" in r.body
        for partition in range(4):
            assert consume_all(c, "t-idem", partition) == []


def test_a_sequence_older_than_the_window_is_a_duplicate_with_its_offset_unknown(broker):
    with broker.client() as c:
        window = 1024
        payload = b"".join(serialize(idem("t-old", 0, b"", seq, opaque=seq)) for seq in range(window + 1))
        c.send(payload)
        for _ in range(window + 1):
            assert c.read_event().code == 200
        code, words = reply_of(c, idem("t-old", 0, b"", 0))
        assert code == 200 and words[2:] == ["-1", "dup"], words  # stored long ago: its offset no longer known
        assert c.stats_dict()["idempotent_older_duplicates"] == "1"
        assert len(consume_all(c, "t-old", 0)) == window + 1


@pytest.mark.fault
def test_kill_between_the_write_and_the_ack_then_resend(broker_factory, tmp_path):
    """The snapshot (written at the checkpoints, every 10 min here) is older than the record: the window comes
    back from the log's replay."""
    b = broker_factory(fixed_port_config(tmp_path / "b", store={"checkpoint_interval_ms": 600000}),
                       workdir=tmp_path / "b")
    with b.client() as c:
        reply_of(c, idem("t-k", 2, b"before", 0))
    sock = socket.create_connection(("127.0.0.1", b.port))
    sock.sendall(serialize(idem("t-k", 2, b"the one", 1)))
    with b.client() as c:  # the put has been handled once the partition shows it
        wait_for(lambda: len(consume_all(c, "t-k", 2)) == 2, 10, "the put stored")
    b.kill()  # its reply is never read
    sock.close()
    b.start()
    with b.client() as c:
        code, words = reply_of(c, idem("t-k", 2, b"the one", 1))
        assert code == 200 and words[2:] == ["1", "dup"]
        assert [p for _a, p, _i in user_view(consume_all(c, "t-k", 2))] == [b"before", b"the one"]


@pytest.mark.fault
def test_restart_then_an_old_sequence_is_a_duplicate(broker_factory, tmp_path):
    b = broker_factory(fixed_port_config(tmp_path / "b"), workdir=tmp_path / "b")
    with b.client() as c:
        first = [reply_of(c, idem("t-r", 0, b"m%d" % seq, seq))[1] for seq in range(20)]
    b.stop()
    b.start()
    with b.client() as c:
        assert reply_of(c, idem("t-r", 0, b"m5", 5))[1] == first[5] + ["dup"]
        assert reply_of(c, idem("t-r", 0, b"m20", 20))[1][2] == "20"
    b.kill()
    b.start()
    with b.client() as c:
        assert reply_of(c, idem("t-r", 0, b"m20", 20))[1][2:] == ["20", "dup"]
        assert len(consume_all(c, "t-r", 0)) == 21
        assert c.stats_dict()["idempotent_producers"] == "1"


@pytest.mark.fault
def test_failover_to_the_slave_answers_the_duplicate(broker_factory, tmp_path, capsys):
    rport = free_port()
    m = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                       extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    with m.client() as c:
        replies = [reply_of(c, idem("t-f", 3, b"f%d" % seq, seq, attribute="a"))[1] for seq in range(10)]
    caught_up(m, s)
    m.kill()
    wait_for(lambda: stats(s)["replication_link"] == "down", 10, "the slave sees the master gone")
    assert admin.main(["promote", "127.0.0.1:%d" % s.port]) == admin.EXIT_OK, capsys.readouterr().err
    with s.client() as c:
        assert reply_of(c, idem("t-f", 3, b"f7", 7, attribute="a"))[1] == replies[7] + ["dup"]
        assert reply_of(c, idem("t-f", 3, b"f10", 10, attribute="a"))[1][2] == "10"
        assert [(a, p) for a, p, _i in user_view(consume_all(c, "t-f", 3))] == \
            [("a", b"f%d" % i) for i in range(11)]


@pytest.mark.fault
@pytest.mark.slow
def test_idempotent_producer_through_a_kill_and_restart(broker_factory, tmp_path):
    """10,000 pipelined sends; the broker is killed and restarted mid-way; every message is stored exactly once."""
    b = broker_factory(fixed_port_config(tmp_path / "b"), workdir=tmp_path / "b")
    n = 10_000
    results = [None] * n
    done = threading.Semaphore(0)
    acked = [0]

    def on_result(i):
        def cb(r):
            results[i] = r
            acked[0] += 1
            done.release()
        return cb

    with Producer(brokers=[url_of(b)], idempotent=True, retry_deadline=60.0, send_timeout=2.0,
                  suspect_time=0.2) as p:
        def send_all():
            for i in range(n):
                p.send_async(Message("t-p", b"message %d" % i, attribute="n=%d" % i), callback=on_result(i))

        sender = threading.Thread(target=send_all)
        sender.start()
        wait_for(lambda: acked[0] >= 3000, 60, "3000 sends acknowledged")
        b.kill()
        time.sleep(0.5)
        b.start()
        sender.join(120)
        assert p.flush(120)
    assert all(r is not None and r.success for r in results), [r for r in results if not r or not r.success][:3]
    seen = {}
    with b.client() as c:
        for partition in range(4):
            for attribute, payload, ident in user_view(consume_all(c, "t-p", partition)):
                i = int(payload.split()[1])
                assert attribute == "n=%d" % i and payload == b"message %d" % i and ident[0] == p.producer_id
                seen[i] = seen.get(i, 0) + 1
                assert results[i].partition.partition == partition
    assert sorted(seen) == list(range(n)) and set(seen.values()) == {1}
    print("duplicates answered: %d" % sum(1 for r in results if r.duplicate))



def _scripted_frames():
    """put_idem frames of every kind (new, duplicate, gap, bad ones) mixed with plain puts, as one pipeline."""
    out = [serialize(idem("t-fast", 0, b"m%d" % seq, seq, opaque=seq)) for seq in range(5)]
    out.append(serialize(idem("t-fast", 0, b"m2", 2, opaque=50)))  # a duplicate inside the burst
    out.append(serialize(idem("t-fast", 0, b"m7", 7, opaque=51)))  # skips 5 and 6
    out.append(serialize(idem("t-fast", 0, b"m5", 5, opaque=52)))  # the gap: stored
    out.append(serialize(idem("t-fast", 9, b"x", 0, opaque=53)))  # no such partition: 400
    out.append(serialize(IdempotentPut("t-fast", 1, 0, b"crc", 54, metaq_checksum(b"crc") ^ 1, PID, 0)))
    out.append(serialize(idem(SCHEDULE_TOPIC, 0, b"x", 0, opaque=55)))  # the delay scheduler's topic
    out.append(serialize(ev.Put("t-fast", 1, 0, b"plain", 56, metaq_checksum(b"plain"))))
    out.append(serialize(idem("t-fast", 1, b"n0", 0, opaque=57)).replace(b"\r\n", b"\n", 1))  # bare LF
    out.append(serialize(idem("t-fast", 1, b"n0", 0, opaque=58)))
    return b"".join(out), len(out)


def _replies(b, data, count):
    with b.client() as c:
        c.send(data)
        got = []
        for _ in range(count):
            r = c.read_event()
            tokens = r.body.split()
            got.append((r.code, r.opaque, tokens[1:] if r.code == 200 else r.body))  # message ids are clock-based
        stored = {p: [(rec.payload, rec.attribute) for rec in consume_all(c, "t-fast", p)] for p in (0, 1)}
        s = c.stats_dict()
        counters = {k: v for k, v in s.items() if k.startswith("idempotent_") or k in ("cmd_put", "put_failed")}
    return got, stored, counters


def test_the_burst_path_answers_as_the_general_path(broker_factory, tmp_path):
    data, count = _scripted_frames()
    fast = broker_factory(small_config(os.path.join(str(tmp_path / "f"), "data")), workdir=tmp_path / "f")
    general = broker_factory(small_config(os.path.join(str(tmp_path / "g"), "data"), broker={"burst_puts": False}),
                             workdir=tmp_path / "g")
    got_fast, got_general = _replies(fast, data, count), _replies(general, data, count)
    assert got_fast == got_general
    replies, stored, counters = got_fast
    assert [r[0] for r in replies] == [200] * 8 + [400, 400, 400, 200, 200, 200]
    assert replies[5][2] == [b"0", b"2", b"dup"] and replies[13][2] == [b"1", b"1", b"dup"]
    assert [p for p, _a in stored[0]] == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m7", b"m5"]
    assert counters["idempotent_puts"] == "8" and counters["idempotent_duplicates"] == "2"
    with fast.client() as c:
        assert int(c.stats_dict()["burst_puts"]) >= 5  # the fast broker did take the put_idem burst
