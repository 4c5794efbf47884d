"""Issue 66 point 8: a member whose log is behind a later epoch never becomes master again. Master killed -9, its
slave made master (``metaq-admin promote`` with ha: manual, the election with ha: auto), a message acknowledged by
it, the whole group stopped and started again in either order: the group's master is the member that took the
acknowledged message, and it serves that message (the epochs outlive the ephemeral nodes: ``ids/<id>/epochs``)."""

import json
import os
import signal

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from metaq import admincli as admin
from metaq.client import devcluster
from metaq.client.raw import TextClient
from metaq.client.local import free_port
from tests.harness.broker import wait_for
from tests.harness.devcluster import free_base
from tests.harness.ha import Group, manual_pair, put_until_ok
from tests.harness.replication import caught_up, master_config, stats

pytestmark = [pytest.mark.fault, pytest.mark.slow]

TOPIC = "t-a"
IDS = "/meta/brokers/ids/7"


class At:
    """A broker known by its text port (a ``metaq-cluster`` member): what ``put_until_ok`` and ``served`` use."""

    def __init__(self, port):
        self.port = port

    def client(self):
        return TextClient("127.0.0.1", self.port)


def served(broker, offset, body):
    """Whether ``broker`` answers a get at ``offset`` of partition 0 with ``body`` in it."""
    with broker.client() as c:
        r = c.get(TOPIC, 0, offset)
    return getattr(r, "code", 200) == 200 and body in r.body  # data comes as a Value, a refusal as a Result


def zk_master(zk):
    try:
        return zk.get(IDS + "/master")[0].decode()
    except NoNodeError:
        return None


@pytest.mark.parametrize("stale_first", [True, False], ids=["stale-first", "promoted-first"])
def test_manual_a_stale_master_restarted_follows_the_promoted_one(broker_factory, tmp_path, zk_connect, capsys,
                                                                  stale_first):
    m, s, rport, srport = manual_pair(broker_factory, tmp_path, zk_connect, TOPIC)
    m.kill()
    wait_for(lambda: stats(s)["replication_link"] == "down", 10, "the slave sees its master gone")
    assert admin.main(["promote", "127.0.0.1:%d" % s.port]) == admin.EXIT_OK, capsys.readouterr()
    _id, _part, offset = put_until_ok(s, TOPIC, b"acknowledged-by-the-promoted")
    s.stop()
    for b in (m, s) if stale_first else (s, m):
        b.start()
    zk = KazooClient(hosts=zk_connect)
    zk.start()
    try:
        wait_for(lambda: zk_master(zk) == "meta://127.0.0.1:%d" % s.port, 20,
                 lambda: "the promoted member registered as master (master node: %s)" % zk_master(zk))
        wait_for(lambda: zk.exists(IDS + "/slave0"), 10, "the old master registered as a slave")
    finally:
        zk.stop()
        zk.close()
    assert stats(s)["replication_role"] == "master" and stats(m)["replication_role"] == "slave"
    assert served(s, offset, b"acknowledged-by-the-promoted")
    caught_up(s, m)  # the old master copies the promoted one's log
    assert served(m, offset, b"acknowledged-by-the-promoted")
    with m.client() as c:
        assert c.put(TOPIC, b"to the old master").code == 503


@pytest.mark.parametrize("stale_first", [True, False], ids=["stale-first", "elected-first"])
def test_auto_a_stale_member_restarted_is_never_elected(broker_factory, tmp_path, zk_connect, stale_first):
    group = Group(broker_factory, tmp_path, zk_connect, n=2, mode="async")
    old = group.healthy()
    new = 1 - old
    put_until_ok(group.members[old], TOPIC, b"before")
    caught_up(group.members[old], group.members[new])
    group.members[old].kill()
    assert group.master(exclude=(old,)) == new
    _id, _part, offset = put_until_ok(group.members[new], TOPIC, b"acknowledged-by-the-elected")
    group.members[new].stop()
    first, second = (old, new) if stale_first else (new, old)
    group.members[first].start()
    if stale_first:  # alone, the stale member would have won its election by now
        wait_for(lambda: "may not be elected" in group.members[old].log_text(since_start=True)
                 or stats(group.members[old])["replication_role"] == "master", 20, "the stale member's election")
    group.members[second].start()
    assert group.healthy() == new
    assert served(group.members[new], offset, b"acknowledged-by-the-elected")


