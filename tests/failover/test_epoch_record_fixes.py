"""A manual master serves only in an epoch the group's record holds (docs/replication.md, "Epochs outlive the
brokers"): started while ZooKeeper does not answer it refuses writes until it has recorded its epoch, and a
promotion whose record write fails is refused, the slave staying a slave."""

import json
import os
import time

import pytest
from kazoo.client import KazooClient
from kazoo.security import make_acl

from metaq import admincli as admin
from metaq.client.local import free_port, small_config
from tests.harness.broker import wait_for
from tests.harness.faults import LinkProxy
from tests.harness.ha import Group, manual_pair, put_until_ok
from tests.harness.replication import caught_up, master_config, stats

pytestmark = [pytest.mark.fault]

TOPIC = "t-a"
IDS = "/meta/brokers/ids/7"


def test_manual_a_master_started_while_zookeeper_is_out_of_reach_takes_no_write_until_its_epoch_is_recorded(
        broker_factory, tmp_path, zk_connect):
    address, chroot = zk_connect.split("/", 1)
    host, port = address.rsplit(":", 1)
    with LinkProxy((host, int(port))) as proxy:
        proxy.cut()
        zkcfg = {"connect": "%s/%s" % (proxy.address, chroot), "session_timeout_ms": 4000,
                 "connection_timeout_ms": 300}
        m = broker_factory(dict(master_config(tmp_path / "m", free_port()), zk=zkcfg), workdir=tmp_path / "m")
        with m.client() as c:
            r = c.put(TOPIC, b"before the record")
        assert r.code == 503 and b"has not recorded its epoch" in r.body, r
        assert stats(m)["replication_writable"] == "no (epoch not recorded in ZooKeeper yet)"
        proxy.heal()
        put_until_ok(m, TOPIC, b"once recorded", timeout=20)
    assert "this master takes writes" in m.log_text()


def test_manual_a_master_without_replication_port_serves_while_zookeeper_is_out_of_reach(broker_factory, tmp_path):
    """No replication port, so no slave of it exists: as before the record, it serves without ZooKeeper."""
    zkcfg = {"connect": "127.0.0.1:%d" % free_port(), "connection_timeout_ms": 300}
    m = broker_factory(dict(small_config(os.path.join(str(tmp_path / "m"), "data")), zk=zkcfg),
                       workdir=tmp_path / "m")
    put_until_ok(m, TOPIC, b"served without ZooKeeper", timeout=5)
    assert stats(m)["replication_writable"] == "yes"


def test_manual_a_promotion_whose_epoch_cannot_be_recorded_is_refused_and_the_slave_stays_one(
        broker_factory, tmp_path, zk_connect, capsys):
    m, s, rport, _ = manual_pair(broker_factory, tmp_path, zk_connect, TOPIC, slave_replication=False)
    zk = KazooClient(hosts=zk_connect)
    zk.start()
    try:
        wait_for(lambda: zk.exists(IDS + "/epochs"), 10, "the master's epoch recorded")
        zk.set_acls(IDS + "/epochs", [make_acl("world", "anyone", read=True, admin=True)])  # no write
        m.kill()
        wait_for(lambda: stats(s)["replication_link"] == "down", 10, "the slave sees its master gone")
        capsys.readouterr()
        assert admin.main(["promote", "127.0.0.1:%d" % s.port]) != admin.EXIT_OK
        assert "could not be added to broker 7's epoch record" in capsys.readouterr().err
        assert stats(s)["replication_role"] == "slave"
        with s.client() as c:
            assert c.put(TOPIC, b"refused").code == 503
        zk.set_acls(IDS + "/epochs", [make_acl("world", "anyone", all=True)])
    finally:
        zk.stop()
        zk.close()
    assert admin.main(["promote", "127.0.0.1:%d" % s.port]) == admin.EXIT_OK, capsys.readouterr()
    put_until_ok(s, TOPIC, b"after")


