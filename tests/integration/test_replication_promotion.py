"""Issue 5 point 3 with real processes: promotion (metaq-admin promote) and an old master rejoining with a
divergent tail that the epoch handshake cuts (F8), without and with ZooKeeper."""

import os
import re
import socket
import threading

import pytest

from metaq import admincli as admin
from metaq.client.local import free_port, small_config
from tests.harness.broker import wait_for
from tests.harness.replication import (assert_identical, caught_up, empty_master_handshake, master_config, mixed_load,
                                       stats)

pytestmark = pytest.mark.fault


def promote(capsys, broker, force=False):
    """``metaq-admin promote 127.0.0.1:<port> [--force]``: (exit code, stdout, stderr)."""
    code = admin.main(["promote", "127.0.0.1:%d" % broker.port] + (["--force"] if force else []))
    out = capsys.readouterr()
    return code, out.out, out.err


def slave_args(rport, slave_id, own_rport=None):
    args = ["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", str(slave_id)]
    return args + (["--replication-port", str(own_rport)] if own_rport else [])


def diverge(broker_factory, tmp_path, zk=None):
    """Master M and slave S (its own replication port for later); M gets 30 messages S never sees; M dies.

    Returns (M, S, S's replication port, M's log end before the tail).
    """
    rport, srport = free_port(), free_port()
    mcfg = master_config(tmp_path / "m", rport)
    scfg = small_config(os.path.join(str(tmp_path / "s"), "data"))
    if zk:
        for cfg in (mcfg, scfg):
            cfg["zk"] = {"connect": zk, "session_timeout_ms": 4000}
    m = broker_factory(mcfg, workdir=tmp_path / "m")
    s = broker_factory(scfg, workdir=tmp_path / "s", extra_args=slave_args(rport, 1, srport))
    mixed_load(m, 80, seed=21)
    caught_up(m, s)
    agreed = int(stats(m)["log_end_position"])
    s.kill()  # the slave is gone while the master takes a tail ...
    tail = mixed_load(m, 30, seed=22)
    assert len(tail) == 30
    m.kill()  # ... then the master dies with it
    s.start()
    wait_for(lambda: stats(s)["replication_link"] == "down", 10, "slave sees no master")
    return m, s, srport, agreed


def test_promote_then_the_old_master_rejoins_and_its_tail_is_cut(broker_factory, tmp_path, capsys):
    m, s, srport, agreed = diverge(broker_factory, tmp_path)
    code, _out, err = promote(capsys, s)  # it never heard from its master since it restarted: not caught up
    assert code == admin.EXIT_REFUSED and "not caught up" in err and "never heard" in err, err
    with s.client() as c:
        assert c.put("t-a", b"still a slave").code == 503
    code, out, _err = promote(capsys, s, force=True)
    assert code == admin.EXIT_OK and "now the master, epoch 2 from log position %d" % agreed in out, out
    assert "FORCED" in out
    code, _out, err = promote(capsys, s)
    assert code == admin.EXIT_REFUSED and "not a slave" in err
    st = stats(s)
    assert (st["slave"], st["replication_role"], st["replication_epoch"], st["replication_promoted"]) == \
        ("false", "master", "2", "true")
    mixed_load(s, 40, seed=23)  # the new master takes writes

    # The old master comes back as a slave of an address where nobody listens: it serves no read yet.
    m.extra_args = slave_args(free_port(), 2)
    m.start()
    with m.client() as c:
        r = c.get("t-a", 0, 0)
        assert r.code == 503 and b"no read until the epoch handshake" in r.body, r
        assert c.call(__import__("metaq.protocol.events", fromlist=["Offset"]).Offset("t-a", "g", 0, 0, 1)).code == 503
    assert stats(m)["replication_reads_refused"] == "true"
    m.stop()
    # Now pointed at the new master: the handshake cuts the 30-message tail, then it copies the new log.
    m.extra_args = slave_args(srport, 2)
    m.start()
    assert_identical(s, m)
    cut = re.search(r"agree up to position (\d+); CUT our tail of (\d+) bytes, (\d+) messages", m.log_text())
    assert cut, m.log_text()
    assert int(cut.group(1)) == agreed and int(cut.group(3)) == 30
    st = stats(m)
    assert st["replication_reads_refused"] == "false" and st["replication_epoch"] == "2"
    assert int(st["replication_cut_bytes"]) == int(cut.group(2)) > 0
    # The promoted broker stays master across a restart although its command line still says --slave-of.
    s.stop()
    s.start()
    assert stats(s)["replication_role"] == "master" and "stays master" in s.log_text()
    with s.client() as c:
        c.put_ok("t-a", b"after restart")
    assert_identical(s, m)


