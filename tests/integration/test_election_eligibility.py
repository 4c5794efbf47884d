"""README "Automatic failover" and "Replication › Limits": in `sync` mode a member restarted on an empty data dir
is never elected, whatever the in-sync set says; and if ZooKeeper loses the `insync` node, the next election
lets any member win (real brokers, a real ZooKeeper of the test's own)."""

import shutil

import pytest
from kazoo.client import KazooClient

from tests.harness.broker import wait_for
from tests.harness.ha import Group
from tests.harness.replication import caught_up, stats
from tests.integration.test_election import IDS, acked_load, zk_json

pytestmark = [pytest.mark.fault, pytest.mark.slow]


def in_sync_set(zk):
    return sorted(zk_json(zk, IDS + "/insync")["members"])


def test_a_member_restarted_on_an_empty_data_dir_is_not_elected_whatever_the_set_says(broker_factory, tmp_path,
                                                                                      own_zk):
    zk = own_zk.connect
    g = Group(broker_factory, tmp_path, zk, n=3, mode="sync")
    a = g.master()
    b, c = [i for i in range(3) if i != a]
    wait_for(lambda: in_sync_set(zk) == [0, 1, 2], 15, "every member in sync")
    acked = acked_load(g.members[a], 20, b"acked")
    for m in g.members:  # all at once: nobody is left to take c out of the set
        m.kill()
    assert in_sync_set(zk) == [0, 1, 2]
    shutil.rmtree(g.members[c].data_dir)  # c rebuilt on an empty disk, same member id
    g.members[c].start()
    wait_for(lambda: "has an empty data dir that never followed an elected master" in
             g.members[c].log_text(since_start=True), 30, "c to say why it may not be elected")
    st = stats(g.members[c])
    assert (st["replication_role"], st["replication_leading"]) == ("slave", "false"), st
    with g.members[c].client() as cl:
        r = cl.put("t-a", b"nobody may take this", 0)
        assert r.code == 503 and b"no elected master yet" in r.body, r
    g.members[b].start()
    assert g.master(timeout=30) == b
    g.following(b, [c])
    caught_up(g.members[b], g.members[c])  # its partitions answer b's ends, not only its log
    with g.members[c].client() as cl:
        for body, _id, part, offset in acked:
            assert cl.get_records("t-a", part, offset)[0].data == body


def test_without_the_insync_node_the_next_election_lets_any_member_win(broker_factory, tmp_path, own_zk):
    zk = own_zk.connect
    g = Group(broker_factory, tmp_path, zk, n=3, mode="sync")
    a = g.master()
    b, c = [i for i in range(3) if i != a]
    wait_for(lambda: in_sync_set(zk) == [0, 1, 2], 15, "every member in sync")
    g.members[c].kill()
    wait_for(lambda: in_sync_set(zk) == sorted([a, b]), 15, "the killed member leaves the in-sync set")
    acked_load(g.members[a], 20, b"only-a-and-b")  # c misses these: with the set, it may never be elected
    g.members[a].kill()
    g.members[b].kill()
    client = KazooClient(hosts=zk)
    client.start()
    try:
        client.delete(IDS + "/insync")  # ZooKeeper lost it
    finally:
        client.stop()
        client.close()
    g.members[c].start()
    assert g.master(timeout=30) == c  # the only live member wins (a known loss: README says so)
    assert zk_json(zk, IDS + "/insync")["master"] == c  # a new set, written by the member that won
    assert "may not be elected" not in g.members[c].log_text(since_start=True)
