"""Issue 17 point 4, last clause, with real processes: the consumer offsets a broker keeps move with the master.

A slave holds its master's committed offsets (the replication stream's OFFSETS frames: the whole table once per
link, then what changed, at most every ``OFFSETS_SYNC_S``), so the slave promoted by hand (``metaq-admin promote``)
or elected (``ha: auto``) answers ``query_offset`` / QUERY_CONSUMER_OFFSET with what the group committed on the old
master; an old master that rejoins as a slave takes the new master's table. A master that lies in OFFSETS frames
is not believed.
"""

import os
import socket
import struct
import threading

import pytest

from metaq import admincli as admin
from metaq.client.local import free_port, ns_of, small_config
from metaq.offsets.limits import MAX_CONSUMER_OFFSETS
from metaq.protocol import events as ev
from metaq.protocol import replication as rp
from metaq.protocol.checksum import crc32
from metaq.protocol.replication_offsets import frames
from metaq.serving.replication.link import OFFSETS_SYNC_S
from tests.harness.broker import wait_for
from tests.harness.ha import SESSION_MS, Group, put_until_ok
from tests.harness.replication import caught_up, empty_master_handshake, master_config, stats
from tests.harness.rocketmq import committed

#: How long a commit on the master may take to reach a slave: one sync interval, with room for a loaded machine.
REACH_S = OFFSETS_SYNC_S + 9.0


def slave_args(rport, slave_id, own_rport=None):
    args = ["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", str(slave_id)]
    return args + (["--replication-port", str(own_rport)] if own_rport else [])


def promote(capsys, broker, force=False):
    code = admin.main(["promote", "127.0.0.1:%d" % broker.port] + (["--force"] if force else []))
    return code, capsys.readouterr().out


def commit(broker, group, topic, partition, offset):
    with broker.client() as c:
        r = c.call(ev.CommitOffset(group, topic, partition, offset, c.opaque()))
        assert r.code == 200, r


def query(broker, group, topic, partition):
    """The committed offset ``query_offset`` answers, or None (404)."""
    with broker.client() as c:
        r = c.call(ev.QueryOffset(group, topic, partition, c.opaque()))
        assert r.code in (200, 404), r
        return int(r.body) if r.code == 200 else None


def offsets_of(broker, keys):
    return {k: query(broker, *k) for k in keys}


def holds(broker, want):
    """Wait until ``broker`` answers ``want`` ({(group, topic, partition): offset or None}) within REACH_S."""
    wait_for(lambda: offsets_of(broker, want) == want, REACH_S,
             lambda: "offsets %s on %s; it answers %s" % (want, broker.port, offsets_of(broker, want)))


def fill(broker, n):
    with broker.client() as c:
        for i in range(n):
            c.put_ok("t-a", b"a-%d" % i, i % 2)
            c.put_ok("t-b", b"b-%d" % i, 0)


