"""Persistent sessions (docs/mqtt.md "Sessions"): a client that connects with Clean Session 0 (MQTT 3.1.1) or a
Session Expiry Interval (MQTT 5) finds its subscriptions, what it was not yet sent and its QoS 2 state again after
it reconnects, after the broker restarts and after a kill -9; sessions expire on time and are bounded."""

import os
import time

import pytest

from metaq.mqtt import limits as mqtt_limits
from metaq.mqtt import wire
from metaq.client.local import small_config
from metaq.mqtt.follow import RecordError, SavedSession, decode, encode
from metaq.protocol.journaltopic import MQTT_SESSIONS_TOPIC
from tests.harness.broker import consume_all, wait_for
from tests.harness.mqtt import V311, Paho, Raw, mosquitto_pub, mqtt_config, with_mqtt
from tests.harness.replication import stats

HOUR = {"session_expiry_interval": 3600}


def _subscribed(b, client_id, topic_filter="dev/#", qos=1, **connect):
    raw = Raw(b)
    ack = raw.connect(client_id, clean_start=False, properties=dict(HOUR), **connect)
    assert ack.reason_code == 0 and not ack.session_present
    raw.send(wire.Subscribe(1, (wire.Subscription(topic_filter, qos),)))
    assert raw.read() == wire.Suback(1, (qos,))
    return raw


def _publish(b, n, topic="dev/t", qos=1, start=0):
    raw = Raw(b)
    assert raw.connect("publisher").reason_code == 0
    for i in range(start, start + n):
        raw.send(wire.Publish(topic, b"m%d" % i, qos, packet_id=i + 1))
        if qos == 1:
            assert raw.read().reason_code == 0
    raw.send(wire.Disconnect())
    raw.close()


def _payloads(raw, n):
    got = []
    while len(got) < n:
        p = raw.read()
        assert isinstance(p, wire.Publish), p
        got.append(p.payload)
        if p.qos == 1:
            raw.send(wire.PubAck(p.packet_id))
    return got


def _saved(b, client_id):
    """The last record the broker wrote of ``client_id``'s session (a SavedSession; None: none, or it ended)."""
    with b.client() as c:
        records = consume_all(c, MQTT_SESSIONS_TOPIC, 0)
    last = None
    for rec in records:
        try:
            owner, saved = decode(rec.payload)
        except RecordError:  # a retained message's or a shared group's record
            continue
        if owner == client_id:
            last = saved
    return last


def _acked(saved, n):
    """True when ``saved`` has read past ``n`` messages in all and holds none in flight."""
    return saved is not None and not saved.inflight and sum(saved.cursors.values()) >= n


def _mqtt_stat(b, name):
    with b.client() as c:
        return int(c.stats_dict()[name])


def _resume(b, client_id):
    raw = Raw(b)
    ack = raw.connect(client_id, clean_start=False, properties=dict(HOUR))
    assert ack.reason_code == 0
    return raw, ack.session_present


