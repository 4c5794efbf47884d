"""The epochs a peer keeps beside its resume positions (``inbox.Positions``), the EPOCH entries that tell them
(``replication_mqtt``) and the origin's answer from its history (``PeerFollow.proved``): pure, no network."""

import json
from types import SimpleNamespace

import pytest

from metaq.server.replication import limits as replication_limits
from metaq.errors import RemoteProtocolError, UnknownTopic
from metaq.mqttcluster.following import inbox
from metaq.mqttcluster.serve import PeerFollow
from metaq.protocol import replication as rp
from metaq.protocol.journaltopic import MQTT_SESSIONS_TOPIC
from metaq.protocol.replication_mqtt import (EPOCH, MESSAGE, NO_EPOCH, POSITION, RESUMED, RETAINED, Entry,
                                             decode_routes, epoch_entry, epoch_of, join_routes, record_check,
                                             routes_parts, split_routes)
from tests.mqttcluster.test_takeover_units import _cluster
from tests.mqttcluster.test_units import ForkedStore, InboxStore

FIRST, SECOND = (1, 11), (2, 22)  # ForkedStore's history: epoch 1 from log position 0, epoch 2 from 300 (offset 3)


def follow(offset, epoch, check=0, path=None):
    return PeerFollow(ForkedStore({"t": 1}), rp.Routes(1, ("t",), (("t", 0, offset),), checks=(check,),
                                                         epochs=(epoch,), epoch_paths=() if path is None
                                                         else (path,)))


def test_a_position_past_where_its_epoch_ended_resumes_there_else_as_its_check_says():
    """KIP-101: the origin answers the end of the peer's epoch in its history; the peer resumes at the smaller."""
    ours = record_check(1, b"m3")
    assert follow(4, FIRST).cursors[("t", 0)] == 3  # epoch 1 ended at offset 3 here: the middle master's from there
    assert follow(4, FIRST).rewound == {("t", 0)}
    assert follow(2, FIRST).cursors[("t", 0)] == 2  # before its end: where it was (nothing copied twice)
    assert follow(4, SECOND, ours).cursors[("t", 0)] == 4  # the latest epoch: to this log's end, then the check
    assert follow(4, SECOND, record_check(1, b"lost")).cursors[("t", 0)] == 3  # the check still proves it
    assert follow(7, SECOND).cursors[("t", 0)] == 5  # a lie past this log's end: its end, nothing skipped
    assert follow(4, (2, 77)).cursors[("t", 0)] == 3  # a number this history holds with another origin: not it,
    assert follow(4, (9, 99)).cursors[("t", 0)] == 4  # so it ends where the latest earlier one does (KIP-279)
    assert follow(4, (0, 5)).cursors[("t", 0)] == 4  # none earlier: the check alone (none sent: as it says)
    assert follow(4, NO_EPOCH).cursors[("t", 0)] == 4  # an older peer: as before


def test_a_peer_that_takes_epochs_is_told_them_before_the_records_and_the_position():
    store = ForkedStore({"t": 1})
    f = PeerFollow(store, rp.Routes(1, ("t",), (("t", 0, 2),), epochs=(FIRST,)))
    got = f.batch()
    assert [(e.kind, e.offset) for e in got] == [(EPOCH, 1), (POSITION, 2), (MESSAGE, 2), (EPOCH, 3), (MESSAGE, 3),
                                                 (MESSAGE, 4)]  # (the copy of 4 is the peer's position 5)
    assert [epoch_of(e) for e in got if e.kind == EPOCH] == [FIRST, SECOND]
    older = PeerFollow(store, rp.Routes(1, ("t",), (("t", 0, 2),)))
    assert EPOCH not in {e.kind for e in older.batch()}  # a peer of the version before takes none


