"""Shared subscriptions (docs/mqtt.md "Shared subscriptions"): ``$share/<group>/<filter>`` sends each message to one
member of the group; a new group starts at the end of the log; a group's read position is kept (in ``%MQTT%``) while
a session holding one of its subscriptions exists, so what is published while it has no member is delivered when one
comes back; otherwise it ends with its last member."""

import collections
import threading
import time

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from metaq.mqtt import wire
from tests.harness.acl import SECRETS, secured_config
from tests.harness.broker import wait_for
from tests.harness.mqtt import V311, Paho, Raw, mqtt_config, with_mqtt
from tests.harness.replication import stats
from tests.mqtt.test_persistent_sessions import _publish


def _member(b, client_id, version=wire.MQTT_5):
    raw = Raw(b, version)
    props = {"receive_maximum": 1} if version == wire.MQTT_5 else {}
    assert raw.connect(client_id, properties=props).reason_code == 0
    raw.send(wire.Subscribe(1, (wire.Subscription("$share/g/work/#", 1),)))
    assert raw.read() == wire.Suback(1, (1,))
    return raw


def _collect(raw, into, stop):
    raw.sock.settimeout(0.5)
    while not stop.is_set():
        try:
            p = raw.read()
        except OSError:
            continue
        if p is None:
            return
        into.append(p.payload)
        raw.send(wire.PubAck(p.packet_id))


