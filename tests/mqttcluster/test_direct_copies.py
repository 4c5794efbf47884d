"""A peer's message reaches a subscriber waiting on this broker from the turn that copies it into the inbox
(docs/mqtt.md "A cluster"; ``MqttCluster.apply`` serves it through ``MqttPort.serve_copies``): neither read back from
the inbox nor woken for, as ``stats`` counts (``mqtt_copies_served_direct`` against ``mqtt_copies_read_back``), each
lone message's frame taken in one step (``mqtt_cluster_frames_one_step``). Where that turn stops (the window in
flight full, the socket full) the subscriber's own delivery goes on from its cursor, in order, within its window. At
most MQTT_CLUSTER_DIRECT_COPIES copies of a frame are served so: a larger frame (a backlog crossing) is its
deliveries', which share the loop."""

import socket
import time
from types import SimpleNamespace


from metaq.clock import now_ms
from metaq.mqtt import wire
from metaq.mqtt.records import message_of, record_data
from metaq.mqtt.topicmap import DEFAULT_MAP
from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqttcluster.following import inbox
from metaq.mqttcluster.following.peers import MqttCluster
from metaq.protocol.replication_mqtt import MESSAGE, Entry
from tests.harness.mqtt import Paho, Raw, mqtt_port, next_publish
from tests.harness.mqttcluster import Cluster, wait_routed
from tests.harness.store import inprocess_put_path

N = 20
#: A write visible at once (a copy too): the turn that writes it serves it; with ``sync`` flush, after its flush, its
#: readers (as for a publisher's burst: docs/mqtt.md "Subscribing").
ASYNC = {"flush": "async"}


def _counts(cluster, b, before=None):
    """``(copies served direct, copies read back)`` of broker ``b``, less ``before``'s."""
    s = cluster.stats(b)
    now = (int(s["mqtt_copies_served_direct"]), int(s["mqtt_copies_read_back"]))
    return now if before is None else (now[0] - before[0], now[1] - before[1])


def test_a_waiting_subscriber_gets_a_peers_messages_from_the_turn_that_copies_them(broker_factory, tmp_path,
                                                                                   zk_connect):
    cluster = Cluster(broker_factory, tmp_path, zk_connect, 2, store=ASYNC).start()
    sub = Paho(cluster[1], "direct-sub")
    assert sub.subscribe("across/#", 1) == [1]
    pub = Paho(cluster[0], "direct-pub")
    wait_routed(sub, lambda i: pub.publish("across/probe", b"probe", 1))
    before = _counts(cluster, cluster[1])
    one_step = int(cluster.stats(cluster[1])["mqtt_cluster_frames_one_step"])
    for i in range(N):  # one at a time: the subscriber's delivery waits caught up when each copy is written
        pub.publish("across/t", b"m%d" % i, 1)
        assert len(sub.wait_messages(i + 1, 10)) == i + 1, i
    assert [m.payload for m in sub.messages] == [b"m%d" % i for i in range(N)]
    served, read = _counts(cluster, cluster[1], before)
    assert served >= N - 2 and read <= 2, (served, read)  # (slack for a wake the subscriber's PUBACK began)
    # each lone message's frame taken in one step (slack: a frame that also carried an EPOCH or a POSITION)
    assert int(cluster.stats(cluster[1])["mqtt_cluster_frames_one_step"]) - one_step >= N - 2


