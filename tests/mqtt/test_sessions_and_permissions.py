"""MQTT CONNECT, users and permissions, takeover, wills and keep-alive on a real broker (docs/mqtt.md)."""

import time

import pytest

from metaq.mqtt import wire
from metaq.mqtt.records import partition_for
from tests.harness.acl import SECRETS, secured_config
from tests.harness.mqtt import V311, V5, Paho, Raw, mosquitto_pub, mqtt_config, with_mqtt


def _secured(tmp_path, **mqtt):
    return with_mqtt(secured_config(tmp_path), **mqtt)


def _records(b, name, user="admin"):
    with b.client() as c:
        assert user is None or c.auth(user, SECRETS[user]).code == 200
        r = c.get_records(name.split("/")[0], partition_for(name, 2), 0)
    return r if isinstance(r, list) else []


def test_a_wrong_or_missing_password_gets_the_connack_code_then_close(broker_factory, tmp_path):
    b = broker_factory(_secured(tmp_path))
    for version, bad, missing in ((wire.MQTT_5, 0x86, 0x87), (wire.MQTT_311, 0x04, 0x05)):
        raw = Raw(b, version)
        assert raw.connect("x", username="alice", password=b"wrong").reason_code == bad
        assert raw.closed()
        raw = Raw(b, version)
        assert raw.connect("x").reason_code == missing
        assert raw.closed()
        raw = Raw(b, version)
        assert raw.connect("x", username="alice", password=SECRETS["alice"].encode()).reason_code == 0
        raw.close()
    r = mosquitto_pub(b, "orders/a", "m", 1, "mqttv311", "-u", "alice", "-P", "nope")
    assert r.returncode != 0 and "not authori" in r.stderr.lower() or "bad user" in r.stderr.lower(), r.stderr
    assert "mqtt authentication failed from 127.0.0.1: wrong secret for user alice" in b.log_text()


def test_publish_and_subscribe_are_the_guards_decisions(broker_factory, tmp_path):
    b = broker_factory(_secured(tmp_path))
    bob = Raw(b)
    assert bob.connect("bob-1", username="bob", password=SECRETS["bob"].encode()).reason_code == 0
    bob.send(wire.Publish("orders/eu", b"ok", 1, packet_id=1))
    assert bob.read() == wire.PubAck(1)
    bob.send(wire.Publish("payroll/x", b"no", 1, packet_id=2))
    ack = bob.read()  # MQTT 5: told why, and the connection stays
    assert (ack.packet_id, ack.reason_code) == (2, wire.NOT_AUTHORIZED)
    assert ack.properties["reason_string"] == "permission denied: user bob may not publish to topic payroll"
    quiet = Raw(b)  # a client that asks for no problem information gets the code alone
    assert quiet.connect("bob-quiet", username="bob", password=SECRETS["bob"].encode(),
                         properties={"request_problem_information": 0}).reason_code == 0
    quiet.send(wire.Publish("payroll/x", b"no", 1, packet_id=1))
    assert quiet.read() == wire.PubAck(1, wire.NOT_AUTHORIZED)
    bob.send(wire.Subscribe(3, (wire.Subscription("orders/#", 1),)))
    assert bob.read() == wire.Suback(3, (wire.NOT_AUTHORIZED,))  # bob may publish to orders, not read it
    bob.send(wire.PingReq())
    assert bob.read() == wire.PingResp()
    old = Raw(b, wire.MQTT_311)
    assert old.connect("bob-2", username="bob", password=SECRETS["bob"].encode()).reason_code == 0
    old.send(wire.Subscribe(1, (wire.Subscription("orders", 1),)))
    assert old.read() == wire.Suback(1, (0x80,))
    old.send(wire.Publish("payroll/x", b"no", 1, packet_id=2))
    assert old.closed()  # MQTT 3.1.1 has no negative acknowledgement: closed, nothing acknowledged
    assert [r.data.endswith(b"ok") for r in _records(b, "orders/eu")] == [True]
    assert _records(b, "payroll/x") == []