@pytest.mark.fault
def test_offsets_committed_on_the_master_are_answered_by_the_promoted_slave_and_reach_the_old_master(
        broker_factory, tmp_path, capsys):
    rport, srport = free_port(), free_port()
    m = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                       extra_args=slave_args(rport, 1, srport))
    fill(m, 10)
    caught_up(m, s)
    first = {("g", "t-a", 0): 3, ("g", "t-a", 1): 2, ("h", "t-b", 0): 1}
    for key, offset in first.items():
        commit(m, *key, offset)
    holds(s, first)
    assert stats(s)["replication_offsets_synced"] == "true"
    commit(m, "g", "t-a", 0, 5)  # a change after the whole table: it follows within a sync interval
    holds(s, {**first, ("g", "t-a", 0): 5})

    s.stop()  # the slave goes away cleanly (its offsets are saved) ...
    commit(m, "g", "t-a", 1, 4)  # ... so these never reach it
    commit(m, "old", "t-a", 0, 2)
    m.stop()  # (a clean stop: those two are surely in its data dir, for the rejoin below to replace)
    s.start()
    wait_for(lambda: stats(s)["replication_link"] == "down", 10, "the slave sees no master")
    assert stats(s)["replication_offsets_synced"] == "false"  # nothing came on this link: it kept what it saved
    code, out = promote(capsys, s, force=True)  # restarted, it never heard from its master: forced
    assert code == admin.EXIT_OK, out
    promoted = {("g", "t-a", 0): 5, ("g", "t-a", 1): 2, ("h", "t-b", 0): 1, ("old", "t-a", 0): None}
    assert offsets_of(s, promoted) == promoted  # what reached it: the last two commits did not
    with s.client() as c:
        groups = c.stats("groups")
    assert "g t-a 0 offset 5 max_offset 5" in groups and "h t-b 0 offset 1 max_offset 10" in groups, groups

    with s.client() as c:
        c.put_ok("t-a", b"on the new master", 0)
    commit(s, "g", "t-a", 0, 6)  # the new master moves on
    m.extra_args = slave_args(srport, 2)  # the old master rejoins as its slave: it takes the new master's table
    m.start()
    holds(m, {**promoted, ("g", "t-a", 0): 6})  # its own "old" and g/t-a/1=4 are gone: the group's truth
    assert "took the master's 3 committed consumer offsets" in m.log_text()  # is the new master's
    m.stop()  # a slave saves them like a master: they are there after a restart, before any link
    m.extra_args = slave_args(free_port(), 2)
    m.start()
    assert offsets_of(m, promoted) == {**promoted, ("g", "t-a", 0): 6}


@pytest.mark.fault
def test_a_slave_behind_its_master_never_answers_past_its_own_end(broker_factory, tmp_path, capsys):
    """A commit can reach a slave before the messages it covers (async replication ships only what the master
    has flushed; a group may commit what it read before that): the slave answers its partition's end, so a
    group reads on from there and skips nothing written there later."""
    rport = free_port()
    mcfg = master_config(tmp_path / "m", rport)
    mcfg["store"].update(flush="async", flush_interval_ms=600_000, flush_every_messages=1_000_000)
    m = broker_factory(mcfg, workdir=tmp_path / "m")
    s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                       extra_args=slave_args(rport, 1))
    fill(m, 3)  # written and visible on the master, not flushed: not shipped
    with m.client() as c:
        assert c.stats_dict()["log_flushed_position"] == "0"
    commit(m, "g", "t-a", 0, 2)
    holds(s, {("g", "t-a", 0): 0})  # the slave has the commit (stats groups) but holds no message of t-a 0
    with s.client() as c:
        assert "g t-a 0 offset 2 max_offset 0" in c.stats("groups")
    m.kill()
    code, out = promote(capsys, s, force=True)
    assert code == admin.EXIT_OK, out
    assert query(s, "g", "t-a", 0) == 0
    with s.client() as c:
        c.put_ok("t-a", b"on the new master", 0)
        c.put_ok("t-a", b"and another", 0)
    # the promotion moved the commit back to the partition's end (0): a group that asks only now still reads
    # the new master's first messages (it answered min(2, end) before: 2, skipping both)
    assert query(s, "g", "t-a", 0) == 0
    assert "committed consumer offsets were past their partition's end" in s.log_text()
    s.stop()  # saved at the promotion: a restart answers the same
    s.start()
    assert query(s, "g", "t-a", 0) == 0


@pytest.mark.fault
def test_a_slave_refuses_commits_and_keeps_its_masters_table(broker_factory, tmp_path):
    """Issue 41 point 4: a commit sent to a slave is refused (503 NOT_MASTER, its replication master named) and
    stored nothing; the master's table is what the slave answers. (A manual slave knows its master only by its
    replication address; ``ha: auto`` members name the master's URL: test_offsets_on_the_master.py.)"""
    rport = free_port()
    m = broker_factory(master_config(tmp_path / "m", rport), workdir=tmp_path / "m")
    s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                       extra_args=slave_args(rport, 1))
    fill(m, 4)
    commit(m, "g", "t-a", 0, 2)
    caught_up(m, s)
    holds(s, {("g", "t-a", 0): 2})
    for group in ("g", "mine"):
        with s.client() as c:
            r = c.call(ev.CommitOffset(group, "t-a", 0, 1, c.opaque()))
        assert r.code == 503, r
        assert r.body == (b"NOT_MASTER: this broker is not the master: this broker is a replication slave of "
                          b"127.0.0.1:%d (read-only): send puts to the master; the master is not known here" % rport)
    assert offsets_of(s, {("g", "t-a", 0): 0, ("mine", "t-a", 0): 0}) == {("g", "t-a", 0): 2, ("mine", "t-a", 0): None}
    commit(m, "g", "t-a", 0, 1)
    holds(s, {("g", "t-a", 0): 1, ("mine", "t-a", 0): None})