def test_each_message_goes_to_one_member(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    members = [_member(b, "m1"), _member(b, "m2", wire.MQTT_311)]
    got = [[], []]
    stop = threading.Event()
    threads = [threading.Thread(target=_collect, args=(m, g, stop)) for m, g in zip(members, got, strict=True)]
    for t in threads:
        t.start()
    try:
        _publish(b, 20, topic="work/jobs")
        end = time.monotonic() + 20
        while len(got[0]) + len(got[1]) < 20 and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(0.5)  # nothing more comes
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert sorted(got[0] + got[1]) == sorted(b"m%d" % i for i in range(20))  # each once
    assert got[0] and got[1], got  # both members had their share
    with b.client() as c:
        assert c.stats_dict()["mqtt_shared_groups"] == "1"
    for m in members:
        m.send(wire.Unsubscribe(2, ("$share/g/work/#",)))
    for m in members:  # both answered: the group has no member left
        assert type(answer := m.read()) is wire.Unsuback and answer.packet_id == 2, answer
    with b.client() as c:
        assert c.stats_dict()["mqtt_shared_groups"] == "0"


def test_a_shared_group_is_a_consumer_group_of_the_guard(broker_factory, tmp_path):
    """alice may consume as group billing, not as any other: $share/<group> asks the guard to consume as it."""
    b = broker_factory(with_mqtt(secured_config(tmp_path)))
    raw = Raw(b)
    assert raw.connect("alice-1", username="alice", password=SECRETS["alice"].encode()).reason_code == 0
    raw.send(wire.Subscribe(1, (wire.Subscription("$share/billing/orders/#", 1),
                                wire.Subscription("$share/other/orders/#", 1),
                                wire.Subscription("$share/billing/payroll/#", 1))))
    assert raw.read() == wire.Suback(1, (1, wire.NOT_AUTHORIZED, wire.NOT_AUTHORIZED))


def test_a_member_that_stops_acknowledging_does_not_hold_the_group_back(broker_factory, tmp_path):
    """A member whose window of messages in flight is full takes no more: the others get the rest, at once."""
    b = broker_factory(mqtt_config(tmp_path))
    stuck = _member(b, "stuck")  # Receive Maximum 1, never acknowledges
    busy = _member(b, "busy")
    got, stop = [], threading.Event()
    t = threading.Thread(target=_collect, args=(busy, got, stop))
    t.start()
    try:
        started = time.monotonic()
        _publish(b, 10, topic="work/jobs")
        end = time.monotonic() + 20
        while len(got) < 9 and time.monotonic() < end:
            time.sleep(0.05)
        took = time.monotonic() - started
    finally:
        stop.set()
        t.join()
    held = stuck.read()  # the one it was sent, never acknowledged
    assert sorted(got + [held.payload]) == sorted(b"m%d" % i for i in range(10))
    assert took < 5, took  # not one wait per message


def test_a_persistent_session_rejoins_its_shared_group(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    other = _member(b, "other")
    raw = Raw(b)
    assert raw.connect("keeper", clean_start=False, properties={"session_expiry_interval": 3600}).reason_code == 0
    raw.send(wire.Subscribe(1, (wire.Subscription("$share/g/work/#", 1),)))
    assert raw.read() == wire.Suback(1, (1,))
    raw.send(wire.Disconnect())
    raw.close()
    other.send(wire.Disconnect())
    other.close()
    b.stop()
    b.start()
    raw = Raw(b)
    ack = raw.connect("keeper", clean_start=False, properties={"session_expiry_interval": 3600})
    assert ack.session_present
    _publish(b, 2, topic="work/jobs")  # the group is back with its one member: both are its
    got = []
    for _ in range(2):
        p = raw.read()
        got.append(p.payload)
        raw.send(wire.PubAck(p.packet_id))
    assert got == [b"m0", b"m1"]


def _hour():
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    return props


def _payloads(client, n):
    got = client.wait_messages(n)
    assert len(got) >= n, [m.payload for m in got]
    return [m.payload for m in got]


def test_a_group_goes_on_from_where_it_stopped_while_a_members_session_exists(broker_factory, tmp_path):
    """Group g has a persistent member: its position outlives its members, a kill -9 and a restart too, and the gap
    is delivered when the member comes back. Group h has clean members only: it ends with its last one. When the
    persistent session ends, g's kept position ends with it."""
    b = broker_factory(mqtt_config(tmp_path))
    keeper = Paho(b, "keeper", clean=False, properties=_hour())
    assert keeper.subscribe("$share/g/jobs/#", 1) == [1]
    passer = Paho(b, "passer", version=V311)  # a clean session
    assert passer.subscribe("$share/g/jobs/#", 1) == [1]
    lone = Paho(b, "lone")
    assert lone.subscribe("$share/h/jobs/#", 1) == [1]
    pub = Paho(b, "pub")
    pub.publish("jobs/a", b"before", 1)
    assert _payloads(lone, 1) == [b"before"]
    wait_for(lambda: len(keeper.messages) + len(passer.messages) == 1, 10, "group g delivered it")
    for c in (keeper, passer, lone):  # the clean passer leaves last
        c.close()
    wait_for(lambda: stats(b)["mqtt_shared_groups"] == "0", 10, "no group has members")
    assert stats(b)["mqtt_shared_groups_kept"] == "1"  # g: the keeper's session holds it
    for i in range(3):
        pub.publish("jobs/a", b"gap%d" % i, 1)
    pub.close()
    b.kill()  # kill -9: the position was written when the last member left
    b.start()
    pub = Paho(b, "pub")
    pub.publish("jobs/a", b"after", 1)
    keeper = Paho(b, "keeper", clean=False, properties=_hour())
    assert keeper.session_present
    assert _payloads(keeper, 4) == [b"gap0", b"gap1", b"gap2", b"after"]
    lone = Paho(b, "lone")
    assert lone.subscribe("$share/h/jobs/#", 1) == [1]
    pub.publish("jobs/a", b"late", 1)
    assert _payloads(lone, 1) == [b"late"]  # h began again at the end: nothing was kept for it
    assert _payloads(keeper, 5)[4] == b"late"
    keeper.settle()  # its PUBACK of "late" is out before its DISCONNECT
    keeper.close()
    raw = Raw(b)  # no reconnecting network thread across the restart
    assert raw.connect("keeper", clean_start=False, properties={"session_expiry_interval": 3600}).session_present
    pub.close()
    b.stop()  # SIGTERM while the keeper is a member: the group's position is written as the broker stops
    raw.close()
    b.start()
    pub = Paho(b, "pub")
    pub.publish("jobs/a", b"restarted", 1)
    keeper = Paho(b, "keeper", clean=False, properties=_hour())
    assert _payloads(keeper, 1) == [b"restarted"]
    keeper.close()
    ender = Paho(b, "keeper")  # Clean Start 1, no expiry: the keeper's session ends, and g's position with it
    ender.close()
    wait_for(lambda: stats(b)["mqtt_shared_groups_kept"] == "0", 10, "g's kept position ended")


def test_a_member_that_does_not_read_its_socket_does_not_hold_the_group_back(broker_factory, tmp_path):
    """QoS 0 has no window: a member whose client stopped reading (its socket full, a send to it waiting) takes what
    its buffers hold; the other member gets every other message without waiting, and each message goes to one."""
    b = broker_factory(mqtt_config(tmp_path))
    stuck = Raw(b, wire.MQTT_5)
    assert stuck.connect("stuck").reason_code == 0
    stuck.send(wire.Subscribe(1, (wire.Subscription("$share/g/work/#", 0),)))
    assert stuck.read() == wire.Suback(1, (0,))  # and it reads nothing more until the end
    reader = Paho(b, "reader")
    reader.subscribe("$share/g/work/#", qos=0)
    body = b"x" * 16 * 1024
    sent = [body + b"%d" % i for i in range(2000)]  # 32 MB: far past what the stuck member's buffers hold
    with b.client() as c:
        for data in sent:
            c.put_ok("work", data)
    got = []
    end = time.monotonic() + 20
    while time.monotonic() < end:  # until the reader has had nothing new for a second
        before = len(got)
        got = reader.wait_messages(len(sent), timeout=1)
        if len(got) == before:
            break
    assert len(got) > len(sent) // 2, len(got)
    held = []
    stuck.sock.settimeout(5)
    try:
        while len(got) + len(held) < len(sent):
            held.append(stuck.read().payload)
    except OSError:
        pass
    delivered = collections.Counter([m.payload for m in got] + held)
    assert len(delivered) == len(sent) and max(delivered.values()) == 1, (  # none lost, none twice
        len(got), len(held), len(delivered), max(delivered.values()))
    stuck.close()
