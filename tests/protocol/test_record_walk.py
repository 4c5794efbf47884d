"""The one walk of a RECORDS frame's bytes (``recordwalk.walk``), as both its readers take it: the general path's
``RecordEntries`` (a run at a time) and the one-step copy's ``copyturn.messages_of`` (the whole frame). Pure: no
network."""

import pytest

from metaq.errors import RemoteProtocolError
from metaq.mqttcluster.following.copyturn import messages_of
from metaq.protocol import replication as rp
from metaq.protocol.recordwalk import COUNT, ENTRY, walk
from metaq.protocol.replication_mqtt import (EPOCH, MESSAGE, POSITION, RETAINED, ROUTED, SHARED, WALK_RUN, Entry,
                                             RecordEntries, Records)


def payload_of(entries):
    """A RECORDS frame's payload as a sender writes it."""
    frame = b"".join(rp.frame_parts(Records(tuple(entries))))
    return frame[rp.FRAME_HEADER.size:]


def entry(kind, topic, partition, offset, flag=0, ts=0, data=b""):
    return Entry(kind, topic, partition, offset, flag, ts, data)


def raw_entry(kind, topic, partition, offset, data=b"", tlen=None, dlen=None):
    t = topic if isinstance(topic, bytes) else topic.encode("utf-8")
    return ENTRY.pack(kind, len(t) if tlen is None else tlen, partition, 0, offset, 0,
                      len(data) if dlen is None else dlen) + t + data


MIXED = [entry(MESSAGE, "t/ä", 0, 5, 1, 99, b"payload"), entry(POSITION, "t", 1, 3),
         entry(SHARED, "s", 2, 0, 0, 7, b"\x00\x02[]xy"), entry(RETAINED, "%MQTT%", 0, 8, 0, 1, b"r"),
         entry(ROUTED, "", 0, 4), entry(EPOCH, "t", 0, 6, 0, 2, b"\x00" * 8)]


def test_the_walk_reads_each_kind_as_the_sender_wrote_it_and_views_only_a_messages_data():
    payload = payload_of(MIXED)
    entries, at, problem = walk(payload, len(MIXED), 0, COUNT.size, 100)
    assert (at, problem) == (len(payload), None)
    assert [Entry(k, t, p, o, f, ts, bytes(d)) for k, t, p, o, f, ts, d in entries] == MIXED
    assert [type(e[6]) for e in entries] == [memoryview, bytes, memoryview, bytes, bytes, bytes]


def test_a_walk_in_runs_reads_what_one_walk_reads_and_the_general_path_hands_every_entry():
    many = [entry(MESSAGE, "t", i % 4, i, 0, i, b"d%d" % i) for i in range(WALK_RUN * 3 + 5)]
    payload = payload_of(many)
    whole, _at, problem = walk(payload, len(many), 0, COUNT.size, len(many))
    assert problem is None
    runs, n, at = [], 0, COUNT.size
    while n < len(many):
        got, at, problem = walk(payload, len(many), n, at, WALK_RUN)
        assert problem is None and 0 < len(got) <= WALK_RUN
        runs.extend(got)
        n += len(got)
    assert runs == whole
    assert [e._replace(data=bytes(e.data)) for e in RecordEntries(payload)] == many
    assert [Entry(*e)._replace(data=bytes(e[6])) for e in messages_of(payload)] == many


@pytest.mark.parametrize("tail, count, error", [
    (b"", 1, "RECORDS entry 1 runs past the frame"),
    (ENTRY.pack(MESSAGE, 1, 0, 0, 0, 0, 0)[:-1], 1, "RECORDS entry 1 runs past the frame"),
    (raw_entry(9, "t", 0, 0), 1, "RECORDS entry of kind 9, partition 0, offset 0"),
    (raw_entry(MESSAGE, "t", -1, 0), 1, "RECORDS entry of kind 1, partition -1, offset 0"),
    (raw_entry(MESSAGE, "t", 0, -2), 1, "RECORDS entry of kind 1, partition 0, offset -2"),
    (raw_entry(MESSAGE, "t", 0, 0, b"ab", dlen=3), 1, "RECORDS entry 1 runs past the frame"),
    (raw_entry(MESSAGE, b"\xff", 0, 0), 1, "a RECORDS topic is not UTF-8"),
    (raw_entry(MESSAGE, "t", 0, 0) + b"x", 1, "RECORDS of 2 entries leaves 1 bytes over"),
    (b"x", 0, "RECORDS of 1 entries leaves 1 bytes over"),
], ids=["no-entry", "short-head", "kind", "partition", "offset", "data-past", "topic", "over", "over-none"])
def test_a_frame_not_well_formed_is_refused_at_its_first_bad_entry_by_both_readers(tail, count, error):
    """A well-formed entry, then ``count`` entries' bytes ``tail`` that are not."""
    good = raw_entry(MESSAGE, "ok", 0, 1, b"fine")
    payload = COUNT.pack(count + 1) + good + tail
    entries, _at, problem = walk(payload, count + 1, 0, COUNT.size, count + 1)
    assert problem == error
    standing = ["ok", "t"] if "bytes over" in error and count else ["ok"]  # the entries before it stand
    assert [e[1] for e in entries] == standing and bytes(entries[0][6]) == b"fine"
    seen = []
    with pytest.raises(RemoteProtocolError, match="bad MQTT cluster frame: " + error):
        for e in RecordEntries(payload):
            seen.append(e.topic)
    assert seen == standing
    assert messages_of(payload) is None  # left to the general path, which says what is wrong


def test_a_frame_of_other_kinds_is_the_general_paths_and_a_short_payload_is_no_frame():
    assert messages_of(payload_of(MIXED[:2])) is None
    assert messages_of(b"\x00\x00\x00") is None
    assert messages_of(payload_of([])) == []



@pytest.mark.parametrize("good", [WALK_RUN - 1, WALK_RUN, WALK_RUN + 1, 2 * WALK_RUN])
def test_a_bad_entry_or_bytes_over_past_the_first_run_stand_the_entries_before_them(good):
    """The general path walks WALK_RUN entries a step: an error in a later step, or bytes left over after a frame of
    exactly a step's entries, raise there, every entry before handed on."""
    entries = b"".join(raw_entry(MESSAGE, "t", 0, i, b"d") for i in range(good))
    for tail, count, error in [(raw_entry(9, "t", 0, 0), good + 1, "RECORDS entry of kind 9"),
                               (b"xy", good, "RECORDS of %d entries leaves 2 bytes over" % good)]:
        payload = COUNT.pack(count) + entries + tail
        seen = []
        with pytest.raises(RemoteProtocolError, match=error):
            for e in RecordEntries(payload):
                seen.append(e.offset)
        assert seen == list(range(good))


def test_a_count_the_frame_cannot_hold_is_refused_at_the_first_missing_entry_without_walking_it():
    payload = COUNT.pack(2**32 - 1) + raw_entry(MESSAGE, "t", 0, 0, b"d")
    entries, _at, problem = walk(payload, 2**32 - 1, 0, COUNT.size, 2**32 - 1)
    assert len(entries) == 1 and problem == "RECORDS entry 1 runs past the frame"
    with pytest.raises(RemoteProtocolError, match="RECORDS entry 1 runs past the frame"):
        list(iter(RecordEntries(payload)))
    assert messages_of(payload) is None