def test_what_was_published_while_offline_arrives_on_reconnect(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    raw = _subscribed(b, "dev1")
    raw.send(wire.Disconnect())
    raw.close()
    _publish(b, 3)
    raw, present = _resume(b, "dev1")
    assert present
    assert _payloads(raw, 3) == [b"m0", b"m1", b"m2"]
    raw.send(wire.Disconnect())
    raw.close()
    # Clean Start 1 ends it: nothing kept, Session Present 0
    raw = Raw(b)
    assert raw.connect("dev1", clean_start=True).session_present is False
    raw.close()
    raw, present = _resume(b, "dev1")
    assert not present


@pytest.mark.slow
@pytest.mark.parametrize("how", ["restart", "kill -9"])
def test_a_session_survives_the_broker(broker_factory, tmp_path, how):
    b = broker_factory(mqtt_config(tmp_path))
    raw = _subscribed(b, "dev1")
    _publish(b, 2)
    assert _payloads(raw, 2) == [b"m0", b"m1"]
    wait_for(lambda: _acked(_saved(b, "dev1"), 2), what="the read positions saved (each MQTT_SESSION_SAVE_INTERVAL_S)")
    raw.close()
    _publish(b, 2, start=2)  # while it is offline
    if how == "restart":
        b.stop()
    else:
        b.kill()
    b.start()
    raw, present = _resume(b, "dev1")
    assert present
    assert _payloads(raw, 2) == [b"m2", b"m3"]


@pytest.mark.slow
def test_a_message_in_flight_is_sent_again_with_dup(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    raw = _subscribed(b, "dev1", qos=2)
    _publish(b, 1)
    p = raw.read()
    assert isinstance(p, wire.Publish) and p.qos == 1 and p.payload == b"m0" and not p.dup
    # saved within MQTT_SESSION_SAVE_INTERVAL_S (before: it is sent again as new, at least once)
    wait_for(lambda: [i[0] for i in getattr(_saved(b, "dev1"), "inflight", ())] == [p.packet_id],
             what="the message in flight saved")
    b.kill()  # never acknowledged
    b.start()
    raw, present = _resume(b, "dev1")
    assert present
    again = raw.read()
    assert (again.payload, again.dup, again.packet_id) == (b"m0", True, p.packet_id)
    raw.send(wire.PubAck(again.packet_id))


@pytest.mark.slow
def test_qos2_exactly_once_across_a_kill(broker_factory, tmp_path):
    """The packet id of a QoS 2 PUBLISH is saved before its PUBREC: a resend after a kill -9 is not stored again."""
    b = broker_factory(mqtt_config(tmp_path))
    reader = _subscribed(b, "reader", topic_filter="q2/#")
    reader.send(wire.Disconnect())
    pub = Raw(b)
    assert pub.connect("sender", clean_start=False, properties=dict(HOUR)).reason_code == 0
    pub.send(wire.Publish("q2/x", b"once", 2, packet_id=7))
    assert pub.read() == wire.PubRec(7)
    pub.close()
    b.kill()
    b.start()
    pub, present = _resume(b, "sender")
    assert present
    pub.send(wire.Publish("q2/x", b"once", 2, dup=True, packet_id=7))  # the client did not see the PUBREC
    assert pub.read() == wire.PubRec(7)
    pub.send(wire.PubRel(7))
    assert pub.read() == wire.PubComp(7)
    pub.send(wire.Publish("q2/x", b"next", 2, packet_id=7))  # released: the id is a new message now
    assert pub.read() == wire.PubRec(7)
    pub.send(wire.PubRel(7))
    assert pub.read() == wire.PubComp(7)
    reader, present = _resume(b, "reader")
    assert present
    assert _payloads(reader, 2) == [b"once", b"next"]
    reader.sock.settimeout(1.0)
    with pytest.raises(OSError):
        reader.read()  # and no third


@pytest.mark.slow
def test_session_expiry_drops_it_on_time(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    raw = Raw(b)
    assert raw.connect("short", clean_start=False, properties={"session_expiry_interval": 1}).reason_code == 0
    raw.send(wire.Subscribe(1, (wire.Subscription("dev/#", 1),)))
    assert raw.read() == wire.Suback(1, (1,))
    raw.send(wire.Disconnect())
    raw.close()
    raw, present = _resume(b, "short")
    assert present  # within its second
    raw.send(wire.Disconnect(properties={"session_expiry_interval": 1}))
    raw.close()
    wait_for(lambda: _mqtt_stat(b, "mqtt_sessions_expired") == 1, 10, "the keeper's round past its interval")
    raw, present = _resume(b, "short")
    assert not present


def test_an_expiry_of_zero_ends_the_session_with_its_connection(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    raw = _subscribed(b, "dev1")
    raw.send(wire.Disconnect(properties={"session_expiry_interval": 0}))
    raw.close()
    wait_for(lambda: _mqtt_stat(b, "mqtt_sessions") == 0, what="the broker took the DISCONNECT")
    raw, present = _resume(b, "dev1")
    assert not present


def test_max_offline_sessions_at_the_limit_and_one_past(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path, max_offline_sessions=2))
    def offline(n):  # the broker took the DISCONNECT (a later one must be later: offline longest goes first)
        wait_for(lambda: _mqtt_stat(b, "mqtt_sessions_offline") == n, what="%d sessions offline" % n)
        time.sleep(0.05)

    for i in range(2):
        raw = _subscribed(b, "d%d" % i)
        raw.send(wire.Disconnect())
        raw.close()
        offline(i + 1)
    for i in range(2):  # at the limit: both kept
        raw, present = _resume(b, "d%d" % i)
        assert present
        raw.send(wire.Disconnect())
        raw.close()
        offline(2)
    raw = _subscribed(b, "d2")  # one past: the one offline longest (d0) ends
    raw.send(wire.Disconnect())
    raw.close()
    wait_for(lambda: _mqtt_stat(b, "mqtt_sessions") == 2, what="one session ended")
    assert [_resume(b, "d%d" % i)[1] for i in (1, 2, 0)] == [True, True, False]


def test_paho_311_clean_session_0(broker_factory, tmp_path):
    """A Paho MQTT 3.1.1 client with clean_session False gets what was published while it was away."""
    b = broker_factory(mqtt_config(tmp_path))
    c = Paho(b, client_id="paho1", version=V311, clean=False)
    assert c.subscribe("paho/#", qos=1) == [1]
    c.close()
    assert mosquitto_pub(b, "paho/x", "while-away", 1).returncode == 0
    c = Paho(b, client_id="paho1", version=V311, clean=False)
    assert c.session_present
    assert [m.payload for m in c.wait_messages(1)] == [b"while-away"]


def test_a_takeover_resumes_the_session_the_first_connection_held(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    first = _subscribed(b, "dev1")
    second, present = _resume(b, "dev1")  # the first is taken over; its session saved before this one resumes it
    assert present
    assert first.read() == wire.Disconnect(wire.SESSION_TAKEN_OVER)
    _publish(b, 1)
    assert _payloads(second, 1) == [b"m0"]


def test_delivering_to_a_session_writes_a_record_per_interval_not_per_message(broker_factory, tmp_path):
    """Write amplification is bounded: a persistent session's read positions are saved at most once per
    MQTT_SESSION_SAVE_INTERVAL_S however many messages it is delivered."""
    b = broker_factory(mqtt_config(tmp_path))
    raw = _subscribed(b, "busy")
    with b.client() as c:
        before = int(c.stats_dict()["mqtt_session_records"])
    started = time.monotonic()
    pub = Raw(b)
    assert pub.connect("publisher").reason_code == 0
    for i in range(300):
        pub.send(wire.Publish("dev/t", b"%d" % i, 0))
    assert _payloads(raw, 300) == [b"%d" % i for i in range(300)]
    time.sleep(1.2)  # the last positions saved
    with b.client() as c:
        written = int(c.stats_dict()["mqtt_session_records"]) - before
    seconds = time.monotonic() - started
    assert 1 <= written <= int(seconds / mqtt_limits.MQTT_SESSION_SAVE_INTERVAL_S) + 2, (written, seconds)


@pytest.mark.slow
def test_retention_goes_on_and_the_session_is_kept(broker_factory, tmp_path):
    """A session's record that falls a segment behind the log end is written again, so retention deletes the old
    segments (its floor is the lowest live record) and the session is still there after a restart."""
    store = {"retention_hours": 0.0005, "retention_check_interval_s": 0.3}  # segments older than 1.8 s
    b = broker_factory(with_mqtt(small_config(tmp_path / "data", store=store)))
    raw = _subscribed(b, "dev1")
    raw.send(wire.Disconnect())
    raw.close()
    segment = b.config["store"]["segment_size"]
    with b.client() as c:
        for _ in range(3 * segment // 200_000 + 2):
            c.put_ok("bulk", b"x" * 200_000)
    first = os.path.join(b.data_dir, "commitlog", "%020d" % 0)
    wait_for(lambda: not os.path.exists(first), 30, "the first segment deleted by retention")
    _publish(b, 1)
    b.stop()
    b.start()
    raw, present = _resume(b, "dev1")
    assert present
    assert _payloads(raw, 1) == [b"m0"]


@pytest.mark.slow
def test_offline_session_max_age_ends_a_311_session(broker_factory, tmp_path):
    """MQTT 3.1.1 persistent sessions have no expiry of their own: mqtt.offline_session_max_age_s ends them."""
    b = broker_factory(mqtt_config(tmp_path, offline_session_max_age_s=2))
    for _ in range(2):
        raw = Raw(b, wire.MQTT_311)
        ack = raw.connect("old", clean_start=False)
        raw.send(wire.Disconnect())
        raw.close()
    assert ack.session_present  # within its age
    wait_for(lambda: _mqtt_stat(b, "mqtt_sessions_expired") == 1, 10, "the keeper's round past the age bound")
    raw = Raw(b, wire.MQTT_311)
    assert not raw.connect("old", clean_start=False).session_present


def _big_filters(client_id, record_bytes, n=17):
    """``n`` filters of topic ``big`` whose session record, as the broker writes it for ``client_id`` when its client
    leaves (``follow.encode``: no messages in flight, both partitions of ``big`` at offset 0), is ``record_bytes``."""
    def size(filters):
        subs = [(f, 1, False, ["big"], False, None) for f in filters]
        saved = SavedSession(client_id, None, wire.MQTT_5, 3600, 1_700_000_000_000, False, subs,
                             {("big", 0): 0, ("big", 1): 0}, [], [], [])
        return len(encode(saved))
    filters = ["big/%02d/" % i for i in range(n)]
    filters = [f + "a" * ((record_bytes - size(filters)) // n) for f in filters]
    filters[-1] += "a" * (record_bytes - size(filters))
    assert size(filters) == record_bytes
    return filters


def test_max_session_record_bytes_at_the_limit_and_one_past(broker_factory, tmp_path):
    """A session whose record would be past MQTT_MAX_SESSION_RECORD_BYTES is not saved (logged); at the limit it is."""
    b = broker_factory(with_mqtt(small_config(tmp_path / "data", store={"segment_size": 4 << 20})))  # fits one
    limit = mqtt_limits.MQTT_MAX_SESSION_RECORD_BYTES
    for client_id, size in (("at-limit", limit), ("one-past", limit + 1)):
        filters = _big_filters(client_id, size)
        raw = Raw(b)
        assert raw.connect(client_id, clean_start=False, properties=dict(HOUR)).reason_code == 0
        raw.send(wire.Subscribe(1, tuple(wire.Subscription(f, 1) for f in filters)))
        assert raw.read() == wire.Suback(1, (1,) * len(filters))
        before = int(stats(b)["mqtt_session_records"])
        raw.send(wire.Disconnect())  # the record of its leaving: at the limit, or one byte past
        raw.close()
        if size == limit:
            wait_for(lambda before=before: int(stats(b)["mqtt_session_records"]) == before + 1, 10,
                     "the record at the limit")
            assert stats(b)["mqtt_sessions_offline"] == "1"
        else:
            wait_for(lambda size=size: "client one-past: its session needs a record of %d bytes, past %d "
                             "(MQTT_MAX_SESSION_RECORD_BYTES): not saved" % (size, limit) in b.log_text(), 10,
                     "the refusal logged")
            assert int(stats(b)["mqtt_session_records"]) == before  # nothing written