def test_a_hash_filter_delivers_only_the_topics_its_user_may_read(broker_factory, tmp_path):
    b = broker_factory(_secured(tmp_path))
    with b.client() as c:  # the topics exist before the subscription
        assert c.auth("admin", SECRETS["admin"]).code == 200
        c.put_ok("orders", b"old")
        c.put_ok("payroll", b"old")
    reader = Paho(b, "reader-1", user="reader", secret=SECRETS["reader"])
    assert reader.subscribe("#", qos=1) == [1]
    assert reader.subscribe("payroll/#", qos=1) == [0x87]
    admin = Paho(b, "admin-1", user="admin", secret=SECRETS["admin"])
    admin.publish("payroll/salaries", b"secret", 1)
    admin.publish("orders/eu", b"visible", 1)
    admin.publish("brandnew/x", b"new topic", 1)  # created after the subscription: read from its start
    got = reader.wait_messages(2)
    time.sleep(1.5)  # anything else would have arrived by now
    assert sorted(m.topic for m in reader.messages) == ["brandnew/x", "orders/eu"], [m.topic for m in got]


def test_a_second_connection_with_the_client_id_takes_over(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    first = Raw(b)
    assert first.connect("same-id").reason_code == 0
    second = Raw(b)
    assert second.connect("same-id").reason_code == 0
    assert first.read() == wire.Disconnect(wire.SESSION_TAKEN_OVER)
    assert first.closed()
    second.send(wire.PingReq())
    assert second.read() == wire.PingResp()


def test_an_empty_client_id_gets_one_assigned_in_mqtt5(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    ack = Raw(b).connect("")
    assert ack.reason_code == 0 and ack.properties["assigned_client_identifier"].startswith("metaq-")
    assert Raw(b, wire.MQTT_311).connect("", clean_start=True).reason_code == 0


def test_a_will_is_published_on_an_abnormal_close_and_not_after_disconnect(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    watcher = Paho(b, "watcher")
    watcher.subscribe("status/#", qos=1)
    gone = Raw(b)
    assert gone.connect("dev-a", will=wire.Will("status/dev-a", b"offline", 1)).reason_code == 0
    gone.close()  # no DISCONNECT
    polite = Raw(b)
    assert polite.connect("dev-b", will=wire.Will("status/dev-b", b"offline", 1)).reason_code == 0
    polite.send(wire.Disconnect())
    assert polite.closed()
    got = watcher.wait_messages(1)
    time.sleep(0.5)
    assert [(m.topic, m.payload) for m in got] == [("status/dev-a", b"offline")] and len(watcher.messages) == 1


def test_mqtt5_will_delay_holds_the_will_and_a_resumed_client_id_drops_it(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    watcher = Paho(b, "watcher")
    watcher.subscribe("status/#", qos=1)
    expiry = {"session_expiry_interval": 60}
    delayed = wire.Will("status/late", b"late", 1, properties={"will_delay_interval": 2})
    raw = Raw(b)
    assert raw.connect("late", will=delayed, properties=expiry).reason_code == 0
    started = time.monotonic()
    raw.close()
    assert watcher.wait_messages(1, timeout=10)[0].payload == b"late"
    assert 1.5 <= time.monotonic() - started < 6
    back = Raw(b)
    assert back.connect("back", will=wire.Will("status/back", b"back", 1, properties={"will_delay_interval": 2}),
                        properties=expiry).reason_code == 0
    back.close()
    again = Raw(b)
    assert again.connect("back", clean_start=False).reason_code == 0  # resumed before the delay: no will
    time.sleep(3)
    assert [m.payload for m in watcher.messages] == [b"late"]


def test_keep_alive_is_enforced_at_one_and_a_half_times_and_fires_the_will(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    watcher = Paho(b, "watcher", version=V311)
    watcher.subscribe("status/#", qos=1)
    silent = Raw(b, wire.MQTT_311)
    assert silent.connect("silent", keep_alive=1, will=wire.Will("status/silent", b"lost", 0)).reason_code == 0
    started = time.monotonic()
    assert silent.closed()
    assert 1.4 <= time.monotonic() - started < 6  # 1.5 x its Keep Alive (late when loaded), not the idle timeout
    assert watcher.wait_messages(1)[0].payload == b"lost"
    pinging = Paho(b, "pinging", version=V5, keepalive=1)  # paho pings within its keep-alive: stays connected
    time.sleep(3)
    assert pinging.c.is_connected()
    assert b.log_text().count(": no request for 2 s; closing") == 1  # one line (1.5 s, written rounded)


def test_half_a_packet_does_not_keep_a_connection_alive_and_a_slow_whole_one_does(broker_factory, tmp_path):
    cfg = mqtt_config(tmp_path)
    cfg.setdefault("limits", {})["request_timeout_s"] = 30.0  # far past the keep-alive: the keep-alive closes first
    b = broker_factory(cfg)
    watcher = Paho(b, "watcher", version=V311)
    watcher.subscribe("status/#", qos=1)
    slow = Raw(b, wire.MQTT_311)  # each PUBLISH in three slices over 1.2 s, for 4.8 s in all
    assert slow.connect("slow", keep_alive=1).reason_code == 0
    for packet_id in range(1, 5):
        data = wire.encode(wire.Publish("slow/x", b"%d" % packet_id * 50, 1, packet_id=packet_id), wire.MQTT_311)
        for piece in (data[:3], data[3:40], data[40:]):
            slow.send_bytes(piece)
            time.sleep(0.4)
        assert slow.read() == wire.PubAck(packet_id)
    dying = Raw(b, wire.MQTT_311)  # dies in the middle of a PUBLISH
    assert dying.connect("dying", keep_alive=1, will=wire.Will("status/dying", b"lost", 0)).reason_code == 0
    started = time.monotonic()
    dying.send_bytes(wire.encode(wire.Publish("status/x", b"never whole", 1, packet_id=1), wire.MQTT_311)[:6])
    assert dying.closed()
    assert 1.4 <= time.monotonic() - started < 6  # 1.5 x its Keep Alive, not the 30 s request deadline
    assert [m.payload for m in watcher.wait_messages(1)] == [b"lost"]
    assert b.log_text().count(": no bytes of a request begun for 2 s; closing") == 1
    with b.client() as c:  # the will stored, nothing of the half packet
        stored = [r.data for p in range(2) for r in as_list(c.get_records("status", p, 0))]
    assert [d for d in stored if d.endswith(b"lost")] and not [d for d in stored if b"never whole" in d]
    assert len(_records(b, "slow/x", None)) == 4


def test_a_packet_arriving_steadily_is_served_however_long_it_takes_and_a_stalled_one_is_closed(broker_factory,
                                                                                                 tmp_path):
    cfg = mqtt_config(tmp_path)
    cfg.setdefault("limits", {})["request_timeout_s"] = 30.0
    b = broker_factory(cfg)
    # Keep Alive bounds the time from the end of one packet to the start of the next (MQTT 3.1.2.10), not a
    # packet's transmission: a PUBLISH begun at once and sent in six slices 1 s apart (5 s, over three times
    # 1.5 x its Keep Alive; each gap within it) on a working network is served.
    steady = Raw(b, wire.MQTT_311)
    assert steady.connect("steady", keep_alive=1).reason_code == 0
    data = wire.encode(wire.Publish("steady/x", b"p" * 20000, 1, packet_id=1), wire.MQTT_311)
    step = len(data) // 6 + 1
    for start in range(0, len(data), step):
        steady.send_bytes(data[start:start + step])
        time.sleep(1.0)
    assert steady.read() == wire.PubAck(1)
    assert len(_records(b, "steady/x", None)) == 1
    # bytes that stop inside a packet: closed 1.5 x Keep Alive after the last ones, not at the request deadline
    stalled = Raw(b, wire.MQTT_311)
    assert stalled.connect("stalled", keep_alive=1).reason_code == 0
    for start in range(0, 3 * step, step):
        time.sleep(0.5)
        stalled.send_bytes(data[start:start + step])
    started = time.monotonic()
    assert stalled.closed()
    assert 1.4 <= time.monotonic() - started < 6  # 1.5 x its Keep Alive after its last bytes (late when loaded)
    assert b.log_text().count(": no bytes of a request begun for 2 s; closing") == 1


def as_list(reply):
    return reply if isinstance(reply, list) else []


def test_no_local_skips_the_clients_own_messages_and_unsubscribe_stops_delivery(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    me = Raw(b)
    assert me.connect("me").reason_code == 0
    me.send(wire.Subscribe(1, (wire.Subscription("chat/#", 1, no_local=True),)))
    assert me.read() == wire.Suback(1, (1,))
    me.send(wire.Publish("chat/room", b"mine", 0))
    Paho(b, "you").publish("chat/room", b"yours", 1)
    got = me.read()
    assert (got.topic, got.payload) == ("chat/room", b"yours")
    me.send(wire.PubAck(got.packet_id))
    me.send(wire.Unsubscribe(2, ("chat/#", "never/#")))
    assert me.read() == wire.Unsuback(2, (wire.SUCCESS, wire.NO_SUBSCRIPTION_EXISTED))
    Paho(b, "you-again").publish("chat/room", b"after", 1)
    me.sock.settimeout(1.0)
    with pytest.raises(OSError):
        me.read()  # nothing after the UNSUBSCRIBE


def test_a_takeover_publishes_the_old_connections_will_and_a_stopping_broker_the_open_ones(broker_factory, tmp_path):
    b = broker_factory(mqtt_config(tmp_path))
    watcher = Paho(b, "watcher")
    watcher.subscribe("status/#", qos=1)
    old = Raw(b)
    assert old.connect("dev", will=wire.Will("status/dev", b"taken over", 1)).reason_code == 0
    new = Raw(b)
    assert new.connect("dev").reason_code == 0
    assert watcher.wait_messages(1)[0].payload == b"taken over"
    held = Raw(b)
    delayed = wire.Will("status/held", b"broker stopped", 1, properties={"will_delay_interval": 60})
    assert held.connect("held", will=delayed, properties={"session_expiry_interval": 120}).reason_code == 0
    held.close()  # its will waits for its delay...
    time.sleep(0.3)
    assert b.stop() == 0  # ...and the broker stopping ends its session: published now
    b.start()
    with b.client() as c:
        bodies = [r.data for r in c.get_records("status", partition_for("status/held", 2), 0)]
    assert any(d.endswith(b"broker stopped") for d in bodies)
    assert "Traceback" not in b.log_text() and "stopped cleanly" in b.log_text()


def test_a_reloaded_permissions_file_stops_a_delivery_at_once(broker_factory, tmp_path):
    from tests.harness.acl import reload_user
    b = broker_factory(_secured(tmp_path))
    reader = Paho(b, "reader-2", user="reader", secret=SECRETS["reader"])
    assert reader.subscribe("orders/#", qos=1) == [1]
    admin = Paho(b, "admin-2", user="admin", secret=SECRETS["admin"])
    admin.publish("orders/a", b"before", 1)
    assert [m.payload for m in reader.wait_messages(1)] == [b"before"]
    reload_user(b, tmp_path, "reader", topics={"payroll": "deny", "orders": "deny"})
    admin.publish("orders/a", b"after", 1)
    time.sleep(1.0)
    assert [m.payload for m in reader.messages] == [b"before"]


def test_before_its_login_a_connection_may_send_64_kib_at_most(broker_factory, tmp_path):
    b = broker_factory(_secured(tmp_path))
    alice = {"username": "alice", "password": SECRETS["alice"].encode()}
    within = Raw(b)
    assert within.connect("w", will=wire.Will("orders/w", b"w" * (60 << 10)), **alice).reason_code == 0
    past = Raw(b)
    past.send(wire.Connect(wire.MQTT_5, "p", will=wire.Will("orders/p", b"p" * 65535), **alice))
    assert past.closed()  # refused on its length, before its body is read


def test_a_user_cannot_take_over_another_users_client_id(broker_factory, tmp_path):
    b = broker_factory(_secured(tmp_path))
    alice = {"username": "alice", "password": SECRETS["alice"].encode()}
    first = Raw(b)
    assert first.connect("device-7", **alice).reason_code == 0
    bob = Raw(b)
    assert bob.connect("device-7", username="bob", password=SECRETS["bob"].encode()).reason_code == \
        wire.CLIENT_ID_NOT_VALID
    assert bob.closed()
    first.send(wire.PingReq())
    assert first.read() == wire.PingResp()  # alice's device stays
    again = Raw(b)
    assert again.connect("device-7", **alice).reason_code == 0  # alice herself takes it over
    assert first.read() == wire.Disconnect(wire.SESSION_TAKEN_OVER)