def test_manual_a_master_without_replication_port_whose_epochs_file_is_damaged_goes_on_as_master(
        broker_factory, tmp_path, zk_connect):
    """The default shape (no replication port, so no slave can exist): a damaged epochs file costs nothing but a
    loud log line; the broker knows the recorded epoch as its own by its URL."""
    cfg = dict(small_config(os.path.join(str(tmp_path / "m"), "data")), zk={"connect": zk_connect,
                                                                          "session_timeout_ms": 4000})
    m = broker_factory(cfg, workdir=tmp_path / "m")
    _id, _part, offset = put_until_ok(m, TOPIC, b"before")
    m.stop()
    with open(os.path.join(m.data_dir, "epochs"), "wb") as f:
        f.write(b"damaged")
    m.start()
    put_until_ok(m, TOPIC, b"after", timeout=10)
    assert "no slave of either can hold more than this broker does" in m.log_text(since_start=True)
    assert stats(m)["replication_writable"] == "yes"


@pytest.mark.slow
def test_auto_when_the_only_member_of_the_latest_epoch_is_gone_for_good_the_operator_forgets_the_record(
        broker_factory, tmp_path, zk_connect, capsys):
    group = Group(broker_factory, tmp_path, zk_connect, n=2, mode="async")
    old = group.healthy()
    new = 1 - old
    put_until_ok(group.members[old], TOPIC, b"before")
    caught_up(group.members[old], group.members[new])
    group.members[old].kill()
    assert group.master(exclude=(old,)) == new
    group.members[new].kill()  # gone for good
    group.members[old].start()
    wait_for(lambda: "epochs 7 --forget --yes" in group.members[old].log_text(since_start=True), 20,
             "the stale member names the way out")
    capsys.readouterr()
    assert admin.main(["--zk", zk_connect, "--json", "epochs", "7"]) == admin.EXIT_OK
    assert json.loads(capsys.readouterr().out)[-1]["member"]
    with pytest.raises(SystemExit, match="Add --yes"):
        admin.main(["--zk", zk_connect, "epochs", "7", "--forget"])
    assert admin.main(["--zk", zk_connect, "epochs", "7"]) == admin.EXIT_OK  # still there
    assert admin.main(["--zk", zk_connect, "epochs", "7", "--forget", "--yes"]) == admin.EXIT_OK
    assert group.master(exclude=(new,)) == old
    put_until_ok(group.members[old], TOPIC, b"after")


@pytest.mark.slow
def test_auto_a_member_whose_epoch_cannot_be_recorded_backs_off_and_says_so_once(broker_factory, tmp_path,
                                                                                 zk_connect):
    zk = KazooClient(hosts=zk_connect)
    zk.start()
    try:
        zk.ensure_path(IDS)
        zk.create(IDS + "/epochs", b'{"epochs": []}',
                  acl=[make_acl("world", "anyone", read=True, admin=True)])  # no write
        group = Group(broker_factory, tmp_path, zk_connect, n=1, mode="async")
        member = group.members[0]
        wait_for(lambda: "begins at log position" in member.log_text(), 15, "the first election won")
        time.sleep(6)
        text = member.log_text()
        assert text.count("begins at log position") <= 3, "%d local epochs begun" % text.count("begins at log position")
        assert text.count("could not be added to the epoch record") == 1
        assert stats(member)["replication_role"] == "slave"
        zk.set_acls(IDS + "/epochs", [make_acl("world", "anyone", all=True)])
    finally:
        zk.stop()
        zk.close()
    assert group.master(timeout=40) == 0


@pytest.mark.slow
def test_manual_a_member_that_yielded_follows_the_promoted_one_to_its_new_address(broker_factory, tmp_path,
                                                                                zk_connect, capsys):
    m, s, rport, srport = manual_pair(broker_factory, tmp_path, zk_connect, TOPIC)
    m.kill()
    wait_for(lambda: stats(s)["replication_link"] == "down", 10, "the slave sees its master gone")
    assert admin.main(["promote", "127.0.0.1:%d" % s.port]) == admin.EXIT_OK, capsys.readouterr()
    m.start()
    wait_for(lambda: stats(m).get("replication_master") == "127.0.0.1:%d" % srport, 10, "the old master follows")
    s.stop()
    s.extra_args[-1] = str(free_port())  # the promoted member comes back at another replication address
    s.start()
    _id, _part, offset = put_until_ok(s, TOPIC, b"after the move")
    caught_up(s, m)
    assert stats(m)["replication_master"] == "127.0.0.1:%s" % s.extra_args[-1]
