"""Exactly once across a session takeover (docs/mqtt.md "Persistent sessions"): what a connection acknowledged stays
acknowledged, whatever its own expiry, through a takeover, a restart and a failover, QoS 1 and 2, MQTT 5 and 3.1.1.

A device's session (Session Expiry Interval 99999, or MQTT 3.1.1 Clean Session 0) subscribed to ``t/a`` at QoS 2 is
away while a QoS 1 and a QoS 2 message are published; a connection resumes it and acknowledges both (PUBACK;
PUBREC, PUBREL, PUBCOMP); then another connection with the client id and Clean Start 0 takes it over. When the
middle connection's session goes on (an expiry above 0, MQTT 3.1.1 Clean Session 0), the new connection resumes it
with both acknowledged: neither comes again, and what is published next does. When it has no expiry (MQTT 5 Session
Expiry Interval 0), the session ends with that connection: on the takeover (MQTT 5.0 §3.1.4: the original session
ends on the takeover), on a restart and on a failover; the client's next CONNECT gets Session Present 0 and a new
session, in which neither message comes again.

A QoS 2 delivery to a persistent session, and its PUBREC, are written (and with ``sync`` replication held by the
slave) before the client is told what depends on them, so a kill -9 or a failover sends it again as itself (DUP) or
its PUBREL, never as a new message."""

import os
import signal
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from metaq.mqtt import limits as mqtt_limits
from metaq import admincli as admin
from metaq.client.local import free_port, small_config
from metaq.mqtt import wire
from tests.harness.broker import wait_for
from tests.harness.mqtt import V5 as PAHO_V5
from tests.harness.mqtt import V311 as PAHO_V311
from tests.harness.mqtt import Paho, Raw, mosquitto_pub, mqtt_config, with_mqtt
from tests.harness.replication import caught_up, master_config, stats
from tests.mqtt.test_persistent_sessions import _big_filters

V5, V311 = wire.MQTT_5, wire.MQTT_311
FOREVER = 99999
#: How long a connection that must get nothing more is watched for a PUBLISH.
QUIET_S = 1.0


def _connect(b, version, client_id, expiry):
    """A connection of ``client_id`` with Clean Start 0 (3.1.1: Clean Session 0) and, in MQTT 5, Session Expiry
    Interval ``expiry`` (None: absent, so 0); ``(Raw, Session Present)``."""
    raw = Raw(b, version)
    props = {"session_expiry_interval": expiry} if version == V5 and expiry is not None else {}
    ack = raw.connect(client_id, clean_start=False, properties=props)
    assert ack.reason_code == 0, ack
    return raw, ack.session_present


def _publish(b, payloads, name="t/a"):
    """Publish each ``(payload, qos)`` to topic ``name``, acknowledged (QoS 2: PUBREC, PUBREL, PUBCOMP)."""
    pub = Raw(b)
    assert pub.connect("publisher").reason_code == 0
    for i, (payload, qos) in enumerate(payloads, 1):
        pub.send(wire.Publish(name, payload, qos, packet_id=i))
        if qos == 1:
            assert pub.read() == wire.PubAck(i)
        else:
            assert pub.read() == wire.PubRec(i)
            pub.send(wire.PubRel(i))
            assert pub.read() == wire.PubComp(i)
    pub.send(wire.Disconnect())
    pub.close()


def _receive_and_acknowledge(raw, n):
    """Read ``n`` PUBLISHes, acknowledging each fully (QoS 1: PUBACK; QoS 2: PUBREC, then PUBCOMP for its PUBREL);
    their ``(payload, qos)`` in order."""
    got = []
    while len(got) < n:
        p = raw.read()
        assert isinstance(p, wire.Publish), p
        got.append((p.payload, p.qos))
        if p.qos == 1:
            raw.send(wire.PubAck(p.packet_id))
        else:
            raw.send(wire.PubRec(p.packet_id))
            assert raw.read() == wire.PubRel(p.packet_id)
            raw.send(wire.PubComp(p.packet_id))
    return got


def _nothing_more(raw):
    """No PUBLISH (nor anything else) comes on ``raw`` within ``QUIET_S``."""
    raw.sock.settimeout(QUIET_S)
    try:
        p = raw.read()
    except OSError:
        p = None
    finally:
        raw.sock.settimeout(10.0)
    assert p is None or not isinstance(p, wire.Publish), "delivered again: %r" % (p,)