def test_a_peer_keeps_the_epoch_of_each_position_in_its_copies_and_markers():
    pos = inbox.Positions()
    pos.told(1, "t", 0, 3, SECOND)
    assert pos.epoch_at(1, "t", 0, 2) == NO_EPOCH and pos.epoch_at(1, "t", 0, 3) == SECOND
    pos.copied(1, "t", 0, 4)
    assert pos.epochs(1, pos.of(1)) == (SECOND,)
    pos.untold(1)  # a new link: told again before anything of it
    assert pos.epoch_at(1, "t", 0, 4) == SECOND  # the position's own record
    assert pos.epoch_at(1, "t", 0, 9) == NO_EPOCH  # untold (an origin of the version before): none
    copy = inbox.copy_of(1, "t", 0, 4, 0, b"x", 1_000, check=7, epoch=SECOND)
    mark = inbox.marker(1, "t", 0, 5, 1_000, 7, FIRST)
    assert inbox.place_of(*copy) == ((1, "t", 0, 4), 7, False, SECOND)
    assert inbox.place_of(*mark) == ((1, "t", 0, 4), 7, True, FIRST)
    assert inbox.place_of(*inbox.copy_of(1, "t", 0, 4, 0, b"x", 1_000)) == ((1, "t", 0, 4), 0, False, NO_EPOCH)


def test_epochs_kept_are_bounded_with_the_positions():
    """One epoch per position, and one told per partition: at most ``most`` (MQTT_CLUSTER_MAX_POSITIONS)."""
    pos = inbox.Positions(most=2)
    assert pos.told(1, "a", 0, 0, FIRST) and pos.told(1, "b", 0, 0, FIRST)
    assert not pos.told(1, "c", 0, 0, FIRST)  # one past: not kept (its copy resumes unchecked by epoch)
    assert pos.epoch_at(1, "c", 0, 5) == NO_EPOCH
    pos.copied(1, "a", 0, 0)
    pos.copied(1, "b", 0, 0)
    assert not pos.copied(1, "c", 0, 0) and len(pos) == 2
    assert pos.told(1, "a", 0, 1, SECOND)  # a partition kept is told again


def test_routes_carry_an_epoch_per_position_in_parts_too():
    routes = rp.Routes(3, ("a/#",), (("a", 0, 4), ("b", 1, 9)), 0, checks=(5, 6), epochs=(FIRST, NO_EPOCH))
    p = rp.ReplicationParser()
    p.receive_data(rp.serialize(routes))
    assert p.next_event() == routes
    parts = split_routes(routes, most=110)
    assert len(parts) > 1
    joined = None
    for part in parts:
        joined = join_routes(joined, decode_routes(routes_parts(part)[0]))
    assert joined.positions == routes.positions and joined.epochs == routes.epochs
    assert decode_routes(json.dumps({"broker": 3, "filters": [], "epochs": []}).encode()).epochs == ()
    assert decode_routes(json.dumps({"broker": 3, "filters": []}).encode()).epochs is None  # an older peer


@pytest.mark.parametrize("bad", [[[1, 2]], [[1, -2]], [[1]], [1], [[1, 2**63]], "x"])
def test_a_lie_in_a_routes_epochs_is_a_clear_error(bad):
    with pytest.raises(RemoteProtocolError, match="epoch"):
        decode_routes(json.dumps({"broker": 3, "filters": [], "positions": [["a", 0, 4], ["b", 0, 1]],
                                  "epochs": bad}).encode())


def test_a_lie_in_an_epoch_entry_is_a_clear_error_and_the_copies_before_it_stand():
    """An EPOCH entry whose origin is not 8 bytes or is negative, or whose number is negative, ends the link (a fatal
    error naming it); the entries before it were applied, and the link resumes from the positions."""
    good = epoch_entry("t", 0, 3, SECOND)
    assert epoch_of(good) == SECOND
    for bad in (good._replace(data=b"\x00" * 4), good._replace(data=b"\xff" * 8), good._replace(ts=-1)):
        with pytest.raises(RemoteProtocolError, match="EPOCH entry"):
            epoch_of(bad)
    p = rp.ReplicationParser()
    p.receive_data(rp.serialize(rp.Records((Entry(MESSAGE, "t", 0, 2, 0, 1, b"m"), good._replace(data=b"x")))))
    entries = iter(p.next_event().entries)
    assert next(entries).kind == MESSAGE
    with pytest.raises(RemoteProtocolError):
        epoch_of(next(entries))


