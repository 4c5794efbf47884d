"""A publisher's turn keeps, per metaq topic, whether it may send a waiting subscriber's messages itself
(``Outbound.sendable``: the subscriber's user may read the topic and has no fetch rate) while what that reads stands:
a permissions file reloaded (users, rules, quotas), a topic created, altered or deleted (both move
``PutPath.version``), another user on the connection, the session's subscriptions changed. Each of them applies to
the very next message. (On a real broker: ``test_sessions_and_permissions``'s reloaded permissions file stopping a
delivery at once, and the fetch rate below.)"""

import time
from types import SimpleNamespace

from metaq.mqtt import wire
from metaq.mqtt.outbound import Outbound
from metaq.mqtt.session import MqttSession
from tests.harness.acl import SECRETS, reload_user, secured_config
from tests.harness.mqtt import Paho, with_mqtt


class Guard:
    """What ``sendable`` asks of the broker's guard, answered from two settable tables, counting the questions."""

    enabled = True

    def __init__(self):
        self.readable = {"a": True, "b": True}
        self.rate = False
        self.asked = 0

    def paced(self, session, kind):
        self.asked += 1
        return self.rate

    def allows(self, session, action, kind, name):
        self.asked += 1
        return self.readable.get(name, False)


def outbound():
    guard = Guard()
    port = SimpleNamespace(store=None, guard=guard, decoded=None, max_transfer=0, cluster_topics=(),
                           put_path=SimpleNamespace(version=0))
    conn = SimpleNamespace(mqtt=MqttSession("sub", wire.MQTT_5, 10), session=SimpleNamespace(user="u"))
    return Outbound(conn, port), port, conn, guard


def test_the_answer_is_kept_while_nothing_it_reads_changes():
    out, _port, _conn, guard = outbound()
    assert out.sendable("a") and out.sendable("a") and out.sendable("b")
    asked = guard.asked
    for _ in range(5):
        assert out.sendable("a") and out.sendable("b")
    assert guard.asked == asked


def test_a_permission_revoked_or_a_rate_given_applies_to_the_next_message():
    out, port, _conn, guard = outbound()
    assert out.sendable("a")
    guard.readable["a"] = False  # the permissions file reloaded: the broker moves the put path's version
    port.put_path.version += 1
    assert not out.sendable("a")
    guard.readable["a"] = True
    port.put_path.version += 1
    assert out.sendable("a")
    guard.rate = True  # a fetch rate: the user's own greenlet paces its bytes
    port.put_path.version += 1
    assert not out.sendable("a")


def test_without_the_version_moving_a_changed_answer_is_not_seen_so_each_change_must_move_it():
    out, port, conn, guard = outbound()
    assert out.sendable("a")
    guard.readable["a"] = False
    assert out.sendable("a")  # kept: what the version is for
    conn.session.user = "v"  # another user on the connection
    assert not out.sendable("a")
    guard.readable["a"] = True
    out.session.changed()  # the subscriptions changed
    assert out.sendable("a")


def test_the_clusters_inbox_is_asked_each_time():
    out, port, _conn, guard = outbound()
    port.cluster_topics = ("inbox",)
    assert out.sendable("inbox")
    guard.rate = True
    assert not out.sendable("inbox")


def secured_async(tmp_path):
    """Authentication on, ``flush: async``: a subscriber caught up gets a message from the publisher's turn."""
    config = with_mqtt(secured_config(tmp_path))
    config["store"]["flush"] = "async"
    return config


def reader_and_admin(b):
    reader = Paho(b, "reader-k", user="reader", secret=SECRETS["reader"])
    assert reader.subscribe("orders/#", qos=1) == [1]
    admin = Paho(b, "admin-k", user="admin", secret=SECRETS["admin"])
    admin.publish("orders/a", b"before", 1)
    assert [m.payload for m in reader.wait_messages(1)] == [b"before"]
    return reader, admin


def test_a_permission_revoked_between_two_messages_stops_the_next_on_a_real_broker(broker_factory, tmp_path):
    b = broker_factory(secured_async(tmp_path))
    reader, admin = reader_and_admin(b)
    reload_user(b, tmp_path, "reader", topics={"payroll": "deny", "orders": "deny"})
    admin.publish("orders/a", b"after", 1)
    time.sleep(1.0)
    assert [m.payload for m in reader.messages] == [b"before"]


def test_a_fetch_rate_given_between_two_messages_paces_the_next_on_a_real_broker(broker_factory, tmp_path):
    """Once a reload gives the subscriber's user a fetch rate of a few bytes a second, the next messages wait for
    its rate instead of all going out at once from the publishers' turns."""
    b = broker_factory(secured_async(tmp_path))
    reader, admin = reader_and_admin(b)
    reload_user(b, tmp_path, "reader", quotas={"fetch_bytes_per_s": 64})
    started = time.monotonic()
    for i in range(3):
        admin.publish("orders/a", b"x" * 100 + bytes([i]), 1)
    assert len(reader.wait_messages(4, timeout=30)) == 4
    assert time.monotonic() - started >= 1.5  # 300 bytes and more at 64 a second, the first let through at once


def _message(name, client_id="pub"):
    from metaq.mqtt.records import stored_message
    return stored_message(name, b"x", 1, client_id, None)


def test_the_names_sent_in_one_step_are_those_matched_plainly_and_go_with_every_change():
    """``plain_names``: the names whose kept match is a QoS of 1 or more without identifiers, filled by ``decision``
    and kept with ``sendable``'s answer: a moved version, another user, a changed subscription drop them all, and a
    topic its user may not read has none (None)."""
    from metaq.mqtt.session import Subscribed
    out, port, conn, guard = outbound()
    session = out.session
    session.subscriptions["a/+"] = Subscribed("a/+", 1, False, {"a"})
    session.subscriptions["a/q/#"] = Subscribed("a/q/#", 0, False, {"a"})
    session.subscriptions["a/id"] = Subscribed("a/id", 1, False, {"a"}, sub_id=5)
    session.changed()
    names = out.plain_names("a", False)
    assert names == {}
    for name in ("a/x", "a/q/z", "a/id", "b/x"):
        out.decision("a", _message(name))
    assert out.plain_names("a", False) == {"a/x": True} and out.plain_names("a", False) is names
    assert out.plain_names("a", True) == {}  # published by the session's own client: its own kept matches
    out.decision("a", _message("a/y"))
    assert names == {"a/x": True, "a/y": True}
    port.put_path.version += 1  # e.g. the permissions file reloaded
    guard.readable["a"] = False
    assert out.plain_names("a", False) is None
    guard.readable["a"] = True
    port.put_path.version += 1
    assert out.plain_names("a", False) == {"a/x": True, "a/y": True}  # from the kept matches, which still stand
    conn.session.user = "v"
    assert out.plain_names("a", False) is not names
    names = out.plain_names("a", False)
    session.subscriptions["a/+"] = Subscribed("a/+", 0, False, {"a"})  # QoS 0 now
    session.changed()
    assert out.plain_names("a", False) == {}
    out.decision("a", _message("a/x"))
    assert out.plain_names("a", False) == {}


def test_the_clusters_inbox_never_has_names_sent_in_one_step():
    from metaq.mqtt.session import Subscribed
    out, port, _conn, guard = outbound()
    port.cluster_topics = ("inbox",)
    guard.enabled = False  # (a copy's own permission: asked of the guard when it is on)
    out.session.subscriptions["#"] = Subscribed("#", 1, False, {"inbox"})
    out.session.changed()
    assert out.plain_names("inbox", False) == {}
    out.decision("inbox", _message("x/y"))
    assert out.plain_names("inbox", False) == {}