def test_the_readme_sequence_where_two_brokers_began_the_same_epoch_number(broker_factory, tmp_path, capsys):
    """Issue 17's report, step by step: a slave started with the README's command (no replication port of its
    own), master killed, slave promoted; the old master restarted as a plain master begins an epoch of the same
    number at the same position as the promoted slave; one write to each; the old master attached as a slave of
    the new one must cut its write, not keep it: afterwards the logs are byte-identical."""
    rport = free_port()
    m = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                       extra_args=slave_args(rport, 1))
    mixed_load(m, 20, seed=31)
    caught_up(m, s)
    position = int(stats(m)["log_end_position"])
    m.kill()
    wait_for(lambda: stats(s)["replication_link"] == "down", 10, "slave sees the master gone")
    code, out, _err = promote(capsys, s)
    assert code == admin.EXIT_OK and "epoch 2 from log position %d" % position in out, out
    m.start()  # the old master, restarted as a plain master: its own new epoch, the same number at the same place
    sm, ss = stats(m), stats(s)
    assert (sm["replication_epoch"], sm["replication_epoch_start"]) == (ss["replication_epoch"],
                                                                         ss["replication_epoch_start"]) == \
        ("2", str(position))
    assert sm["replication_epoch_origin"] != ss["replication_epoch_origin"]
    with m.client() as c:
        c.put_ok("t-a", b"written on the old master", partition=0)
    with s.client() as c:
        c.put_ok("t-a", b"written on the new master", partition=0)
    assert stats(m)["log_end_position"] == stats(s)["log_end_position"]  # same length, different bytes
    m.stop()
    srport = free_port()  # the promoted broker restarted with a replication port for the old master to attach to
    s.stop()
    s.extra_args = slave_args(rport, 1, srport)
    s.start()
    assert stats(s)["replication_role"] == "master"
    m.extra_args = slave_args(srport, 2)
    m.start()
    # the two logs have the same length: wait for the handshake's cut before comparing them
    wait_for(lambda: "CUT our tail" in m.log_text(since_start=True), 20, "the rejoin's handshake")
    assert_identical(s, m)  # every segment byte-identical, every partition reads the same
    cut = re.search(r"agree up to position (\d+); CUT our tail of (\d+) bytes, (\d+) messages", m.log_text())
    assert cut and int(cut.group(1)) == position and int(cut.group(3)) == 1, m.log_text()
    with m.client() as c:
        bodies = [r.data for r in c.get_records("t-a", 0, 0)]
    assert b"written on the new master" in bodies and b"written on the old master" not in bodies


def test_a_caught_up_slave_is_promoted_without_force_once_its_master_is_gone(broker_factory, tmp_path, capsys):
    rport = free_port()
    m = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                       extra_args=slave_args(rport, 1))
    acked = mixed_load(m, 40, seed=24)
    caught_up(m, s)
    code, _out, err = promote(capsys, s)
    assert code == admin.EXIT_REFUSED and "the master is alive" in err, err
    m.kill()
    wait_for(lambda: stats(s)["replication_link"] == "down", 10, "slave sees the master gone")
    assert stats(s)["replication_caught_up"] == "true"
    code, out, _err = promote(capsys, s)
    assert code == admin.EXIT_OK and "FORCED" not in out, out
    with s.client() as c:
        for topic, _id, part, offset in acked:  # nothing acknowledged was lost
            assert c.get_records(topic, part, offset)
        c.put_ok("t-a", b"on the new master")