def test_manual_a_master_holding_the_master_node_yields_to_a_later_recorded_epoch(broker_factory, tmp_path,
                                                                                  zk_connect, capsys):
    """A promotion by force while the old master lives: the old master holds ZooKeeper's master node, and the
    promoted member could register only once it is gone. The old master finds the later epoch recorded, stops
    acknowledging and follows the promoted member, which then registers."""
    m, s, rport, srport = manual_pair(broker_factory, tmp_path, zk_connect, TOPIC)
    assert admin.main(["promote", "--force", "127.0.0.1:%d" % s.port]) == admin.EXIT_OK, capsys.readouterr()
    zk = KazooClient(hosts=zk_connect)
    zk.start()
    try:
        wait_for(lambda: zk_master(zk) == "meta://127.0.0.1:%d" % s.port, 20,
                 lambda: "the promoted member registered as master (master node: %s)" % zk_master(zk))
    finally:
        zk.stop()
        zk.close()
    assert "this broker is behind it and follows it as slave" in m.log_text()
    wait_for(lambda: stats(m).get("replication_link") == "connected", 10, "the old master follows")
    with m.client() as c:
        assert c.put(TOPIC, b"to the old master").code == 503
    _id, _part, offset = put_until_ok(s, TOPIC, b"after")
    caught_up(s, m)
    assert served(m, offset, b"after")


def test_make_cluster_after_a_promotion_and_a_restart_serves_the_acknowledged_message(tmp_path, zk_connect, capsys):
    """As a new user tries it: ``metaq-cluster start -n 1 --slaves 1``, kill -9 of broker 0's master, ``metaq-admin
    promote`` of its slave, a put to it acknowledged, the cluster stopped and started again (masters first)."""
    root, base = str(tmp_path / "cluster"), free_base(2)
    state = devcluster.start(root, 1, 1, base, zk_connect=zk_connect, say=lambda text: None, ha="manual")
    old, promoted = [b for b in state["brokers"] if b["broker_id"] == 0]
    member = At(promoted["ports"]["text"])
    try:
        wait_for(lambda: stats(member).get("replication_link") == "connected", 20, "the slave follows its master")
        os.kill(old["pid"], signal.SIGKILL)
        wait_for(lambda: admin.main(["promote", "127.0.0.1:%d" % member.port]) == admin.EXIT_OK, 20,
                 "the slave promoted once it sees its master gone")
        _id, _part, offset = put_until_ok(member, TOPIC, b"acknowledged-by-the-promoted")
        devcluster.stop(root, say=lambda text: None)
        devcluster.start(root, 1, 1, base, zk_connect=zk_connect, say=lambda text: None, ha="manual")

        def masters():
            capsys.readouterr()
            assert admin.main(["--zk", zk_connect, "--json", "cluster"]) == admin.EXIT_OK
            rows = json.loads(capsys.readouterr().out)
            return [r["url"] for r in rows if r["member"] == "master" and r["role"] == "master"]
        wait_for(lambda: masters() == ["meta://127.0.0.1:%d" % member.port], 40,
                 lambda: "the promoted member is broker 0's master after the restart: %s" % masters())
        assert served(member, offset, b"acknowledged-by-the-promoted")
    finally:
        devcluster.stop(root, say=lambda text: None)


def test_manual_a_master_whose_data_dir_lost_its_recorded_epoch_takes_no_writes_until_told(broker_factory, tmp_path,
                                                                                           zk_connect):
    """Its disk emptied, a master whose epoch ZooKeeper recorded is behind that epoch: it says so, names the node
    that lets it start afresh, and takes no writes; with the node deleted it is master again."""
    import shutil

    cfg = dict(master_config(tmp_path / "m", free_port()), zk={"connect": zk_connect, "session_timeout_ms": 4000})
    m = broker_factory(cfg, workdir=tmp_path / "m")
    put_until_ok(m, TOPIC, b"before")
    m.stop()
    shutil.rmtree(m.data_dir)
    m.start()
    with m.client() as c:
        r = c.put(TOPIC, b"on an empty disk")
    assert r.code == 503 and b"its data dir no longer holds it" in r.body and IDS.encode() + b"/epochs" in r.body, r
    m.stop()
    zk = KazooClient(hosts=zk_connect)
    zk.start()
    try:
        zk.delete(IDS + "/epochs")
    finally:
        zk.stop()
        zk.close()
    m.start()
    put_until_ok(m, TOPIC, b"afresh")
    assert stats(m)["replication_role"] == "master"