def test_a_resumed_position_names_the_epoch_of_the_record_before_it():
    f = follow(4, FIRST)
    got = f.batch()
    assert (got[0].kind, got[0].offset, epoch_of(got[0])) == (EPOCH, 2, FIRST)
    assert (got[1].kind, got[1].offset, got[1].flag) == (POSITION, 3, RESUMED)


def test_copies_keep_the_epoch_told_and_a_lie_in_it_loses_nothing_before():
    """A peer's copies carry the epoch the EPOCH entry before them told (its position keeps it); a malformed EPOCH
    entry ends the frame there, the copies before it written and their positions moved."""
    data = b"\x00\x00\x00\x02ab-payload"
    cluster = _cluster()
    appended = []
    cluster.put_path = SimpleNamespace(check_write=lambda *a, **k: None, append_burst=lambda frames, src, now: (0, []),
                                       append=lambda *a, **k: appended.append(a[2:4]) or SimpleNamespace(offset=0),
                                       burst_written=lambda keys, now, *_serve: None)
    entries = [epoch_entry("sensors", 1, 40, FIRST), Entry(MESSAGE, "sensors", 1, 41, 1, 1700000000000, data),
               epoch_entry("sensors", 1, 42, SECOND), Entry(MESSAGE, "sensors", 1, 42, 1, 1700000000000, data),
               epoch_entry("sensors", 1, 43, SECOND)._replace(data=b"lie")]
    with pytest.raises(RemoteProtocolError, match="EPOCH entry"):
        cluster.apply(2, entries)
    assert [inbox.place_of(*made)[3] for made in appended] == [FIRST, SECOND]
    assert cluster.positions.get(2, "sensors", 1) == 43
    assert cluster.positions.epochs(2, cluster.positions.of(2)) == (SECOND,)


def test_a_retained_offset_keeps_its_epoch_and_resumes_no_further_than_where_it_ended():
    """The ``%MQTT%`` offset a peer asks retained records from carries the epoch of the retained record before it, as
    a position does: past where that epoch ended here it resumes there."""
    store = ForkedStore({"t": 1})
    assert PeerFollow(store, rp.Routes(1, (), (), 4, retained_epoch=FIRST)).retained == 3
    assert PeerFollow(store, rp.Routes(1, (), (), 4, retained_epoch=SECOND)).retained == 4
    assert PeerFollow(store, rp.Routes(1, (), (), -1, retained_epoch=FIRST)).retained == -1  # none asked
    routes = rp.Routes(1, ("a/#",), (("a", 0, 4),), 4, retained_epoch=FIRST, epochs=(SECOND,))
    p = rp.ReplicationParser()
    p.receive_data(rp.serialize(routes))
    assert p.next_event() == routes
    assert all(part.retained_epoch == FIRST for part in split_routes(routes, most=100))
    with pytest.raises(RemoteProtocolError, match="epoch"):
        decode_routes(json.dumps({"broker": 3, "filters": [], "retained_epoch": [1]}).encode())
    cluster = _cluster()
    cluster.apply(2, [epoch_entry(MQTT_SESSIONS_TOPIC, 0, 6, SECOND),
                      Entry(RETAINED, MQTT_SESSIONS_TOPIC, 0, 7, 0, 1, b"U{}")])
    assert cluster.retained_from(2) == (8, record_check(1, b"U{}"), SECOND, ((2, 22, 7),))