def test_a_slave_whose_link_went_silent_before_it_dropped_is_not_caught_up(broker_factory, tmp_path, capsys):
    """Its master's last word is old: the master may have gone on acknowledging puts (async, or confirmed by
    another slave in sync mode) that this slave never heard of, so an unforced promotion is refused."""
    from tests.harness.faults import LinkProxy

    rport = free_port()
    m = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    with LinkProxy(("127.0.0.1", rport)) as proxy:
        s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                           extra_args=["--slave-of", proxy.address, "--slave-id", "1"])
        mixed_load(m, 20, seed=7)
        caught_up(m, s)
        proxy.cut(blackhole=True)  # the path goes silent; the connection stays open
        with m.client() as c:
            for i in range(10):
                c.put_ok("t-a", b"never heard of %d" % i)
        wait_for(lambda: stats(s)["replication_caught_up"] == "false", 10, "the silence noticed")
        m.kill()
        wait_for(lambda: stats(s)["replication_link"] == "down", 30, "the slave sees the link gone")
        st = stats(s)
        assert st["replication_lag_bytes"] == "0" and st["replication_caught_up"] == "false", st
        assert float(st["replication_master_silence_s"]) >= 3, st
        code, _out, err = promote(capsys, s)
        assert code == admin.EXIT_REFUSED and "said nothing for" in err and "log_end_position" in err, err
        code, out, _err = promote(capsys, s, force=True)
        assert code == admin.EXIT_OK and "FORCED" in out, out


@pytest.mark.slow
def test_with_zookeeper_a_superseded_master_rejoins_by_itself(broker_factory, tmp_path, capsys, zk_connect):
    from kazoo.client import KazooClient
    from kazoo.exceptions import NoNodeError

    m, s, srport, agreed = diverge(broker_factory, tmp_path, zk=zk_connect)
    code, out, _err = promote(capsys, s, force=True)
    assert code == admin.EXIT_OK, out
    zk = KazooClient(hosts=zk_connect)
    zk.start()
    try:
        ids = "/meta/brokers/ids/7"
        def master_of():
            try:
                return zk.get(ids + "/master")[0].decode()
            except NoNodeError:  # not registered yet, or between the old master's node and the new one's
                return None

        def replication_of():
            try:
                return zk.get(ids + "/replication")[0]
            except NoNodeError:  # the new master writes it after its master node (CI saw the gap once)
                return b""

        wait_for(lambda: master_of() == "meta://127.0.0.1:%d" % s.port, 20, "promoted slave registered as master")
        assert not zk.exists(ids + "/slave1")
        wait_for(lambda: b'"epoch":2' in replication_of() and (b":%d" % srport) in replication_of(), 10,
                 "the new master's replication node (epoch 2, its replication port)")
        wait_for(lambda: zk.exists("/meta/brokers/topics-pub/t-a/7-m"), 10, "topics-pub as master")
        mixed_load(s, 20, seed=25)
        m.extra_args = []  # restarted as a plain master: ZooKeeper tells it who the master is now
        m.start()
        assert "(ZooKeeper's epoch record), after this broker's epoch 1: this broker is behind it and follows it " \
            "as slave" in m.log_text()
        assert_identical(s, m)
        assert "CUT our tail" in m.log_text()
        wait_for(lambda: zk.exists(ids + "/slave0"), 10, "old master registered as a slave")
        assert master_of() == "meta://127.0.0.1:%d" % s.port
    finally:
        zk.stop()
        zk.close()


