"""Issue 5 points 1-2 with real broker processes: a slave copies its master's commit log byte for byte."""

import os
import signal

import pytest

from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.stream import CLOSED
from metaq.protocol.text import serialize
from metaq.client.local import free_port, small_config
from tests.harness.broker import wait_for
from tests.harness.load import check_acked_present, check_running, collect, start_load
from tests.harness.replication import assert_identical, caught_up, master_config, mixed_load, stats, sync_pair


def start_pair(broker_factory, tmp_path, mode="async", slaves=1, **store):
    rport = free_port()
    mcfg = master_config(tmp_path / "m", rport, mode=mode)
    mcfg["store"].update(store)
    master = broker_factory(mcfg, workdir=tmp_path / "m")
    out = []
    for n in range(1, slaves + 1):
        wd = tmp_path / ("s%d" % n)
        cfg = small_config(os.path.join(str(wd), "data"))
        cfg["store"].update(store)
        out.append(broker_factory(cfg, workdir=wd,
                                  extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", str(n)]))
    return master, out, rport


def test_slave_copies_the_log_serves_reads_and_refuses_puts(broker_factory, tmp_path):
    master, (slave,), rport = start_pair(broker_factory, tmp_path)
    mixed_load(master, 250)  # several MB: rolls 1 MB segments
    assert_identical(master, slave)
    s = stats(slave)
    assert s["slave"] == "true" and s["replication_role"] == "slave"
    assert s["replication_link"] == "connected" and s["replication_lag_bytes"] == "0"
    m = stats(master)
    assert m["slave"] == "false" and m["replication_slaves"] == "1"
    assert "replication_slave1" in m
    with slave.client() as c:
        r = c.put("t-a", b"nope")
        assert r.code == 503 and b"slave" in r.body and (b"127.0.0.1:%d" % rport) in r.body, r


@pytest.mark.fault
def test_slave_and_master_restarts_and_link_cut(broker_factory, tmp_path):
    master, (slave,), _rport = start_pair(broker_factory, tmp_path)
    mixed_load(master, 80, seed=2)
    caught_up(master, slave)
    slave.kill()  # kill -9 the slave, write on, restart: it resumes from its own end
    mixed_load(master, 80, seed=3)
    slave.start()
    assert_identical(master, slave)
    master.kill()  # kill -9 the master: the slave keeps serving and reconnects when it is back
    wait_for(lambda: stats(slave)["replication_link"] == "down", 15, "slave sees the link down")
    with slave.client() as c:
        assert c.put("t-a", b"x").code == 503
    master.start()
    mixed_load(master, 60, seed=4)
    assert_identical(master, slave)
    master.stop()  # the link cut: nothing written meanwhile
    master.start()
    wait_for(lambda: stats(slave)["replication_link"] == "connected", 15, "slave reconnects")
    mixed_load(master, 30, seed=5)
    assert_identical(master, slave)


def test_two_slaves(broker_factory, tmp_path):
    master, slaves, _ = start_pair(broker_factory, tmp_path, slaves=2)
    mixed_load(master, 120, seed=6)
    for s in slaves:
        assert_identical(master, s)
    wait_for(lambda: stats(master)["replication_slaves"] == "2", 10, "two slaves listed")


@pytest.mark.fault
def test_sync_mode_master_killed_during_a_load_the_slave_holds_every_acknowledged_payload(broker_factory, tmp_path):
    """README "Modes": in sync mode every acknowledged put is on a slave. Three pipelined producers run; the master
    is killed -9 in the middle of the load; each acknowledged message is on the slave with its exact payload."""
    master, (slave,), _ = start_pair(broker_factory, tmp_path, mode="sync")
    wait_for(lambda: stats(master)["replication_slaves"] == "1", 10, "slave connected")
    producers = start_load(master, 3)
    wait_for(lambda: all(len(t.acked) >= 200 or not t.is_alive() for t in producers), 60,
             "every producer acknowledged 200 puts")
    check_running(producers)  # still putting: the kill hits the load, not its end
    master.kill()
    acked = collect(producers)
    assert check_acked_present(slave, acked) == 0  # payloads compared, each record's CRC checked
    # and nothing the slave holds was refused or invented: its count is at least what was acknowledged
    assert int(stats(slave)["total_messages"]) >= len(acked)


@pytest.mark.fault
def test_sync_mode_sigterm_answers_every_put_in_flight_and_the_slave_holds_them(broker_factory, tmp_path):
    """A graceful stop lets puts waiting for the slave's ack finish: slaves keep streaming through the grace.

    The slave is frozen (SIGSTOP) while a burst waits for its acks, the master gets SIGTERM, then the slave
    thaws: every put of the burst is acknowledged and on the slave, none answered 503 or dropped.
    """
    master, (slave,), _ = start_pair(broker_factory, tmp_path, mode="sync")
    wait_for(lambda: stats(master)["replication_slaves"] == "1", 10, "slave connected")
    n = 200
    bodies = [b"inflight-%04d" % i for i in range(n)]
    with master.client() as c:
        c.put_ok("t-a", b"before", 0)
        slave.proc.send_signal(signal.SIGSTOP)
        try:
            c.send(b"".join(serialize(ev.Put("t-a", i % 4, 0, body, i + 1, metaq_checksum(body)))
                            for i, body in enumerate(bodies)))
            wait_for(lambda: stats(master)["total_messages"] == str(n + 1), 20,
                     "the master to write the burst (every put then waits for the slave)")
            master.proc.send_signal(signal.SIGTERM)
            wait_for(lambda: "shutting down" in master.log_text(), 20, "the master to begin its graceful stop")
        finally:
            slave.proc.send_signal(signal.SIGCONT)
        replies = [c.read_event() for _ in range(n)]
    assert master.proc.wait(30) == 0
    assert [r if r is CLOSED else r.code for r in replies] == [200] * n  # every put in flight acknowledged
    with slave.client() as c:
        for r in replies:
            _id, part, offset = r.body.split()
            recs = c.get_records("t-a", int(part), int(offset))
            assert isinstance(recs, list) and recs, (part, offset, recs)
    assert int(stats(slave)["total_messages"]) == n + 1


def test_sync_mode_without_slave_answers_503(broker_factory, tmp_path):
    rport = free_port()
    master = broker_factory(master_config(tmp_path / "m", rport, mode="sync", sync_timeout_ms=500),
                            workdir=tmp_path / "m")
    with master.client() as c:
        r = c.put("t-a", b"hello")
        assert r.code == 503 and b"SLAVE_NOT_AVAILABLE" in r.body, r
    assert stats(master)["replication_mode"] == "sync"


@pytest.mark.fault
def test_sync_mode_slave_stalled_or_stopped_answers_503(broker_factory, tmp_path):
    import signal

    master, slave = sync_pair(broker_factory, tmp_path, sync_timeout_ms=500)
    with master.client() as c:
        c.put_ok("t-a", b"one")
        slave.proc.send_signal(signal.SIGSTOP)  # connected but silent: the ack never comes
        try:
            r = c.put("t-a", b"two")
            assert r.code == 503 and b"FLUSH_SLAVE_TIMEOUT" in r.body, r
        finally:
            slave.proc.send_signal(signal.SIGCONT)
        slave.stop()
        wait_for(lambda: stats(master)["replication_slaves"] == "0", 10, "slave gone")
        r = c.put("t-a", b"three")
        assert r.code == 503 and b"SLAVE_NOT_AVAILABLE" in r.body, r


@pytest.mark.slow
def test_slave_registers_in_zookeeper(broker_factory, tmp_path, zk_connect):
    from kazoo.client import KazooClient

    rport = free_port()
    mcfg = master_config(tmp_path / "m", rport)
    mcfg["zk"] = {"connect": zk_connect}
    master = broker_factory(mcfg, workdir=tmp_path / "m")
    scfg = small_config(os.path.join(str(tmp_path / "s"), "data"))
    scfg["zk"] = {"connect": zk_connect}
    slave = broker_factory(scfg, workdir=tmp_path / "s",
                           extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "3"])
    with master.client() as c:
        c.put_ok("t-zk", b"m")
    caught_up(master, slave)
    zk = KazooClient(hosts=zk_connect)
    zk.start()
    try:
        base = "/meta/brokers"
        wait_for(lambda: zk.exists(base + "/ids/7/slave3") and zk.exists(base + "/topics-sub/t-zk/7-s3"),
                 15, "slave nodes")
        assert zk.get(base + "/ids/7/slave3")[0].decode() == "meta://127.0.0.1:%d" % slave.port
        assert zk.exists(base + "/topics/t-zk/7-s3")
        assert not zk.exists(base + "/topics-pub/t-zk/7-s3")
        assert zk.get(base + "/ids/7/master")[0].decode() == "meta://127.0.0.1:%d" % master.port
        assert b'"7-s3"' in zk.get(base + "/topics-sub/t-zk/7-s3")[0]
    finally:
        zk.stop()
        zk.close()


def test_a_slave_refuses_transactions_of_every_kind_and_keeps_nothing_of_them(broker_factory, tmp_path):
    """README "What a slave does": puts and transactions answer 503 naming the master; nothing is stored."""
    master, (slave,), rport = start_pair(broker_factory, tmp_path)
    mixed_load(master, 10)
    caught_up(master, slave)
    before = stats(slave)["log_end_position"]
    refusal = b"this broker is a replication slave of 127.0.0.1:%d (read-only): send puts to the master" % rport
    with slave.client() as c:
        for key, kind, timeout in (("TX:1:1", "BEGIN", 0), ("XID:1:0a01:b1:rm", "BEGIN", 30),
                                   ("XID:1:0a01:b1:rm", "PREPARE", 0), ("XID:1:0a01:b1:rm", "COMMIT_TWO_PHASE", 0),
                                   ("TX:1:1", "COMMIT_ONE_PHASE", 0),
                                   ("XID:1:0a01:b1:rm", "ROLLBACK", 0), ("null", "RECOVER", 0)):
            r = c.call(ev.Transaction(key, "s1", kind, c.opaque(), timeout))
            assert (r.code, r.body) == (503, refusal), (key, kind, r)
        body = b"inside a transaction"
        r = c.call(ev.Put("t-a", 0, 0, body, c.opaque(), metaq_checksum(body), "TX:1:1"))
        assert (r.code, r.body) == (503, refusal), r
    assert stats(slave)["log_end_position"] == before
    assert stats(slave)["replication_link"] == "connected"  # and it keeps copying its master


@pytest.mark.fault
def test_sync_mode_a_slave_far_behind_makes_puts_time_out_until_it_has_caught_up(broker_factory, tmp_path):
    """README "Modes": a slave far behind (catching up) makes sync puts time out until it has caught up."""
    from tests.harness.faults import LinkProxy

    rport = free_port()
    master = broker_factory(master_config(tmp_path / "m", rport, mode="sync", sync_timeout_ms=300),
                            workdir=tmp_path / "m")
    with LinkProxy(("127.0.0.1", rport)) as link:
        slave_cfg = small_config(os.path.join(str(tmp_path / "s"), "data"))
        slave = broker_factory(slave_cfg, workdir=tmp_path / "s",
                               extra_args=["--slave-of", link.address, "--slave-id", "1"])
        wait_for(lambda: stats(master)["replication_slaves"] == "1", 10, "slave connected")
        with master.client() as c:
            c.put_ok("t-a", b"confirmed by the slave")
            link.cut(blackhole=True)  # the slave stays connected and hears nothing: puts are written, unconfirmed
            body = b"x" * 60_000
            for i in range(100):  # 6 MB the slave does not have (pipelined: they wait for it side by side)
                c.send(serialize(ev.Put("t-b", i % 4, 0, body, c.opaque(), metaq_checksum(body))))
            for _ in range(100):
                r = c.read_event()
                assert r.code == 503 and b"FLUSH_SLAVE_TIMEOUT" in r.body, r
            slave.stop()
            link.heal()  # closes the connection it held: the master sees its slave gone
            wait_for(lambda: stats(master)["replication_slaves"] == "0", 10, "slave gone")
            link.rate = 1 << 20  # 1 MiB/s: catching up takes about six seconds
            slave.start()
            wait_for(lambda: stats(master)["replication_slaves"] == "1", 10, "slave connected again")
            r = c.put("t-a", b"while the slave catches up")
            assert r.code == 503 and b"FLUSH_SLAVE_TIMEOUT" in r.body, r
            # the master's heartbeats reach it between the chunks: it knows how far behind it is (the value of
            # metaq_replication_lag_messages), more than 0 and at most what it missed
            wait_for(lambda: 0 < int(stats(slave)["replication_lag_messages"]) <= 101, 10, "a lag the slave knows")
            link.rate = None
            caught_up(master, slave)
            c.put_ok("t-a", b"after the catch-up")  # confirmed again
        assert_identical(master, slave)


def test_a_slave_that_may_be_behind_answers_past_its_end_as_not_yet_there(broker_factory, tmp_path):
    """README "Failover: reads": a consumer reading a slave at the offsets it had on the master is never sent back
    to the slave's end (it would read twice): past its end a slave whose link is down answers 404 (a long poll
    waits for the copy); linked and caught up, it knows the master's end and answers 301 like a master."""
    master, (slave,), _ = start_pair(broker_factory, tmp_path)
    with master.client() as c:
        for i in range(5):
            c.put_ok("t-a", b"m%d" % i, partition=0)
    caught_up(master, slave)
    with slave.client() as c:
        r = c.get("t-a", 0, 9, 1 << 16)
        assert (r.code, r.body) == (301, b"5"), r  # linked and caught up: offset 9 is out of range
    master.kill()
    wait_for(lambda: stats(slave)["replication_link"] == "down", 15, "slave sees the link down")
    with slave.client() as c:
        r = c.get("t-a", 0, 9, 1 << 16)
        assert r.code == 404, r  # the master may hold offset 9: not here yet
        r = c.get("t-a", 0, 3, 1 << 16)  # what it holds is served as ever
        assert type(r) is ev.Value, r
    master.start()
    caught_up(master, slave)
    wait_for(lambda: stats(slave)["replication_link"] == "connected", 15, "slave relinked")
    with slave.client() as c:
        assert c.get("t-a", 0, 9, 1 << 16).code == 301


def test_a_slave_that_may_be_behind_answers_a_rocketmq_pull_past_its_end_as_not_found(broker_factory, tmp_path):
    """The same for RocketMQ consumers (RocketMQ's own slave does not correct the offset either): PULL_NOT_FOUND
    keeping the consumer's offset while the link is down, PULL_OFFSET_MOVED once linked and caught up."""
    from metaq.client.local import rmq_config
    from metaq.client.raw import RemotingClient
    from metaq.protocol.rocketmq.remoting import ResponseCode
    from tests.harness.rocketmq import pull

    rport = free_port()
    mcfg = rmq_config(os.path.join(str(tmp_path / "m"), "data"), replication={"port": rport})
    master = broker_factory(mcfg, workdir=tmp_path / "m")
    slave = broker_factory(rmq_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                           extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    with master.client() as c:
        for i in range(5):
            c.put_ok("t-a", b"m%d" % i, partition=0)
    caught_up(master, slave)
    with RemotingClient(slave.config["remoting"]["port"]) as rc:
        r = pull(rc, "t-a", 0, 9)
        assert r.code == ResponseCode.PULL_OFFSET_MOVED and r.ext_fields["nextBeginOffset"] == "5", r
    master.kill()
    wait_for(lambda: stats(slave)["replication_link"] == "down", 15, "slave sees the link down")
    with RemotingClient(slave.config["remoting"]["port"]) as rc:
        r = pull(rc, "t-a", 0, 9)
        assert r.code == ResponseCode.PULL_NOT_FOUND and r.ext_fields["nextBeginOffset"] == "9", r
        r = pull(rc, "t-a", 0, 3)
        assert r.code == ResponseCode.SUCCESS, r