def _acknowledged_by_a_middle_connection(b, version, middle_expiry):
    """The device's session subscribed to ``t/a`` at QoS 2 and away; a QoS 1 and a QoS 2 message published; a middle
    connection (Clean Start 0, ``middle_expiry``) resumes the session and acknowledges both. Returns it, open."""
    first, present = _connect(b, version, "dev", FOREVER)
    assert not present
    first.send(wire.Subscribe(1, (wire.Subscription("t/a", 2),)))
    assert first.read() == wire.Suback(1, (2,))
    first.send(wire.Disconnect())
    first.close()
    _publish(b, [(b"one", 1), (b"two", 2)])
    middle, present = _connect(b, version, "dev", middle_expiry)
    assert present
    assert _receive_and_acknowledge(middle, 2) == [(b"one", 1), (b"two", 2)]
    middle.send(wire.PingReq())  # answered after the acknowledgements before it were handled
    assert middle.read() == wire.PingResp()
    return middle


def _taken_over(b, version, middle):
    """A new connection with the client id, Clean Start 0 and a Session Expiry Interval takes ``middle`` over;
    ``(Raw, Session Present)``."""
    new, present = _connect(b, version, "dev", FOREVER)
    if version == V5:
        assert middle.read() == wire.Disconnect(wire.SESSION_TAKEN_OVER)
    assert middle.closed()
    return new, present


def _goes_on(b, raw, present, payload):
    """The session went on (Session Present 1) with both acknowledged: neither comes again; a new message does."""
    assert present
    _nothing_more(raw)
    _publish(b, [(payload, 2)])
    assert _receive_and_acknowledge(raw, 1) == [(payload, 2)]


def _ended(raw, present):
    """The session ended (Session Present 0): a new one, in which nothing comes."""
    assert not present
    _nothing_more(raw)


GOES_ON = [pytest.param(V5, FOREVER, id="mqtt5-expiry"), pytest.param(V311, None, id="mqtt311-clean0")]


@pytest.mark.parametrize("version,middle_expiry", GOES_ON)
def test_a_takeover_keeps_what_the_connection_it_took_over_acknowledged(broker_factory, tmp_path, version,
                                                                       middle_expiry):
    b = broker_factory(mqtt_config(tmp_path))
    middle = _acknowledged_by_a_middle_connection(b, version, middle_expiry)
    new, present = _taken_over(b, version, middle)
    _goes_on(b, new, present, b"three")


def test_a_takeover_ends_the_session_of_a_connection_without_expiry(broker_factory, tmp_path):
    """MQTT 5.0 §3.1.4 (the note to [MQTT-3.1.4-3]): a session whose connection has Session Expiry Interval 0 ends on
    the takeover; the new connection's Clean Start 0 finds none (Session Present 0), so what the middle connection
    acknowledged is not delivered as new messages."""
    b = broker_factory(mqtt_config(tmp_path))
    middle = _acknowledged_by_a_middle_connection(b, V5, None)
    new, present = _taken_over(b, V5, middle)
    _ended(new, present)
    new.send(wire.Disconnect())
    new.close()
    again, present = _connect(b, V5, "dev", FOREVER)  # the session the takeover began, with no subscription
    assert present
    _nothing_more(again)


@pytest.mark.slow
@pytest.mark.parametrize("version,middle_expiry", GOES_ON)
def test_what_was_acknowledged_before_a_takeover_stays_so_across_a_restart(broker_factory, tmp_path, version,
                                                                          middle_expiry):
    b = broker_factory(mqtt_config(tmp_path))
    middle = _acknowledged_by_a_middle_connection(b, version, middle_expiry)
    new, present = _taken_over(b, version, middle)
    assert present
    new.close()
    b.stop()
    b.start()
    again, present = _connect(b, version, "dev", FOREVER)
    _goes_on(b, again, present, b"three")


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize("how", ["restart", "kill -9"])
def test_a_session_without_expiry_ends_with_the_broker(broker_factory, tmp_path, how):
    """A session resumed by a connection with Session Expiry Interval 0 ends with that connection, and so with the
    broker: after a restart or a kill -9 the client finds none, not the state from before that connection's
    acknowledgements."""
    b = broker_factory(mqtt_config(tmp_path))
    middle = _acknowledged_by_a_middle_connection(b, V5, None)
    if how == "restart":
        b.stop()
    else:
        b.kill()
    middle.close()
    b.start()
    again, present = _connect(b, V5, "dev", FOREVER)
    _ended(again, present)


