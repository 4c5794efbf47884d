"""A peer's follow reads the ``%MQTT%`` journal only where a retained record may lie (``PeerFollow._retained``, by the
port's ``RetainedMark``): the sessions' records a reconnect storm writes past the last retained record are passed
over unread, while every retained record and clear is still sent, those written before the port began writing too
(a restart, a promotion: the journal came from the disk or from a master)."""

import pytest
from gevent import socket as gsocket
from gevent.event import Event

from metaq.clock import now_ms
from metaq.mqtt.follow import SavedSession
from metaq.mqtt.port import MqttPort
from metaq.mqttcluster.direct import TurnFollows
from metaq.mqttcluster.serve import PeerFollow
from metaq.protocol import replication as rp
from metaq.protocol.journaltopic import MQTT_SESSIONS_TOPIC
from metaq.protocol.replication_mqtt import MESSAGE, RETAINED
from metaq.server.guard import Guard
from tests.server.test_inprocess import Parts, config


class Role:
    def __init__(self, master):
        self.master = master

    def __call__(self):
        return self.master


class CountingStore:
    """The store, counting the ``%MQTT%`` records read from it."""

    def __init__(self, store):
        self._store = store
        self.journal_reads = 0

    def __getattr__(self, name):
        return getattr(self._store, name)

    def read_records(self, topic, partition, offset, max_count, max_bytes):
        records, nxt = self._store.read_records(topic, partition, offset, max_count, max_bytes)
        if topic == MQTT_SESSIONS_TOPIC:
            self.journal_reads += len(records)
        return records, nxt


@pytest.fixture
def parts(tmp_path):
    p = Parts(config(tmp_path / "data", flush="async"))
    yield p
    p.close()


def port_of(parts, role=None):
    return MqttPort(parts.core, parts.config.mqtt, parts.store, parts.path, Guard(parts.config.security),
                    parts.waiters, parts.config.store.max_transfer_size, role or Role(True))


def sessions(port, n, prefix="dev"):
    """``n`` sessions' records written, as a reconnect storm's CONNECTs write them."""
    for i in range(n):
        port.adopt(SavedSession("%s-%d" % (prefix, i), None, 5, 600, now_ms(), True,
                                [("t/#", 1, False, ["t"], False, None)], {}, [], [], []))


def retain(port, name, payload):
    port.put(name, payload, 1, "pub", None, port.guard.acting_for(None, "127.0.0.1"), retain=True)


def follow_of(store, port, retained=0):
    return PeerFollow(store, rp.Routes(1, (), (), retained), retained_end=port.retained_mark.end)


def retained_sent(follow):
    return [bytes(e.data[:1]) + b":" + bytes(e.data).split(b'"t":"', 1)[1].split(b'"', 1)[0]
            for e in follow.batch(None) if e.kind == RETAINED]


def journal_end(parts):
    return parts.store.max_offset(MQTT_SESSIONS_TOPIC, 0)


def test_sessions_records_past_the_last_retained_one_are_passed_over_unread(parts):
    port = port_of(parts)
    store = CountingStore(parts.store)
    follow = follow_of(store, port)
    sessions(port, 40)
    assert retained_sent(follow) == [] and store.journal_reads == 0
    assert follow.retained == journal_end(parts) == 40  # where the peer's next retained record is looked for
    retain(port, "r/a", b"on")
    sessions(port, 40)
    assert retained_sent(follow) == [b"R:r/a"]
    assert store.journal_reads == 1  # the retained record alone: the last that may be one
    sessions(port, 40)
    assert retained_sent(follow) == [] and store.journal_reads == 1
    retain(port, "r/a", b"")  # cleared
    assert retained_sent(follow) == [b"U:r/a"] and store.journal_reads == 2
    assert follow.retained == journal_end(parts)


def test_a_follow_without_the_ports_mark_reads_every_record(parts):
    """An older caller (or a broker alone's tests) gives no ``retained_at``: every record read, as before."""
    port = port_of(parts)
    store = CountingStore(parts.store)
    follow = PeerFollow(store, rp.Routes(1, (), (), 0))
    sessions(port, 10)
    retain(port, "r/a", b"on")
    assert retained_sent(follow) == [b"R:r/a"] and store.journal_reads == 11


def test_after_a_restart_the_records_from_before_are_read_in_full(parts):
    first = port_of(parts)
    retain(first, "r/old", b"on")
    sessions(first, 20)
    again = port_of(parts)  # the broker's next start over the same log
    store = CountingStore(parts.store)
    follow = follow_of(store, again)
    sessions(again, 20)
    assert retained_sent(follow) == [b"R:r/old"]
    assert store.journal_reads == 21  # up to the end when it began writing, then nothing
    assert follow.retained == journal_end(parts) == 41