def test_a_promoted_slave_delivers_pending_delayed_messages_once(broker_factory, tmp_path, capsys):
    """The master's delay scheduler stops with it; the promoted slave takes over its schedule, skipping what
    the old master already delivered (found by id in the copied log)."""
    from tests.harness.delay import delay_stats, put_delayed_ok, records

    rport = free_port()
    levels = {"levels": "1s 4s"}
    mcfg = master_config(tmp_path / "m", rport)
    mcfg["delay"] = levels
    scfg = small_config(os.path.join(str(tmp_path / "s"), "data"), delay=levels)
    m = broker_factory(mcfg, workdir=tmp_path / "m")
    s = broker_factory(scfg, workdir=tmp_path / "s", extra_args=slave_args(rport, 1))
    with m.client() as c:
        early = {put_delayed_ok(c, "t-a", b"early-%d" % i, 1, partition=0)[0] for i in range(5)}
        late = {put_delayed_ok(c, "t-a", b"late-%d" % i, 2, partition=0)[0] for i in range(5)}
        wait_for(lambda: {r.msg_id for r in records(c, "t-a", [0])} == early, 10, "level 1 delivered by the master")
    caught_up(m, s)
    assert stats(s)["delay_scheduler"] == "off"
    m.kill()  # the level-2 messages are still pending
    wait_for(lambda: stats(s)["replication_link"] == "down", 10, "slave sees the master gone")
    code, out, _err = promote(capsys, s)
    assert code == admin.EXIT_OK, out
    assert stats(s)["delay_scheduler"] == "running"
    with s.client() as c:
        wait_for(lambda: len(records(c, "t-a", [0])) >= 10, 15, "level 2 delivered by the promoted slave")
        # the schedule worked through: both levels empty and the master's five level-1 deliveries recognised
        wait_for(lambda: (lambda lv, tot: tot["redeliveries_skipped"] == 5 and all(
            level["pending"] == "0" for level in lv.values()))(*delay_stats(c)), 15, "the schedule worked through")
        ids = [r.msg_id for r in records(c, "t-a", [0])]
        levels_now, totals = delay_stats(c)
    assert sorted(ids) == sorted(early | late), "each delayed message exactly once"
    assert totals["redeliveries_skipped"] == 5, (levels_now, totals)  # the master's level-1 deliveries


def test_with_zookeeper_a_master_publishes_its_advertised_replication_address(broker_factory, tmp_path, zk_connect):
    """``replication.advertised_address`` (NAT, a port mapping, a proxy) is what ids/<id>/replication names: the
    address a superseded master rejoins by itself."""
    import json

    from kazoo.client import KazooClient

    cfg = master_config(tmp_path / "m", free_port(), advertised_address="gateway.example:18124")
    cfg["zk"] = {"connect": zk_connect, "session_timeout_ms": 4000}
    broker_factory(cfg, workdir=tmp_path / "m")
    zk = KazooClient(hosts=zk_connect)
    zk.start()
    try:
        path = "/meta/brokers/ids/7/replication"
        wait_for(lambda: zk.exists(path), 20, "the master's replication node")
        assert json.loads(zk.get(path)[0])["address"] == "gateway.example:18124"
    finally:
        zk.stop()
        zk.close()


def test_a_slave_whose_master_died_right_after_the_handshake_is_caught_up(broker_factory, tmp_path, capsys):
    """The handshake's EPOCHS tells the slave its master's end: a master gone before its first heartbeat leaves a
    slave that holds that end promotable without --force (a raw master port: handshake, then the link and the port
    closed, no DATA or HEARTBEAT ever sent)."""
    server = socket.create_server(("127.0.0.1", 0))
    handshaken = threading.Event()

    def serve_once():
        sock, _ = server.accept()
        server.close()
        with sock:
            empty_master_handshake(sock)
            handshaken.set()

    threading.Thread(target=serve_once, daemon=True).start()
    s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                       extra_args=slave_args(server.getsockname()[1], 1))
    assert handshaken.wait(15), s.log_text()

    def handshake_taken_and_link_down():  # the master's end taken (lag known), and the link seen gone
        st = stats(s)
        return st["replication_lag_bytes"] != "-1" and st["replication_link"] == "down"
    wait_for(handshake_taken_and_link_down, 15, lambda: "the slave takes the handshake, then sees its master gone: "
             "%s" % stats(s))
    st = stats(s)
    assert (st["replication_lag_bytes"], st["replication_caught_up"]) == ("0", "true"), st
    code, out, err = promote(capsys, s)
    assert code == admin.EXIT_OK and "FORCED" not in out, (out, err)
    with s.client() as c:
        c.put_ok("t-a", b"on the promoted slave")