def _pair(broker_factory, tmp_path, sync_timeout_ms=2000):
    """A ``sync`` master with the MQTT port and its slave (the MQTT port too), once the slave is connected."""
    rport = free_port()
    m = broker_factory(with_mqtt(master_config(tmp_path / "m", rport, mode="sync", sync_timeout_ms=sync_timeout_ms)),
                       workdir=tmp_path / "m")
    s = broker_factory(with_mqtt(small_config(os.path.join(str(tmp_path / "s"), "data"))), workdir=tmp_path / "s",
                       extra_args=["--slave-of", "127.0.0.1:%d" % rport, "--slave-id", "1"])
    wait_for(lambda: stats(m)["replication_slaves"] == "1", 10, "slave connected")
    return m, s


def _fail_over(m, s, capsys):
    """Once the slave holds everything the master wrote, the master is killed and the slave promoted."""
    caught_up(m, s)
    m.kill()
    code = admin.main(["promote", "127.0.0.1:%d" % s.port, "--force"])
    assert code == admin.EXIT_OK, capsys.readouterr().err
    wait_for(lambda: stats(s)["replication_role"] == "master", 10, "promoted")


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize("version,middle_expiry", GOES_ON)
def test_what_was_acknowledged_before_a_takeover_stays_so_across_a_failover(broker_factory, tmp_path, capsys,
                                                                           version, middle_expiry):
    m, s = _pair(broker_factory, tmp_path)
    middle = _acknowledged_by_a_middle_connection(m, version, middle_expiry)
    new, present = _taken_over(m, version, middle)
    assert present
    _fail_over(m, s, capsys)
    new.close()
    again, present = _connect(s, version, "dev", FOREVER)
    _goes_on(s, again, present, b"three")


@pytest.mark.slow
@pytest.mark.fault
def test_a_session_without_expiry_ends_with_the_master_it_was_on(broker_factory, tmp_path, capsys):
    """The slave learns that a connection with Session Expiry Interval 0 holds the session (it ends with it): the
    promoted slave has none to give the client, not the state from before that connection's acknowledgements."""
    m, s = _pair(broker_factory, tmp_path)
    middle = _acknowledged_by_a_middle_connection(m, V5, None)
    _fail_over(m, s, capsys)
    middle.close()
    again, present = _connect(s, V5, "dev", FOREVER)
    _ended(again, present)


def _resent(raw):
    """What a resumed session is sent again, each answered (a PUBREL: PUBCOMP; a PUBLISH: acknowledged as
    ``_receive_and_acknowledge`` does), until nothing comes for ``QUIET_S``: ``[(kind, payload or None, DUP)]``."""
    out = []
    raw.sock.settimeout(QUIET_S)
    try:
        while True:
            try:
                p = raw.read()
            except OSError:
                return out
            if isinstance(p, wire.PubRel):
                out.append(("pubrel", None, None))
                raw.send(wire.PubComp(p.packet_id))
            elif isinstance(p, wire.Publish):
                out.append(("publish", p.payload, p.dup))
                raw.send(wire.PubAck(p.packet_id) if p.qos == 1 else wire.PubRec(p.packet_id))
            else:
                return out
    finally:
        raw.sock.settimeout(10.0)


