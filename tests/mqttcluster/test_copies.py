"""A record crossing brokers is decoded and encoded as few times as the walk needs (docs/mqtt.md "A cluster"):
published on A, read by A's follow of B's route by its name alone, kept as it is in B's inbox, decoded once by
B's delivery. The brokers count their codec's calls on the test's payload (``tests.harness.codeccount``).

The payload's copies along the walk (docs/architecture.md "A payload's copies across brokers"): A's read of its log,
A's RECORDS frame joined for one write, B's ``recv``, B's write into the inbox log (the parser hands the received
bytes over, the entries are views of them, the burst writer writes a copy's payload from that view); then delivery
as for a message published on B."""

import os
import socket
import time
from types import SimpleNamespace

import pytest

from metaq.clock import now_ms
from metaq.mqtt.records import message_of, name_of, record_data
from metaq.mqtt.topicmap import DEFAULT_MAP, TopicMap
from metaq.mqttcluster.following import inbox
from metaq.mqttcluster.following.peers import MqttCluster
from metaq.mqttcluster.serve import send_records
from metaq.protocol import replication as rp
from metaq.protocol.message import encode_payload
from metaq.protocol.properties import encode_attribute
from metaq.protocol.replication_mqtt import MESSAGE, POSITION, Entry
from metaq.store import batch
from tests.harness.broker import wait_for
from tests.harness.codeccount import COUNTS_S, counting, read_counts
from tests.harness.mqtt import Paho
from tests.harness.mqttcluster import Cluster, wait_routed
from tests.harness.store import inprocess_put_path

MARK = "payload-walk-7f3a"
N = 20


@pytest.mark.parametrize("flush", ["sync", "async"])
def test_a_record_crossing_brokers_is_decoded_once(broker_factory, tmp_path, zk_connect, monkeypatch, flush):
    """``sync`` flush: B's subscriber reads the copy from the inbox log, decoded once; ``async``: the turn that writes
    the copy serves it (``MqttPort.serve_copies``), its message made from the attribute the copy read: not decoded."""
    monkeypatch.setenv("METAQ_PURE_PYTHON", "1")  # every codec call a Python one, the wrapper's
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH")))))  # -m tests...
    cluster = Cluster(broker_factory, tmp_path, zk_connect, 2, store={"flush": flush})
    outs = [tmp_path / ("counts-%d.json" % i) for i in range(2)]
    for i, cfg in enumerate(cluster.configs):
        b = broker_factory(cfg, workdir=tmp_path / ("b%d" % i), start=False)
        b.prefix = counting(outs[i], MARK)
        cluster.brokers.append(b.start())
    cluster.wait_linked()
    sub = Paho(cluster[1], "walk-sub")
    assert sub.subscribe("walk/#", 1) == [1]
    pub = Paho(cluster[0], "walk-pub")
    wait_routed(sub, lambda i: pub.publish("walk/probe", b"probe", 1))
    before = [read_counts(o) for o in outs]
    for i in range(N):
        pub.publish("walk/t", b"%s-%d" % (MARK.encode(), i), 1)
    got = sub.wait_messages(N, 20)
    assert sorted(m.payload for m in got) == sorted(b"%s-%d" % (MARK.encode(), i) for i in range(N))
    if flush == "sync":
        wait_for(lambda: read_counts(outs[1])["decode_payload"] - before[1]["decode_payload"] >= N, 5, "B's counts")
    else:
        time.sleep(3 * COUNTS_S)  # B's counts written out after the last copy
        assert int(cluster.stats(cluster[1])["mqtt_copies_served_direct"]) >= N - 2  # (slack: a PUBACK's wake)
    after = [read_counts(o) for o in outs]
    calls = [{k: after[b][k] - before[b][k] for k in after[b]} for b in range(2)]
    # A: at most its publish's encode (its follow reads the name alone); B: delivery's one decode (the copy is kept
    # as it came, neither decoded nor encoded), none for a copy served from the turn that wrote it
    assert calls[0]["decode_payload"] == 0 and calls[0]["encode_payload"] <= N, calls
    assert calls[1]["encode_payload"] == 0, calls
    assert calls[1]["decode_payload"] == N if flush == "sync" else calls[1]["decode_payload"] <= 2, calls
    # the walk's copies of a payload: at most 4 (the codec's two here; the bytes' own, A's frame and B's write into
    # the inbox log, held to one each by the test below and by one write of a frame)
    assert sum(calls[0].values()) + sum(calls[1].values()) <= 2 * N, calls