@pytest.mark.fault
@pytest.mark.slow
def test_a_rocketmq_group_resumes_on_the_promoted_slave_where_it_committed(broker_factory, tmp_path, capsys):
    """The official client (a subprocess) consumes part of a topic from the master and commits as it stops; the
    master is killed, the slave promoted; a new consumer of the group on it gets exactly the rest."""
    from bench.rocketmq_peer import run_peer
    from metaq.client.local import rmq_config
    from tests.harness.rocketmq import received, require_official_client

    require_official_client()
    fast = {"flush": "async", "flush_interval_ms": 50}
    rport = free_port()
    m = broker_factory(rmq_config(tmp_path / "m" / "data", replication={"port": rport}, store=fast),
                       workdir=tmp_path / "m")
    s = broker_factory(rmq_config(tmp_path / "s" / "data", store=fast), workdir=tmp_path / "s",
                       extra_args=slave_args(rport, 1))
    run_peer(tmp_path / "p", "produce", "--ns", ns_of(m), "--topic", "tR", "--count", 200, "--quiet")
    first = received(run_peer(tmp_path / "c1", "consume", "--ns", ns_of(m), "--topic", "tR", "--group", "CGR",
                              "--stop-after", 80, "--timeout", 30))
    assert len(first) >= 80
    before = committed(m, "CGR", "tR", 4)
    assert all(o is not None for o in before.values()) and sum(before.values()) >= 80, before
    wait_for(lambda: committed(s, "CGR", "tR", 4) == before, REACH_S,
             lambda: "the slave holds %s; it answers %s" % (before, committed(s, "CGR", "tR", 4)))
    caught_up(m, s)
    m.kill()
    wait_for(lambda: stats(s)["replication_link"] == "down", 10, "the slave sees the master gone")
    code, out = promote(capsys, s)
    assert code == admin.EXIT_OK and "FORCED" not in out, out
    assert committed(s, "CGR", "tR", 4) == before
    rest = 200 - sum(before.values())
    second = received(run_peer(tmp_path / "c2", "consume", "--ns", ns_of(s), "--topic", "tR", "--group", "CGR",
                               "--expect", rest, "--timeout", 30, "--linger", 1.0))
    assert all(msg["queue_offset"] >= before[msg["queue_id"]] for msg in second)  # nothing before the commit again
    assert {msg["body"] for msg in first} | {msg["body"] for msg in second} == {"m-%d" % i for i in range(200)}
    assert len(second) == rest


@pytest.mark.fault
@pytest.mark.slow
def test_ha_auto_the_newly_elected_master_answers_the_groups_offsets(broker_factory, tmp_path, zk_connect):
    g = Group(broker_factory, tmp_path, zk_connect, n=3, mode="sync")
    first = g.master()
    others = [i for i in range(3) if i != first]
    g.following(first, others)
    master = g.members[first]
    for i in range(6):
        put_until_ok(master, "t-a", b"m-%d" % i, partition=i % 2)
    want = {("g", "t-a", 0): 3, ("g", "t-a", 1): 1, ("h", "t-a", 0): 2}
    for key, offset in want.items():
        commit(master, *key, offset)
    for i in others:
        holds(g.members[i], want)
    master.kill()
    second = g.master(timeout=SESSION_MS / 1000.0 * 3 + 10, exclude=(first,))
    new = g.members[second]
    assert offsets_of(new, want) == want
    put_until_ok(new, "t-a", b"on the new master", partition=0)
    commit(new, "g", "t-a", 0, 4)
    want[("g", "t-a", 0)] = 4
    third = [i for i in others if i != second][0]
    g.following(second, [third])
    holds(g.members[third], want)
    master.start()  # the old master comes back as a follower: it takes the new master's offsets
    g.following(second, [first, third])
    holds(master, want)


