"""One MQTT session's state (metaq/mqtt/session.py): filters matched, QoS 2 packet ids, messages in flight."""

from metaq.mqtt.session import PUBLISH_SENT, PUBREL_SENT, MqttSession, Subscribed


def test_the_highest_qos_of_the_matching_filters_that_read_the_topic_is_granted():
    s = MqttSession("me", 5, 4)
    s.subscribe(Subscribed("sensors/+/temp", 1, False, ["sensors"]))
    s.subscribe(Subscribed("#", 2, False, ["sensors", "orders"]))
    assert s.granted_qos("sensors", "sensors/a/temp", "other") == 2
    s.unsubscribe("#")
    assert s.granted_qos("sensors", "sensors/a/temp", "other") == 1
    assert s.granted_qos("sensors", "sensors/a/humidity", "other") is None
    assert s.granted_qos("orders", "orders", "other") is None  # no filter reads orders any more


def test_no_local_skips_the_sessions_own_messages():
    s = MqttSession("me", 5, 4)
    s.subscribe(Subscribed("t/#", 1, True, ["t"]))
    assert s.granted_qos("t", "t/x", "me") is None and s.granted_qos("t", "t/x", "you") == 1


def test_unsubscribing_drops_the_cursors_no_filter_reads():
    s = MqttSession("me", 4, 4)
    assert s.subscribe(Subscribed("a/#", 0, False, ["a"])) == {"a"}
    assert s.subscribe(Subscribed("a/b", 0, False, ["a"])) == set()
    s.cursors[("a", 0)] = 5
    assert s.unsubscribe("a/#") and ("a", 0) in s.cursors
    assert s.unsubscribe("a/b") and not s.cursors
    assert not s.unsubscribe("a/b")


def test_qos2_packet_ids_are_kept_until_released_and_bounded():
    s = MqttSession("me", 5, 2)
    assert not s.qos2_seen(7)
    s.qos2_stored(7)
    assert s.qos2_seen(7) and s.qos2_room()
    s.qos2_stored(8)
    assert not s.qos2_room()
    assert s.qos2_released(7) and not s.qos2_seen(7) and not s.qos2_released(7)


def test_messages_in_flight_follow_their_acknowledgements():
    s = MqttSession("me", 5, 2)
    a, b = s.next_packet_id(), s.next_packet_id()
    assert (a, b) == (1, 2)
    s.sent(a)
    s.sent(b)
    assert not s.acknowledged(a, PUBREL_SENT)  # a PUBCOMP for a QoS 1 message ends nothing
    assert s.acknowledged(a, PUBLISH_SENT)
    assert s.received(b) and s.inflight[b] == PUBREL_SENT and s.acknowledged(b, PUBREL_SENT)
    assert not s.inflight and not s.received(b)
    for _ in range(65535):
        s.sent(s.next_packet_id())
    assert s.next_packet_id() is None
