"""Issue 41 point 5 with real brokers: a ``sync`` master that no slave could confirm a put for refuses it before
writing it (503 "nothing was stored"), by every put path; the log is unchanged, and a retry once the slave is
back stores each message exactly once. (Before, each put was written and then answered 503
SLAVE_NOT_AVAILABLE: a retrying client stored copies.)"""

import os
import signal

import pytest

from metaq.client.local import free_port, small_config
from metaq.client.raw import RemotingClient
from metaq.idempotence.wire import IdempotentPut
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.rocketmq.remoting import ResponseCode as C
from metaq.protocol.text import serialize
from tests.harness.broker import wait_for
from tests.harness.http import request, with_http
from tests.harness.replication import caught_up, master_config, stats, sync_pair
from tests.harness.rocketmq import send_v1

pytestmark = [pytest.mark.fault]

NOTHING = b"nothing was stored"


def idem(c, body, seq):
    return c.call(IdempotentPut("t-a", 0, 0, body, c.opaque(), metaq_checksum(body), 77, seq))


def bodies(broker, topic, partition):
    """Every body of the partition, in offset order."""
    with broker.client() as c:
        return [r.data for r in c.get_records(topic, partition, 0, 1 << 22)]


def test_a_sync_master_without_a_slave_stores_nothing_and_a_retry_stores_once(broker_factory, tmp_path):
    rport = free_port()
    cfg = with_http(master_config(tmp_path / "m", rport, mode="sync", sync_timeout_ms=3000))
    cfg["remoting"] = {"port": free_port()}
    master = broker_factory(cfg, workdir=tmp_path / "m")
    slave = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                           extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    wait_for(lambda: stats(master)["replication_slaves"] == "1", 10, "slave connected")
    with master.client() as c:
        c.put_ok("t-a", b"first", partition=0)
    slave.stop()
    wait_for(lambda: stats(master)["replication_slaves"] == "0", 10, "slave gone")
    before = stats(master)
    with master.client() as c:
        for _ in range(3):  # a client retrying while no slave is there
            r = c.put("t-a", b"plain", 0)
            assert r.code == 503 and b"SLAVE_NOT_AVAILABLE" in r.body and NOTHING in r.body, r
        r = idem(c, b"idempotent", 0)
        assert r.code == 503 and NOTHING in r.body, r
        for i in range(5):  # a pipelined run (the burst path) is refused the same way, each put
            body = b"burst-%d" % i
            c.send(serialize(ev.Put("t-a", 0, 0, body, c.opaque(), metaq_checksum(body))))
        for _ in range(5):
            r = c.read_event()
            assert r.code == 503 and NOTHING in r.body, r
    r = request(master, "POST", "/api/topics/t-a/messages?partition=0", body=b"over http")
    assert r.status == 503 and "nothing was stored" in r.text, r
    with RemotingClient(cfg["remoting"]["port"]) as rc:
        r = send_v1(rc, "t-a", b"rocketmq", queue=0)
        assert r.code == C.SERVICE_NOT_AVAILABLE and "nothing was stored" in r.remark, r
    after = stats(master)
    for key in ("log_end_position", "total_messages"):
        assert after[key] == before[key], key
    assert bodies(master, "t-a", 0) == [b"first"]

    slave.start()
    wait_for(lambda: stats(master)["replication_slaves"] == "1", 10, "slave back")
    caught_up(master, slave)
    with master.client() as c:  # the retries, once the slave is back: each stored once
        c.put_ok("t-a", b"plain", partition=0)
        r = idem(c, b"idempotent", 0)
        assert r.code == 200 and not r.body.endswith(b" dup"), r
    assert request(master, "POST", "/api/topics/t-a/messages?partition=0", body=b"over http").status == 200
    stored = bodies(master, "t-a", 0)
    assert len(stored) == 4 and stored[2].endswith(b"idempotent"), stored  # (its record carries its identity)
    assert [stored[0], stored[1], stored[3]] == [b"first", b"plain", b"over http"]
    caught_up(master, slave)
    assert bodies(slave, "t-a", 0) == bodies(master, "t-a", 0)


def test_a_slave_lost_while_a_put_waits_keeps_the_stored_but_unconfirmed_answer(broker_factory, tmp_path):
    """The remaining race: the put was written while a slave was there; the slave dies before confirming it. The
    answer says it was written (it is in the log), unlike the refusal before writing."""
    master, slave = sync_pair(broker_factory, tmp_path, sync_timeout_ms=20_000)
    with master.client() as c:
        c.put_ok("t-a", b"first", partition=0)
        slave.proc.send_signal(signal.SIGSTOP)  # connected, silent: the put waits for its ack
        body = b"written, then its slave died"
        c.send(serialize(ev.Put("t-a", 0, 0, body, c.opaque(), metaq_checksum(body))))
        wait_for(lambda: bodies(master, "t-a", 0) == [b"first", body], 10, "the put written")
        slave.kill()  # a stopped process killed: its link closes
        r = c.read_event()
        assert r.code == 503 and b"SLAVE_NOT_AVAILABLE" in r.body and b"written on the master" in r.body, r
        assert NOTHING not in r.body
    assert bodies(master, "t-a", 0) == [b"first", body]