class ChurnStore(ForkedStore):
    """A ForkedStore whose topics can be deleted: a deleted one's partitions are an error to read, as the store's."""

    def max_offset(self, topic, partition):
        if topic not in self.topics:
            raise UnknownTopic(topic)
        return super().max_offset(topic, partition)


def test_a_partition_the_follow_drops_at_its_deletion_leaves_no_epoch_told_behind():
    """A topic deleted is dropped by the next batch: what the follow told of it, and where it started it, go too (they
    stay within the followed partitions, however many topics come and go during one link)."""
    store = ChurnStore({"t": 1})
    f = PeerFollow(store, rp.Routes(1, ("#",), (), epochs=()), since=(0, {}))
    f.cursors[("t", 0)] = 2  # (the started one's cursor moved: records to read)
    f.batch()
    assert set(f.told) == {("t", 0)} and set(f.started) == {("t", 0)}
    del store.topics["t"]
    f.batch()
    assert f.cursors == {} and f.told == {} and f.started == {}


class TrimmedStore(ForkedStore):
    """A ForkedStore whose epoch history was trimmed to its last MAX_REPLICATION_EPOCHS entries: the first kept
    begins at log position 300 (offset 3), the records before it of epochs no longer held."""

    epochs = SimpleNamespace(entries=[(5, 300, 55), (6, 400, 66)])


def test_records_older_than_the_epoch_history_held_are_told_of_no_epoch_once():
    """A record before the first epoch the history holds is of none known here: one EPOCH entry of NO_EPOCH says so
    for all of them (not one entry per record, each naming the first kept epoch, which did not write them)."""
    got = PeerFollow(TrimmedStore({"t": 1}), rp.Routes(1, ("t",), (), epochs=()), since=(0, {})).batch()
    told = [(e.offset, epoch_of(e)) for e in got if e.kind == EPOCH]
    assert told == [(0, NO_EPOCH), (3, (5, 55)), (4, (6, 66))]
    pos = inbox.Positions()
    pos.told(1, "t", 0, 0, NO_EPOCH)
    pos.copied(1, "t", 0, 2)
    assert pos.epochs(1, pos.of(1)) == (NO_EPOCH,)  # the check alone proves it


class Counted(list):
    """A history whose entries read are counted (each ``[i]`` and each one an iteration passes)."""

    reads = 0

    def __getitem__(self, i):
        Counted.reads += 1
        return super().__getitem__(i)

    def __iter__(self):
        for e in super().__iter__():
            Counted.reads += 1
            yield e


def test_a_position_is_proved_in_a_few_reads_of_the_longest_epoch_history():
    """A route of MQTT_CLUSTER_MAX_FOLLOWED positions is proved on the loop: each in steps of log
    MAX_REPLICATION_EPOCHS of the history (a binary search), not a pass over all of it, whether its epoch is held,
    unknown or proved by its check."""
    most = replication_limits.MAX_REPLICATION_EPOCHS
    entries = Counted([(1, 0, 11)] + [(n, 100 * n, 1000 + n) for n in range(2, most + 1)])
    store = ForkedStore({"t": 1})
    store.epochs = SimpleNamespace(entries=entries)
    for epoch, check in (((1, 11), 0), ((3, 99), 0), ((1, 11), record_check(1, b"lost"))):
        Counted.reads = 0
        PeerFollow(store, rp.Routes(1, ("t",), (("t", 0, 9),), checks=(check,), epochs=(epoch,)))
        assert Counted.reads <= 40, (epoch, check)