@pytest.mark.slow
@pytest.mark.fault
@pytest.mark.parametrize("acknowledged", ["nothing", "pubrec", "pubcomp"])
def test_a_qos2_delivery_stays_exactly_once_across_a_kill(broker_factory, tmp_path, acknowledged):
    """A QoS 2 delivery to a persistent session is written with its read position past it before it is sent, and its
    PUBREC before the PUBREL goes out: killed at once after (before the periodic save), the broker sends it again
    as the same packet (DUP) when nothing was acknowledged, and only the PUBREL once the PUBREC came: never as a new
    message."""
    b = broker_factory(mqtt_config(tmp_path))
    raw, present = _connect(b, V5, "dev", FOREVER)
    raw.send(wire.Subscribe(1, (wire.Subscription("t/a", 2),)))
    assert raw.read() == wire.Suback(1, (2,))
    _publish(b, [(b"two", 2)])
    p = raw.read()
    assert (p.payload, p.qos) == (b"two", 2)
    if acknowledged != "nothing":
        raw.send(wire.PubRec(p.packet_id))
        assert raw.read() == wire.PubRel(p.packet_id)
    if acknowledged == "pubcomp":
        raw.send(wire.PubComp(p.packet_id))
    raw.send(wire.PingReq())
    assert raw.read() == wire.PingResp()
    b.kill()
    raw.close()
    b.start()
    again, present = _connect(b, V5, "dev", FOREVER)
    assert present
    expected = {"nothing": ([("publish", b"two", True), ("pubrel", None, None)],),
                "pubrec": ([("pubrel", None, None)],),
                "pubcomp": ([("pubrel", None, None)], [])}[acknowledged]  # the PUBCOMP saved within the second, or not
    assert _resent(again) in expected


def test_a_takeover_hands_on_the_session_its_record_could_not_hold(broker_factory, tmp_path):
    """A session whose record would be past MQTT_MAX_SESSION_RECORD_BYTES is not written (its last record holds none
    of its subscriptions), yet a takeover hands it on as its connection held it, in memory: its subscriptions, and
    what it acknowledged stays acknowledged."""
    b = broker_factory(with_mqtt(small_config(tmp_path / "data", store={"segment_size": 4 << 20})))
    filters = _big_filters("dev", mqtt_limits.MQTT_MAX_SESSION_RECORD_BYTES + 1)
    name = filters[0]
    first, present = _connect(b, V5, "dev", FOREVER)
    first.send(wire.Subscribe(1, tuple(wire.Subscription(f, 2) for f in filters)))
    assert first.read() == wire.Suback(1, (2,) * len(filters))
    wait_for(lambda: "client dev: its session needs a record of" in b.log_text(), 10, "the record refused")
    _publish(b, [(b"one", 1), (b"two", 2)], name)
    assert _receive_and_acknowledge(first, 2) == [(b"one", 1), (b"two", 2)]
    first.send(wire.PingReq())
    assert first.read() == wire.PingResp()
    new, present = _taken_over(b, V5, first)
    assert present
    _nothing_more(new)
    _publish(b, [(b"three", 2)], name)
    assert _receive_and_acknowledge(new, 1) == [(b"three", 2)]


def _paho(b, version, expiry):
    """A Paho client ``dev`` with Clean Start 0 (3.1.1: Clean Session 0) and, in MQTT 5, Session Expiry Interval
    ``expiry`` (None: absent)."""
    props = None
    if version == V5 and expiry is not None:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = expiry
    return Paho(b, client_id="dev", version=PAHO_V5 if version == V5 else PAHO_V311, clean=False, properties=props)


@pytest.mark.parametrize("version,middle_expiry,goes_on", [
    pytest.param(V5, None, False, id="mqtt5-no-expiry"), pytest.param(V5, FOREVER, True, id="mqtt5-expiry"),
    pytest.param(V311, None, True, id="mqtt311-clean0")])
def test_paho_clients_through_a_takeover(broker_factory, tmp_path, version, middle_expiry, goes_on):
    """The issue as Paho clients and Mosquitto's publisher meet it: the middle client gets both messages and
    acknowledges them; the client taking it over never gets them again (its session goes on, or ended with a middle
    client without expiry)."""
    b = broker_factory(mqtt_config(tmp_path))
    first = _paho(b, version, FOREVER)
    assert first.subscribe("t/a", 2) == [2]
    first.close()
    for payload, qos in (("one", 1), ("two", 2)):
        assert mosquitto_pub(b, "t/a", payload, qos).returncode == 0
    middle = _paho(b, version, middle_expiry)
    assert middle.session_present
    assert sorted(m.payload for m in middle.wait_messages(2)) == [b"one", b"two"]
    middle.settle()  # its acknowledgements written
    middle.c.loop_stop()  # it reads nothing more and does not connect again once taken over
    new = _paho(b, version, FOREVER)
    assert new.session_present is goes_on
    time.sleep(QUIET_S)
    assert new.messages == []
    if goes_on:
        assert mosquitto_pub(b, "t/a", "three", 2).returncode == 0
        assert [m.payload for m in new.wait_messages(1)] == [b"three"]