def _slow_subscriber(b, window):
    """A QoS 1 subscriber of ``across/#`` on ``b`` with a small receive buffer and Receive Maximum ``window``."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", mqtt_port(b)))
    raw = Raw.__new__(Raw)
    raw.sock, raw.version, raw.parser = sock, wire.MQTT_5, wire.MqttParser(wire.MQTT_5, sender="server")
    assert raw.connect("direct-slow", properties={"receive_maximum": window}, keep_alive=0).reason_code == 0
    raw.send(wire.Subscribe(1, (wire.Subscription("across/#", 1),)))
    assert isinstance(raw.read(), wire.Suback)
    return raw


def _routed(raw, pub):
    """Probes from ``pub`` until ``raw`` reads one (its filter in the peers' routes); every probe read and acked."""
    raw.sock.settimeout(0.3)
    try:
        for _ in range(60):
            pub.publish("across/probe", b"probe", 1)
            try:
                p = next_publish(raw)
            except socket.timeout:
                continue
            raw.send(wire.PubAck(p.packet_id))
            time.sleep(0.5)
            while True:
                try:
                    raw.send(wire.PubAck(next_publish(raw).packet_id))
                except socket.timeout:
                    return
        raise AssertionError("no probe reached the subscriber")
    finally:
        raw.sock.settimeout(30)


def test_where_the_copying_turn_stops_the_subscribers_delivery_goes_on_in_order_within_its_window(
        broker_factory, tmp_path, zk_connect):
    """Copies past what the subscriber's socket takes and past its window of 4: the copying turn sends what it may
    and stops; the subscriber, reading at last, gets every message once, in order, never more than 4 in flight."""
    cluster = Cluster(broker_factory, tmp_path, zk_connect, 2, store=ASYNC).start()
    window = 4
    slow = _slow_subscriber(cluster[1], window)
    pub = Paho(cluster[0], "direct-pub")
    _routed(slow, pub)
    before = _counts(cluster, cluster[1])
    want = [b"%03d" % i + b"x" * (512 * 1024) for i in range(12)]
    for payload in want:  # the subscriber reads nothing meanwhile
        pub.publish("across/big", payload, 1)
    got, unacked = [], []
    while len(got) < len(want):
        if len(unacked) == window:
            slow.sock.settimeout(0.5)
            try:
                extra = slow.read()
            except socket.timeout:
                extra = None
            assert extra is None, "a PUBLISH in flight past a Receive Maximum of %d: %r" % (window, extra)
            slow.sock.settimeout(30)
            for packet_id in unacked:
                slow.send(wire.PubAck(packet_id))
            unacked = []
        p = next_publish(slow)
        assert p.qos == 1 and not p.dup
        got.append(p.payload)
        unacked.append(p.packet_id)
    assert got == want
    served, read = _counts(cluster, cluster[1], before)
    assert served >= 1 and read >= 1, (served, read)  # begun from the copying turn, the rest its delivery's


def test_a_frame_of_the_bound_is_served_from_its_turn_and_one_past_it_is_not(tmp_path):
    """In process over a real store and put path: a frame of MQTT_CLUSTER_DIRECT_COPIES copies is handed to the
    port's ``serve`` with each copy's place in the log (its offset and its key in ``Decoded``) and bytes that read as
    the copy the log holds; one of a copy more is not (its readers are woken, as before)."""
    store, path = inprocess_put_path(tmp_path, now_ms())
    served = []
    cluster = MqttCluster(1, store, path, SimpleNamespace(topics=DEFAULT_MAP), None, lambda: True,
                          serve=lambda copies: served.append(copies) or {})
    most = mqttcluster_limits.MQTT_CLUSTER_DIRECT_COPIES
    v5 = {"user_property": [("k", "v")], "message_expiry_interval": 600}
    made = [record_data("walk/t", b"p%d" % i, 1, "dev", v5 if i % 3 else None, False, now_ms())
            for i in range(2 * most + 1)]
    made[5] = (0, b"a text put")  # made again as an MQTT record, not kept as it is
    entries = [Entry(MESSAGE, "walk", 0, i, flag, now_ms(), data) for i, (flag, data) in enumerate(made)]
    try:
        assert cluster.apply(0, entries[:most]) == most
        assert cluster.apply(0, entries[most:]) == most + 1
        assert len(served) == 1  # the frame past the bound: not served from its turn
        part = inbox.partition_of(0, "walk", 0)
        (key, copies), = served[0].items()
        assert key == (inbox.INBOX, part)
        records, _next = store.read_records(inbox.INBOX, part, 0, most, 1 << 22)
        assert [(c[0], c[1]) for c in copies] == [(r.queue_offset, (r.position, r.msg_id)) for r in records]
        assert [message_of(*c[2:5], DEFAULT_MAP) for c in copies] == \
            [message_of(inbox.INBOX, r.flag, r.data) for r in records]
        # an MQTT record kept as it is comes with its message made (not decoded again); one made again without
        assert [c[5] for c in copies] == [message_of(inbox.INBOX, r.flag, r.data) if c[2] != inbox.INBOX else None
                                          for c, r in zip(copies, records, strict=True)]
    finally:
        store.close(now_ms())