# -- a master that lies in its OFFSETS frames ---------------------------------------------------------------------

class FakeMaster:
    """A raw replication port with no secret: the handshake of an empty slave ("our logs agree at 0"), then
    ``wire`` (the frames under test), then it waits for the slave to end the link; again for each connection."""

    def __init__(self, wire):
        self.wire = wire
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.sessions = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            self.sessions += 1
            with sock:
                try:
                    self._serve(sock)
                except OSError:
                    pass

    def _serve(self, sock):
        empty_master_handshake(sock)
        sock.sendall(self.wire)
        while sock.recv(65536):  # its ACKs, until it closes the link
            pass

    def close(self):
        self.server.close()


def offsets_wire(*events):
    return b"".join(rp.serialize(e) for e in events)


E1 = ("g", "t-a", 0, 7, 1000)
E2 = ("h", "t-a", 1, 3, 1001)
LIE = struct.pack(">BI", 0, 1) + struct.pack(">BBiqq", 1, 3, 0, -1, 1000) + b"gt-a"


def lying_frame(payload):
    head = rp.FRAME_HEADER.pack(rp.MAGIC, rp.VERSION, 9, 0, len(payload), 0)[:12]
    return head + struct.pack(">I", crc32(payload, crc32(head))) + payload


def over_the_limit():
    rows = [("g%d" % i, "t-a", 0, 1, 1000) for i in range(MAX_CONSUMER_OFFSETS + 1)]
    return offsets_wire(*frames(rows, snapshot=True))


@pytest.mark.parametrize("wire, reason, kept", [
    (offsets_wire(rp.Offsets((E1,))), "the master sent changed consumer offsets before its whole table", []),
    (offsets_wire(rp.Offsets((E1,), True, True), rp.Offsets((E2,), True, True)),
     "the master sent its whole consumer-offset table twice on one link", [E1]),
    (offsets_wire(rp.Offsets((E1,), True), rp.Offsets((E1[:3] + (9, 1000),), True, True)),
     "the master's consumer-offset table names g/t-a-0 twice", []),
    (offsets_wire(rp.Offsets((E1,), True, True)) + lying_frame(LIE),
     "bad OFFSETS: entry 1 of 1: offset -1 of g/t-a-0 is out of range", [E1]),
    (over_the_limit(), "the master's consumer-offset table has more than %d entries (MAX_CONSUMER_OFFSETS)"
     % MAX_CONSUMER_OFFSETS, []),
], ids=["changes-first", "table-twice", "key-twice", "bad-field", "over-the-limit"])
def test_a_master_lying_in_offsets_frames_is_not_believed(broker_factory, tmp_path, wire, reason, kept):
    fake = FakeMaster(wire)
    try:
        s = broker_factory(small_config(os.path.join(str(tmp_path / "s"), "data")), workdir=tmp_path / "s",
                           extra_args=slave_args(fake.port, 1))
        wait_for(lambda: reason in s.log_text(), 15, lambda: "%r in the slave's log:\n%s" % (reason, s.log_text()))
        assert "replication link to master 127.0.0.1:%d lost: %s" % (fake.port, reason) in s.log_text()
        wait_for(lambda: fake.sessions >= 2, 10, "the slave reconnects")
        with s.client() as c:
            rows = [line.split() for line in c.stats("groups").split("\r\n")[1:-2]]
        assert [(r[0], r[1], int(r[2]), int(r[4])) for r in rows] == [e[:4] for e in kept]
        assert "Traceback" not in s.log_text()
    finally:
        fake.close()