@pytest.mark.slow
@pytest.mark.fault
def test_a_pubrel_waits_until_the_sync_slave_holds_the_pubrec(broker_factory, tmp_path, capsys):
    """With ``sync`` replication the PUBREL of a QoS 2 delivery to a persistent session goes out once the slave holds
    the PUBREC's record, as a PUBACK waits for its message: the master killed before then, the promoted slave sends
    the PUBREL (it got the record) or the PUBLISH again as the same packet (DUP), which the client, not yet
    released, takes as the one it has; never the PUBLISH after a PUBREL the client may have completed."""
    m, s = _pair(broker_factory, tmp_path, sync_timeout_ms=20000)
    raw, present = _connect(m, V5, "dev", FOREVER)
    raw.send(wire.Subscribe(1, (wire.Subscription("t/a", 2),)))
    assert raw.read() == wire.Suback(1, (2,))
    _publish(m, [(b"two", 2)])
    p = raw.read()
    assert (p.payload, p.qos, p.dup) == (b"two", 2, False)
    caught_up(m, s)
    s.proc.send_signal(signal.SIGSTOP)  # connected but silent: it confirms nothing
    try:
        raw.send(wire.PubRec(p.packet_id))
        raw.sock.settimeout(2.0)
        with pytest.raises(OSError):
            raw.read()  # no PUBREL while the slave does not hold the PUBREC
        m.kill()
    finally:
        s.proc.send_signal(signal.SIGCONT)
    raw.close()
    code = admin.main(["promote", "127.0.0.1:%d" % s.port, "--force"])
    assert code == admin.EXIT_OK, capsys.readouterr().err
    wait_for(lambda: stats(s)["replication_role"] == "master", 10, "promoted")
    again, present = _connect(s, V5, "dev", FOREVER)
    assert present
    p2 = again.read()  # what the slave had of the PUBREC when the master died: either is exactly once
    if isinstance(p2, wire.Publish):
        assert (p2.payload, p2.dup, p2.packet_id) == (b"two", True, p.packet_id)
        again.send(wire.PubRec(p2.packet_id))
        p2 = again.read()
    assert p2 == wire.PubRel(p.packet_id)
    again.send(wire.PubComp(p.packet_id))
    _nothing_more(again)


@pytest.mark.slow
@pytest.mark.fault
def test_a_qos2_publish_waits_until_the_sync_slave_holds_its_record(broker_factory, tmp_path, capsys):
    """With ``sync`` replication a QoS 2 delivery to a persistent session goes out once the slave holds the record
    that has it in flight: the master killed before then, the promoted slave sends it once (DUP when it got the
    record), never a second copy beside one the client has."""
    m, s = _pair(broker_factory, tmp_path, sync_timeout_ms=20000)
    raw = Raw(m)
    ack = raw.connect("dev", clean_start=False, properties={"session_expiry_interval": FOREVER,
                                                              "receive_maximum": 1})
    assert ack.reason_code == 0
    raw.send(wire.Subscribe(1, (wire.Subscription("t/a", 2),)))
    assert raw.read() == wire.Suback(1, (2,))
    _publish(m, [(b"one", 2), (b"two", 2)])  # "two" waits for room: one message in flight at most
    p = raw.read()
    assert (p.payload, p.qos) == (b"one", 2)
    raw.send(wire.PubRec(p.packet_id))
    assert raw.read() == wire.PubRel(p.packet_id)
    caught_up(m, s)
    s.proc.send_signal(signal.SIGSTOP)  # connected but silent: it confirms nothing
    try:
        raw.send(wire.PubComp(p.packet_id))  # room for "two": its record is written, the slave does not confirm it
        raw.sock.settimeout(2.0)
        with pytest.raises(OSError):
            raw.read()  # no PUBLISH while the slave does not hold the record
        m.kill()
    finally:
        s.proc.send_signal(signal.SIGCONT)
    raw.close()
    code = admin.main(["promote", "127.0.0.1:%d" % s.port, "--force"])
    assert code == admin.EXIT_OK, capsys.readouterr().err
    wait_for(lambda: stats(s)["replication_role"] == "master", 10, "promoted")
    again, present = _connect(s, V5, "dev", FOREVER)
    assert present
    got = _resent(again)
    assert [(kind, payload) for kind, payload, _dup in got] == [("publish", b"two"), ("pubrel", None)]
