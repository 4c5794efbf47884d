"""A peer's RECORDS frame of plain copies (MESSAGEs of MQTT records of partitions already positioned) is taken in one
step (``MqttCluster._take``, ``copyturn.take``): in process over real stores and put paths, the inbox, the resume
positions and what the waiting subscribers are served are those of the general path entry by entry, byte for byte;
any other frame is the general path's, and a frame of more than MQTT_CLUSTER_DIRECT_COPIES entries too. Stat
``mqtt_cluster_frames_one_step`` counts the frames taken so."""

from types import SimpleNamespace

import pytest

from metaq.clock import now_ms
from metaq.mqtt.records import record_data
from metaq.mqtt.topicmap import DEFAULT_MAP
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqttcluster.following import inbox
from metaq.mqttcluster.following.copyturn import kept_copy, messages_of
from metaq.mqttcluster.following.peers import MqttCluster
from metaq.protocol import replication as rp
from metaq.protocol.replication_mqtt import (MESSAGE, NO_EPOCH, POSITION, SHARED, Entry, RecordEntries,
                                             epoch_entry, record_check, shared_data)
from tests.harness.store import inprocess_put_path
from tests.mqttcluster.test_copies import RECORDS

V5 = {"user_property": [("k", "v")], "content_type": "text/plain", "correlation_data": b"\x00c",
      "message_expiry_interval": 600}


def received(entries):
    """``entries`` as a link receives them: one RECORDS frame's bytes, parsed (``RecordEntries``)."""
    parser = rp.ReplicationParser()
    parser.receive_data(b"".join(rp.frame_parts(rp.Records(tuple(entries)))))
    event = parser.next_event()
    assert isinstance(event.entries, RecordEntries)
    return event.entries


class Side:
    """One broker's cluster over its own store; ``general``: every frame applied entry by entry (as a tuple)."""

    def __init__(self, tmp_path, name, general):
        self.store, path = inprocess_put_path(tmp_path / name, now_ms())
        self.served = []
        self.cluster = MqttCluster(1, self.store, path, SimpleNamespace(topics=DEFAULT_MAP), None, lambda: True,
                                   serve=lambda copies: self.served.append(copies) or {})
        self.general = general

    def apply(self, entries):
        frame = received(entries)
        return self.cluster.apply(0, tuple(frame) if self.general else frame)

    def stat(self):
        return dict(self.cluster.summary_values())["mqtt_cluster_frames_one_step"]

    def inbox(self):
        out = []
        for p in range(self.store.partitions_of(inbox.INBOX)):
            records, _next = self.store.read_records(inbox.INBOX, p, 0, 10_000, 1 << 24)
            out.extend((p, r.queue_offset, r.flag, bytes(r.data)) for r in records)
        return out

    def positions(self):
        pos = self.cluster.positions
        of = pos.of(0)
        return sorted(zip(of, pos.checks(0, of), pos.epochs(0, of), strict=True))

    def served_messages(self):
        """Each inbox partition's copies served from the turns that wrote them, in order (the message ids: each
        store's own)."""
        out = {}
        for served in self.served:
            for key, copies in served.items():
                out.setdefault(key, []).extend((c[0], c[1][0], c[2], c[3], bytes(c[4]), c[5]) for c in copies)
        return out


@pytest.fixture
def sides(tmp_path):
    both = Side(tmp_path, "fast", False), Side(tmp_path, "general", True)
    yield both
    for side in both:
        side.store.close(now_ms())


def msg(topic, partition, offset, i=None, props=None, at=None):
    """A MESSAGE entry of an MQTT record of name ``<topic>/t<i % 3>`` (``i``: ``offset``'s), published ``at``."""
    i = offset if i is None else i
    at = now_ms() if at is None else at
    flag, data = record_data("%s/t%d" % (topic, i % 3), b"p%d" % i, 1, "dev", props, False, at)
    return Entry(MESSAGE, topic, partition, offset, flag, at, data)


def _both(sides, entries):
    return [side.apply(entries) for side in sides]


def _same(fast, general):
    assert fast.inbox() == general.inbox()
    assert fast.positions() == general.positions()
    assert fast.served_messages() == general.served_messages()


def test_a_plain_frame_is_taken_in_one_step_with_the_inbox_positions_and_serve_of_the_general_path(sides):
    fast, general = sides
    assert _both(sides, [msg("walk", 0, 0), msg("walk", 1, 0), msg("pump", 0, 0)]) == [3, 3]
    assert fast.stat() == 0  # a partition's first copy: the general path's (it holds no position yet)
    assert _both(sides, [msg("walk", 0, 1, props=V5)]) == [1, 1]  # a lone message
    # gaps (records the route passed over), partitions of two topics, one twice
    assert _both(sides, [msg("walk", 0, 3), msg("walk", 1, 2, props=V5), msg("pump", 0, 5), msg("walk", 0, 4)]) == \
        [4, 4]
    assert fast.stat() == 2 and general.stat() == 0
    _same(fast, general)