def test_a_promoted_slave_reads_what_it_replicated_and_passes_over_what_it_writes(parts):
    """A slave's journal grows by its master's records: any of them may be retained, before and after its promotion;
    once it writes the journal itself, only what it writes decides."""
    master = port_of(parts)
    role = Role(False)
    slave = port_of(parts, role)
    sessions(master, 10, "m")
    retain(master, "r/m", b"on")
    sessions(master, 10, "m")
    store = CountingStore(parts.store)
    follow = follow_of(store, slave)
    assert retained_sent(follow) == [b"R:r/m"] and store.journal_reads == 21
    retain(master, "r/m2", b"on")  # a follow that began before the promotion: still a slave's journal
    sessions(master, 10, "m")
    parts.store.follow_now(slave.follow)
    role.master = True
    slave.role_changed(None)
    again = follow_of(store, slave)  # a peer following the promoted broker from its last position
    again.retained = follow.retained
    sessions(slave, 10, "s")
    assert retained_sent(again) == [b"R:r/m2"] and store.journal_reads == 21 + 11
    retain(slave, "r/s", b"on")
    sessions(slave, 10, "s")
    assert retained_sent(again) == [b"R:r/s"] and store.journal_reads == 21 + 11 + 1
    sessions(slave, 30, "s")
    assert retained_sent(again) == [] and store.journal_reads == 33


def test_a_slave_may_hold_a_retained_record_anywhere(parts):
    assert port_of(parts, Role(False)).retained_mark.end() is None
    master = port_of(parts)
    assert master.retained_mark.end() == 0  # an empty journal, written by this master only
    sessions(master, 3)
    retain(master, "r/a", b"on")
    sessions(master, 3)
    assert master.retained_mark.end() == 4
    master.role_changed(3)  # made a slave: its journal grows by another master's records now
    assert master.retained_mark.end() is None


def test_a_cut_of_the_log_makes_every_record_it_kept_one_a_follow_reads(parts):
    """The log cut (``_relearn``: a deposed master's tail dropped): whatever the journal holds now may be a retained
    record, so a follow from its start reads every record up to the end, not up to the mark from before the cut."""
    port = port_of(parts)
    retain(port, "r/a", b"on")
    sessions(port, 10)
    assert port.retained_mark.end() == 1
    port._relearn(parts.store.written_position)
    assert port.retained_mark.end() == journal_end(parts) == 11
    store = CountingStore(parts.store)
    assert retained_sent(follow_of(store, port)) == [b"R:r/a"] and store.journal_reads == 11


def test_unread_sessions_records_keep_no_publish_off_the_turns_direct_path(parts):
    """A follow waiting caught up while sessions' records are written (a reconnect storm) is still sent a publish
    from the turn that writes it: the records it has not read can hold no retained message."""
    port = port_of(parts)
    parts.store.put("lat", 0, 0, b"first", now_ms())
    sessions(port, 1, "before")  # the journal's partition made before the follow's route
    follow = PeerFollow(parts.store, rp.Routes(1, ("lat/x",), (), 0), retained_end=port.retained_mark.end)
    follow.batch(None)
    assert follow.batch(None) == []
    turn, (a, b) = TurnFollows(), gsocket.socketpair()
    turn.waiting(follow, a, Event())
    sessions(port, 5)  # not read by the follow yet (its greenlet would be woken by them)
    now = now_ms()
    staged = [port.stage("lat/x", b"one", 1, "pub", None, port.guard.acting_for(None, "127.0.0.1"), {}, now)]
    frames, src, _general, _names = port.frames_of(staged, 1 << 20)
    _taken, runs = parts.store.put_burst(frames, src, now)
    turn.serve({r.key for r in runs}, staged, runs, now, {})
    assert turn.frames == 1 and turn.sent_records == 1
    retain(port, "r/a", b"on")  # unsent now: the turn leaves the next publish to the follow, after it
    now = now_ms()
    staged = [port.stage("lat/x", b"two", 1, "pub", None, port.guard.acting_for(None, "127.0.0.1"), {}, now)]
    frames, src, _general, _names = port.frames_of(staged, 1 << 20)
    _taken, runs = parts.store.put_burst(frames, src, now)
    turn.serve({r.key for r in runs}, staged, runs, now, {})
    assert turn.frames == 1
    assert [e.kind for e in follow.batch(None)] == [MESSAGE, RETAINED]  # the follow sends both
    a.close()
    b.close()