def test_an_epoch_this_log_does_not_hold_resumes_no_further_than_where_the_peers_copy_entered_it():
    """Two failovers in a row where the middle master had lagged as a slave: it began its epoch at offset 1, before
    where the earlier epoch ended here (3), and the peer copied its records from there. This log does not hold that
    epoch, so its records from 1 on are not this log's: the peer resumes at 1 and gets this log's 1 and 2, which it
    never copied (KIP-279's second question, answered from the peer's epoch path)."""
    middle = (2, 77)  # epoch 2 of another master than this history's epoch 2
    assert follow(4, middle).cursors[("t", 0)] == 3  # where epoch 1 ended here: all an older peer can be told
    assert follow(4, middle, path=((2, 77, 1),)).cursors[("t", 0)] == 1
    assert follow(4, middle, path=((2, 77, 1),)).rewound == {("t", 0)}
    assert follow(4, middle, path=((2, 77, 3),)).cursors[("t", 0)] == 3  # entered at the end: the end
    assert follow(4, (9, 99), path=((9, 99, 2),)).cursors[("t", 0)] == 2  # a later epoch never seen here: its entry
    ours = record_check(1, b"m3")
    assert follow(4, SECOND, ours, ((1, 11, 0), (2, 22, 1))).cursors[("t", 0)] == 4  # held here: KIP-101's end
    assert follow(2, FIRST, path=((1, 11, 0),)).cursors[("t", 0)] == 2  # held, before its end: where it was
    assert follow(4, middle, path=((1, 11, 0),)).cursors[("t", 0)] == 3  # a path not the position's: as none


def test_a_chain_of_epochs_this_log_never_held_resumes_where_the_copy_entered_the_oldest_of_them():
    """The peer copied from two deposed masters in a row (epochs (2, 77) then (3, 88)), neither held here: it resumes
    where it entered the first of them, not only the last; a held epoch before them bounds it by its end here too."""
    chain = ((2, 77, 1), (3, 88, 2))
    assert follow(4, (3, 88), path=chain).cursors[("t", 0)] == 1
    assert follow(4, (3, 88), path=chain[1:]).cursors[("t", 0)] == 2  # knowing the last only: where it entered that
    assert follow(4, (2, 77), path=((1, 11, 0), (2, 77, 2))).cursors[("t", 0)] == 2
    assert follow(4, (2, 77), path=((1, 11, 0), (2, 77, 3))).cursors[("t", 0)] == 3  # epoch 1's end here


def test_a_position_keeps_the_epochs_its_copy_went_through_with_where_it_entered_each():
    pos = inbox.Positions()
    for offset in (5, 6, 7):
        pos.copied(1, "t", 0, offset, epoch=FIRST)
    assert pos.epoch_paths(1, pos.of(1)) == (((1, 11, 5),),)
    pos.copied(1, "t", 0, 12, epoch=SECOND)  # another epoch, 8..11 passed unread: entered at 8
    pos.copied(1, "t", 0, 13, epoch=SECOND)
    assert pos.epoch_paths(1, pos.of(1)) == (((1, 11, 5), (2, 22, 8)),)
    pos.copied(1, "t", 0, 20, epoch=(3, 33))
    pos.copied(1, "t", 0, 9, epoch=SECOND, rewound=True)  # resumed back into epoch 2: epoch 3's entry goes
    assert pos.of(1) == (("t", 0, 10),) and pos.epoch_paths(1, pos.of(1)) == (((1, 11, 5), (2, 22, 8)),)
    pos.copied(1, "t", 0, 6, epoch=FIRST, rewound=True)  # back into epoch 1
    assert pos.epoch_paths(1, pos.of(1)) == (((1, 11, 5),),)
    for n, offset in enumerate((30, 40, 50, 60), 4):
        pos.copied(1, "t", 0, offset, epoch=(n, 1))
    assert pos.epoch_paths(1, pos.of(1)) == (((5, 1, 31), (6, 1, 41), (7, 1, 51)),)  # MQTT_CLUSTER_EPOCHS_KEPT
    pos.copied(1, "t", 0, 61, epoch=NO_EPOCH)  # none known
    assert pos.epoch_paths(1, pos.of(1)) == ((),)
    copies = [inbox.copy_of(1, "t", 0, n, 0, b"x", 1_000, epoch=FIRST if n < 4 else SECOND) for n in range(2, 6)]
    recovered = inbox.Positions()
    assert inbox.recover(InboxStore(copies), recovered) == 4  # rebuilt from the inbox at start
    assert recovered.of(1) == (("t", 0, 6),) and recovered.epoch_paths(1, recovered.of(1)) == (((1, 11, 2),
                                                                                                 (2, 22, 4)),)
    cluster = _cluster()
    cluster.apply(2, [epoch_entry(MQTT_SESSIONS_TOPIC, 0, 3, FIRST), Entry(RETAINED, MQTT_SESSIONS_TOPIC, 0, 3, 0, 1,
                                                                           b"U{}"),
                      epoch_entry(MQTT_SESSIONS_TOPIC, 0, 5, SECOND), Entry(RETAINED, MQTT_SESSIONS_TOPIC, 0, 8, 0, 1,
                                                                            b"U{}")])
    assert cluster.retained_from(2) == (9, record_check(1, b"U{}"), SECOND, ((1, 11, 3), (2, 22, 4)))