def test_a_records_frame_reaches_the_inbox_log_with_each_payload_copied_once(tmp_path, monkeypatch):
    """B's side of the walk, in process over a real store and put path: the bytes one ``recv`` gave, a RECORDS frame
    whole, are handed over by the parser (not copied out of its buffer), each MESSAGE entry's data is a view of them,
    and a copy's payload reaches the log writer as that view (the burst's buffer holds only its attribute block):
    from the socket's bytes to the inbox log each payload is copied once, by the log writer."""
    store, path = inprocess_put_path(tmp_path, now_ms())
    cluster = MqttCluster(1, store, path, SimpleNamespace(topics=DEFAULT_MAP), None, lambda: True)
    payloads = [b"%s-%d-" % (MARK.encode(), i) * 500 for i in range(N)]
    made = [record_data("walk/t", p, 1, "dev", None) for p in payloads]
    entries = [Entry(MESSAGE, "walk", 0, i, flag, now_ms(), data) for i, (flag, data) in enumerate(made)]
    written = []  # each frame the log writer was given: (its body's first bytes in the burst's buffer, its tail)
    real = batch.write_run

    def write_run(log, seg_start, rel, ready, src, frames, i, j, *rest):
        written.extend(frames[i:j])
        return real(log, seg_start, rel, ready, src, frames, i, j, *rest)

    monkeypatch.setattr(batch, "write_run", write_run)
    try:
        for frame_entries in (entries[:1], entries[1:]):  # a partition's first copy takes the general path
            received = b"".join(rp.frame_parts(rp.Records(tuple(frame_entries))))  # as one recv gives them
            parser = rp.ReplicationParser()
            parser.receive_data(received)
            event = parser.next_event()
            assert all(e.data.obj is received for e in event.entries)  # views of the received bytes
            assert cluster.apply(0, event.entries) == len(frame_entries)
        assert len(written) == N - 1
        copies = [0 if len(f) > 8 and isinstance(f[8], memoryview) and f[8].obj is received else 1 for f in written]
        assert copies == [0] * (N - 1)  # none before the log writer's own
        part = inbox.partition_of(0, "walk", 0)
        records, _next = store.read_records(inbox.INBOX, part, 0, N + 1, 1 << 22)
        assert [message_of(inbox.INBOX, r.flag, r.data).payload for r in records] == payloads
    finally:
        store.close(now_ms())


MAPPED = TopicMap([{"filter": "plant/#", "topic": "plants"}])
V5 = {"user_property": [("k", "v")], "content_type": "text/plain", "correlation_data": b"\x00c",
      "response_topic": "r/1", "payload_format_indicator": 1, "message_expiry_interval": 60}
RECORDS = [
    ("sensors", *record_data("sensors/a", b"21.5", 1, "dev-1", None)),
    ("sensors", *record_data("sensors/b", b"x" * 300, 2, "dev-2", V5, True, 1_000)),
    ("sensors", *record_data("sensors/\x01odd", b"b64", 0, None, None)),  # its name kept as MQTT_TOPIC_B64
    ("plants", *record_data("plant/7", b"mapped", 1, "p", None)),  # a topic map rule's
    ("sensors", *record_data("plant/7", b"forged", 1, "p", None)),  # a name the map does not put here
    ("sensors", 0, b"from-text"),  # a text put: its name is its topic
    ("sensors", *encode_payload(b"tagged", encode_attribute("tag", {"MQTT_TOPIC": "sensors/t", "MQTT_QOS": "1"}))),
    ("sensors", *encode_payload(b"forged-origin", encode_attribute(None, {"MQTT_TOPIC": "sensors/f",
                                                                          "MQTT_ORIGIN": "9:9:9:x"}))),
    ("sensors", *encode_payload(b"old", encode_attribute(None, {"MQTT_TOPIC": "sensors/z", "@SYSFLAG": "0"}))),
    ("sensors", 1, b"\x00\x00\x10\x00short"),  # an attribute block longer than the data
    ("sensors", 1, b"\x00"),
]