def test_a_frame_of_anything_else_is_the_general_paths(sides):
    fast, general = sides
    assert _both(sides, [msg("walk", 0, 0)]) == [1, 1]
    data = msg("walk", 0, 6).data
    others = [
        [epoch_entry("walk", 0, 1, (3, 7)), msg("walk", 0, 1)],  # an EPOCH told (the lone frames after carry it)
        [Entry(MESSAGE, "walk", 0, 2, 0, now_ms(), b"a text put")],  # a copy made again
        [msg("walk", 0, 3), Entry(POSITION, "walk", 0, 4)],
        [msg("walk", 0, 1)],  # copied already
        [msg("walk", 0, 5), msg("walk", 0, 5, 6)],  # an offset twice
        [Entry(SHARED, "walk", 0, 6, 1, now_ms(), shared_data((("g", "walk/#"),), data))],
        [msg("walk", 0, 7, props={"message_expiry_interval": 1}, at=now_ms() - 5000)],  # expired: a marker
    ]
    for entries in others:
        got = _both(sides, entries)
        assert got[0] == got[1], entries
    assert fast.stat() == 0
    assert _both(sides, [msg("walk", 0, 9)]) == [1, 1]
    assert fast.stat() == 1
    _same(fast, general)
    assert [epoch for (t, _p, _o), _c, epoch in fast.positions() if t == "walk"] == [(3, 7)]


def test_a_frame_of_the_bound_is_taken_in_one_step_and_one_past_it_is_not(sides):
    fast, general = sides
    most = mqttcluster_limits.MQTT_CLUSTER_DIRECT_COPIES
    assert _both(sides, [msg("walk", 0, 0), msg("walk", 1, 0)]) == [2, 2]
    assert _both(sides, [msg("walk", i % 2, 1 + i // 2) for i in range(most)]) == [most, most]
    assert fast.stat() == 1
    assert _both(sides, [msg("walk", i % 2, 1000 + i // 2) for i in range(most + 1)]) == [most + 1, most + 1]
    assert fast.stat() == 1
    assert len(fast.served) == 2  # the frame past the bound: its readers woken, not served from the turn
    _same(fast, general)


def test_where_the_burst_writer_stops_the_general_path_copies_the_rest(sides):
    """The test store's index file of a partition ends within the frame: the copies before it are taken in one step,
    the rest entry by entry, nothing copied twice."""
    fast, general = sides
    assert _both(sides, [msg("walk", 0, 0)]) == [1, 1]
    most = mqttcluster_limits.MQTT_CLUSTER_DIRECT_COPIES
    assert _both(sides, [msg("walk", 0, 1 + i) for i in range(most)]) == [most, most]
    assert fast.stat() == 0
    _same(fast, general)


def test_a_topic_no_property_can_hold_is_refused_by_the_general_path(sides):
    for side in sides:
        side.apply([msg("walk", 0, 0)])
        with pytest.raises(ValueError):
            side.apply([msg("walk\x01", 0, 1)])


@pytest.mark.parametrize("topic,flag,data", RECORDS)
def test_a_kept_copy_is_the_bytes_inbox_makes(topic, flag, data):
    """``kept_copy``'s block and payload joined are ``inbox.copy_of``'s data for each record it keeps (None for the
    others: ``inbox.as_is`` keeps them not, or not so), a check of 0 too: then neither names one, and the copy reads
    as of check 0."""
    now = now_ms()
    for check, epoch in ((record_check(5, data), NO_EPOCH), (record_check(5, data), (4, 2)), (0, NO_EPOCH),
                         (0, (4, 2))):
        made = inbox.as_is(2, topic, 3, 17, flag, data, now, DEFAULT_MAP, (), check, epoch)
        kept = kept_copy(2, topic, 3, 17, flag, memoryview(data), now, DEFAULT_MAP, check, epoch)
        if not made:
            assert kept is None
            continue
        block, name, props, end = kept
        copy = inbox.copy_of(2, topic, 3, 17, flag, data, now, DEFAULT_MAP, (), check, epoch)
        assert (made[0], block + data[end:]) == copy
        assert (name, props, end) == made[2]
        assert (inbox.CHECK.encode() in block) == (check != 0)
        assert inbox.place_of(*copy) == ((2, topic, 3, 17), check, False, epoch)


def test_a_frame_read_by_its_bytes_is_the_entries_the_general_path_reads():
    entries = [msg("walk", 0, 3), Entry(MESSAGE, "pump", 2, 9, 1, 5, b"x")]
    frame = received(entries)
    assert [Entry(k, t, p, o, f, ts, bytes(d)) for k, t, p, o, f, ts, d in messages_of(frame.payload)] == \
        [e._replace(data=bytes(e.data)) for e in frame]
    assert messages_of(received(entries + [Entry(POSITION, "walk", 0, 4)]).payload) is None
    assert messages_of(frame.payload[:-1]) is None  # one byte short: the general path raises for it
    assert messages_of(bytes(frame.payload) + b"\x00") is None