def test_a_route_in_parts_keeps_each_part_within_its_bound_with_the_epoch_paths():
    positions = tuple(("t%d" % (i % 97), i % 5, 10 ** (i % 12)) for i in range(400))
    routes = rp.Routes(3, ("a/#",), positions, 5, checks=tuple(1 + i for i in range(400)),
                       epochs=tuple((i, 10 ** (i % 9)) for i in range(400)),
                       epoch_paths=tuple(((i, 7, p[2] // 3), (i + 1, 10 ** (i % 9), p[2] // 2))[:1 + i % 2]
                                         for i, p in enumerate(positions)))
    for most in range(300, 1400, 37):
        parts = split_routes(routes, most=most)
        assert all(len(routes_parts(part)[0]) <= most for part in parts), most
        joined = None
        for part in parts:
            joined = join_routes(joined, decode_routes(routes_parts(part)[0]))
        assert joined.epoch_paths == routes.epoch_paths and joined.positions == positions


def test_routes_carry_the_epoch_paths_and_an_older_peer_sends_none():
    routes = rp.Routes(3, ("a/#",), (("a", 0, 4), ("b", 1, 9)), 5, checks=(5, 6), epochs=(FIRST, SECOND),
                       epoch_paths=(((1, 11, 1),), ((1, 11, 0), (2, 22, 7))), retained_epoch=FIRST,
                       retained_epoch_path=((1, 11, 2),))
    p = rp.ReplicationParser()
    p.receive_data(rp.serialize(routes))
    assert p.next_event() == routes
    older = decode_routes(json.dumps({"broker": 3, "filters": [], "positions": [["a", 0, 4]],
                                      "epochs": [[1, 11]]}).encode())
    assert older.epoch_paths == () and older.retained_epoch_path == ()
    assert PeerFollow(ForkedStore({"t": 1}), rp.Routes(1, (), (), 4, retained_epoch=(2, 77),
                                                       retained_epoch_path=((2, 77, 1),))).retained == 1


@pytest.mark.parametrize("bad", [{"epoch_paths": [[]]}, {"epoch_paths": [[], [[1, 2, -1]]]},
                                 {"epoch_paths": [[], [[1, 2]]]}, {"epoch_paths": [[], [[1, 2, "3"]]]},
                                 {"epoch_paths": 3}, {"epoch_paths": [[], [[1, 2, 2**63]]]},
                                 {"epoch_paths": [[], [[1, 1, 1]] * 4]}, {"retained_epoch_path": [[1, 2, True]]},
                                 {"retained_epoch_path": [1, 2, 3]}])
def test_a_lie_in_an_epoch_path_is_a_clear_error(bad):
    with pytest.raises(RemoteProtocolError, match="epoch_path"):
        decode_routes(json.dumps({"broker": 3, "filters": [], "positions": [["a", 0, 4], ["b", 0, 1]],
                                  **bad}).encode())


class ReturningStore(ForkedStore):
    """The history of a master that lagged and comes back: its epoch 2 from offset 0, its epoch 4 from offset 2."""

    epochs = SimpleNamespace(entries=[(2, 0, 33), (4, 200, 33)])


def test_a_path_older_than_every_epoch_held_here_resumes_where_the_copy_entered_its_oldest():
    """The peer copied master 11's epoch 1 from 0, then master 44's epoch 3 from 5; the master now (33) holds
    neither, nor anything as old as epoch 1: none of the peer's copies are its records, so it resumes at 0 (where the
    path began), not at 5, nor by its check alone at its own epoch's start."""
    follow = PeerFollow(ReturningStore({"t": 1}), rp.Routes(1, ("t",), (("t", 0, 6),), epochs=((3, 44),),
                                                            epoch_paths=(((1, 11, 0), (3, 44, 5)),)))
    assert follow.cursors[("t", 0)] == 0 and follow.rewound == {("t", 0)}
    only_last = PeerFollow(ReturningStore({"t": 1}), rp.Routes(1, ("t",), (("t", 0, 6),), epochs=((3, 44),),
                                                               epoch_paths=(((3, 44, 5),),)))
    assert only_last.cursors[("t", 0)] == 2  # knowing the last only: epoch 2's end here
    lost = PeerFollow(ReturningStore({"t": 1}), rp.Routes(1, ("t",), (("t", 0, 9),), epochs=((1, 11),),
                                                          epoch_paths=(((1, 11, 7),),)))
    assert lost.cursors[("t", 0)] == 5  # entered past this log's end: its end, nothing skipped


class TrimmedInbox(InboxStore):
    """An inbox whose first record retention removed."""

    def min_offset(self, topic, partition):
        return 1


def test_a_recovered_path_says_where_the_copy_entered_each_epoch_and_0_when_retention_took_the_first():
    copies = [inbox.copy_of(1, "t", 0, n, 0, b"x", 1_000, epoch=FIRST if n < 4 else SECOND) for n in range(2, 6)]
    resumed = inbox.marker(1, "t", 0, 3, 1_000, 0, FIRST)  # the origin resumed the copy at 3 (record 2 of epoch 1)
    recovered = inbox.Positions()
    assert inbox.recover(InboxStore(copies + [resumed]), recovered) == 5
    assert recovered.of(1) == (("t", 0, 3),) and recovered.epoch_paths(1, recovered.of(1)) == (((1, 11, 2),),)
    trimmed = inbox.Positions()
    assert inbox.recover(TrimmedInbox([copies[0]] + copies[2:]), trimmed) == 2  # 4, 5 (epoch 2): 2's copy gone
    assert trimmed.epoch_paths(1, trimmed.of(1)) == (((2, 22, 0),),)  # where it entered epoch 2 is not known


def test_a_retained_offset_sent_back_keeps_the_epochs_entered_before_it():
    cluster = _cluster()
    cluster.apply(2, [epoch_entry(MQTT_SESSIONS_TOPIC, 0, 6, SECOND),
                      Entry(RETAINED, MQTT_SESSIONS_TOPIC, 0, 7, 0, 1, b"U{}"),
                      Entry(RETAINED, MQTT_SESSIONS_TOPIC, 0, 9, 0, 1, b"U{}")])
    assert cluster.retained_from(2)[3] == ((2, 22, 7),)
    cluster.apply(2, [epoch_entry(MQTT_SESSIONS_TOPIC, 0, 3, FIRST),  # a new link, resumed back at 4
                      Entry(RETAINED, MQTT_SESSIONS_TOPIC, 0, 4, 0, 1, b"U{}"),
                      epoch_entry(MQTT_SESSIONS_TOPIC, 0, 5, SECOND),
                      Entry(RETAINED, MQTT_SESSIONS_TOPIC, 0, 6, 0, 1, b"U{}")])
    assert cluster.retained_from(2)[3] == ((1, 11, 4), (2, 22, 5))