@pytest.mark.parametrize("topic,flag,data", RECORDS)
def test_the_name_read_alone_is_the_one_delivery_reads(topic, flag, data):
    for topics in (DEFAULT_MAP, MAPPED):
        assert name_of(topic, flag, data, topics) == message_of(topic, flag, data, topics).topic


@pytest.mark.parametrize("topic,flag,data", RECORDS)
def test_a_copy_reads_as_its_origin_record_and_names_its_place(topic, flag, data):
    copy = inbox.copy_of(3, topic, 1, 42, flag, data, 2_000, MAPPED, (("g", "sensors/#"),), 77)
    expect = message_of(topic, flag, data, MAPPED)
    got = message_of(inbox.INBOX, *copy)
    if expect.expires_ms is not None:  # kept as the time it expires (a copy made again: whole seconds from now)
        assert got.expires_ms >= expect.expires_ms
        got, expect = got._replace(expires_ms=0), expect._replace(expires_ms=0)
    assert got == expect
    assert inbox.place_of(*copy) == ((3, topic, 1, 42), 77, False, (0, 0))
    assert inbox.groups_of(*copy) == (("g", "sensors/#"),)
    # the copy's message as the turn that writes it reads it, from the origin's bytes (``inbox.read_as``)
    made = inbox.copy_parts(3, topic, 1, 42, flag, data, 2_000, MAPPED, (("g", "sensors/#"),), 77)
    served = inbox.read_as(topic, flag, data, made)
    assert message_of(*served[:3], MAPPED) == message_of(inbox.INBOX, *copy, MAPPED)
    assert served[3] in (None, message_of(inbox.INBOX, *copy, MAPPED))  # made from the attribute read, where it was


def test_an_mqtt_record_is_kept_as_it_is_and_any_other_made_again():
    flag, data = RECORDS[1][1:]
    kept = inbox.as_is(3, "sensors", 1, 42, flag, data, 2_000)
    assert kept[0] == flag and bytes(kept[1][-1]) == data[-300:]  # the payload a view of the peer's bytes
    assert inbox.as_is(3, "sensors", 1, 42, flag | 4, data, 2_000)[0] == 1  # a copy's flag, whatever the origin's
    for topic, other_flag, other in RECORDS[4:]:  # forged name, text put, tags, forged origin, old compression, bad
        assert inbox.as_is(3, topic, 1, 42, other_flag, other, 2_000) is None
    assert inbox.as_is(3, "sensors", 1, 42, flag, data, 61_001) == ()  # expired
    assert inbox.copy_of(3, "sensors", 1, 42, flag, data, 61_001) is None


def test_a_records_frame_leaves_in_one_write():
    class Counted(socket.socket):
        writes = 0

        def sendall(self, data, *args):
            Counted.writes += 1
            return super().sendall(data, *args)

    a, b = socket.socketpair()
    sender = Counted(fileno=a.detach())
    event = rp.Records(tuple(Entry(MESSAGE, "sensors", 0, i, 1, 5, b"d" * i) for i in range(1, 40))
                       + (Entry(POSITION, "sensors", 0, 40),))
    try:
        send_records(sender, event)
        frame = rp.serialize(event)
        got = b""
        while len(got) < len(frame):
            got += b.recv(1 << 16)
        assert got == frame and Counted.writes == 1
    finally:
        sender.close()
        b.close()
