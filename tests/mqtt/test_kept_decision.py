"""An MQTT connection's write decision kept across its turns (``Publishes.decided``, ``PutPath.decision_stands``):
each change of what the decision reads refuses (or places) the very next PUBLISH of the same connection, on a real
broker: a permissions file revoking the publish, a topic's partitions grown, a topic deleted, a full disk. Between the
two messages the connection parks (a new turn), so the decision it keeps is the one asked."""

import os
import time
from types import SimpleNamespace

import pytest

from metaq.mqtt import limits as mqtt_limits
from metaq.client.local import small_config
from metaq.mqtt import wire
from metaq.mqtt.publishes import Publishes
from metaq.mqtt.records import partition_for
from metaq.mqtt.topicmap import DEFAULT_MAP
from metaq.clock import now_ms
from metaq.serving.putpath import PutPath, WriteGate
from tests.harness.acl import DEFAULT_ROLES, DEFAULT_USERS, SECRETS, secured_config, write_acl
from tests.harness.mqtt import Raw, with_mqtt
from tests.harness.tmpfs import tmpfs
from tests.integration.test_topic_table import admin

PARKED = 0.3  # past the linger before a connection parks: the next PUBLISH is a turn of its own


def _published(raw, packet_id, name="orders/eu", payload=b"m"):
    """The PUBACK of one QoS 1 PUBLISH sent after the connection parked."""
    time.sleep(PARKED)
    raw.send(wire.Publish(name, payload, 1, packet_id=packet_id))
    return raw.read()


def _records(b, topic, partition, user=None):
    with b.client() as c:
        if user is not None:
            assert c.auth(user, SECRETS[user]).code == 200
        r = c.get_records(topic, partition, 0)
    return [m.payload for m in r] if isinstance(r, list) else []


def _wait_for(what, done, timeout=10.0):
    end = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def test_a_permissions_file_revoking_the_publish_refuses_the_connections_next_publish(broker_factory, tmp_path):
    b = broker_factory(with_mqtt(secured_config(tmp_path)))
    bob = Raw(b)
    assert bob.connect("bob-1", username="bob", password=SECRETS["bob"].encode()).reason_code == 0
    assert _published(bob, 1) == wire.PubAck(1)
    assert _published(bob, 2) == wire.PubAck(2)  # the kept decision
    users = dict(DEFAULT_USERS)
    users["bob"] = dict(users["bob"], topics={"orders": "deny"})
    write_acl(tmp_path / "acl.yaml", users=users, roles=DEFAULT_ROLES)
    _wait_for("the file reloaded", lambda: "reloaded: 4 users" in b.log_text())
    ack = _published(bob, 3, payload=b"revoked")
    assert (ack.packet_id, ack.reason_code) == (3, wire.NOT_AUTHORIZED)
    assert ack.properties["reason_string"] == "permission denied: user bob may not publish to topic orders"
    stored = [body for p in range(2) for body in _records(b, "orders", p, "admin")]
    assert len(stored) == 2 and b"revoked" not in stored
    bob.close()


def test_a_topics_quota_lowered_refuses_the_connections_next_new_topic_and_its_held_one_goes_on(broker_factory,
                                                                                                   tmp_path):
    """The kept yes is of a topic the user already holds (its creation counted): a quota lowered below what it holds
    leaves its puts there, and refuses the next topic it would create, from the very next PUBLISH."""
    cfg = with_mqtt(secured_config(tmp_path))
    write_acl(tmp_path / "acl.yaml", quotas={"topics": 5})
    b = broker_factory(cfg)
    alice = Raw(b)
    assert alice.connect("alice-1", username="alice", password=SECRETS["alice"].encode()).reason_code == 0
    assert _published(alice, 1, "orders-a/x") == wire.PubAck(1)
    assert _published(alice, 2, "orders-b/x") == wire.PubAck(2)
    write_acl(tmp_path / "acl.yaml", quotas={"topics": 1})
    _wait_for("the file reloaded", lambda: "reloaded: 4 users" in b.log_text())
    assert _published(alice, 3, "orders-a/x") == wire.PubAck(3)  # held: its creation was counted before
    ack = _published(alice, 4, "orders-c/x")
    assert (ack.packet_id, ack.reason_code) == (4, wire.QUOTA_EXCEEDED), ack
    assert "quota topics of user alice is 1" in ack.properties["reason_string"]
    alice.close()


def test_a_topics_partitions_grown_place_the_connections_next_publish_by_the_new_count(broker_factory, tmp_path):
    name = next(n for n in ("sensors/%d" % k for k in range(100)) if partition_for(n, 8) != 0)
    b = broker_factory(with_mqtt(small_config(tmp_path / "data")))
    admin(b, "topics", "create", "sensors", "--partitions", "1")
    dev = Raw(b)
    assert dev.connect("dev-1").reason_code == 0
    assert _published(dev, 1, name, b"one") == wire.PubAck(1)
    assert _published(dev, 2, name, b"two") == wire.PubAck(2)
    admin(b, "topics", "alter", "sensors", "--partitions", "8")
    assert _published(dev, 3, name, b"three") == wire.PubAck(3)
    assert [body for body in _records(b, "sensors", 0)] == [b"one", b"two"]
    assert _records(b, "sensors", partition_for(name, 8)) == [b"three"]
    dev.close()


def test_a_topic_deleted_refuses_the_connections_next_publish(broker_factory, tmp_path):
    b = broker_factory(with_mqtt(small_config(tmp_path / "data")))
    admin(b, "topics", "create", "sensors", "--partitions", "1")
    dev = Raw(b)
    assert dev.connect("dev-1").reason_code == 0
    assert _published(dev, 1, "sensors/a") == wire.PubAck(1)
    assert _published(dev, 2, "sensors/a") == wire.PubAck(2)
    admin(b, "topics", "delete", "sensors", "--yes")
    ack = _published(dev, 3, "sensors/a")
    assert ack.packet_id == 3 and ack.reason_code >= 0x80, ack
    assert "no such topic sensors" in ack.properties["reason_string"]
    dev.close()


@pytest.mark.fault
def test_a_full_disk_refuses_the_connections_next_publish_and_space_back_takes_it_again(broker_factory, tmp_path):
    mnt = tmp_path / "mnt"
    with tmpfs(mnt, "16m"):
        cfg = with_mqtt(small_config(mnt / "data", store={"disk_warn_ratio": 0.5, "disk_danger_ratio": 0.5,
                                                          "disk_check_interval_s": 0.1,
                                                          "retention_check_interval_s": 3600}))
        b = broker_factory(cfg)
        try:
            dev = Raw(b)
            assert dev.connect("dev-1").reason_code == 0
            assert _published(dev, 1, "sensors/a", b"one") == wire.PubAck(1)
            assert _published(dev, 2, "sensors/a", b"two") == wire.PubAck(2)
            filler = mnt / "filler"
            with open(filler, "wb") as f:
                f.write(b"\0" * (14 * 1024 * 1024))
            with b.client() as c:
                _wait_for("the write gate closed", lambda: c.stats_dict()["writes_refused"] == "true")
            ack = _published(dev, 3, "sensors/a", b"refused")
            assert ack.packet_id == 3 and ack.reason_code >= 0x80 and "danger mark" in ack.properties["reason_string"]
            os.remove(filler)
            with b.client() as c:
                _wait_for("the write gate opened", lambda: c.stats_dict()["writes_refused"] == "false")
            assert _published(dev, 4, "sensors/a", b"four") == wire.PubAck(4)
            bodies = [body for p in range(2) for body in _records(b, "sensors", p)]
            assert sorted(bodies) == [b"four", b"one", b"two"]
            dev.close()
        finally:
            b.kill()


# -- the version and the bounds, without a network ------------------------------------------------------------------

def _path(replication=None, election=None, slave=None):
    roles = SimpleNamespace(slave_refusal=slave, unconfirmable_refusal=None, replication=replication,
                            election=election, isolation_refusal=lambda: None)
    return PutPath(None, None, None, None, roles, WriteGate())


def test_every_change_the_broker_wires_moves_the_decision_version(tmp_path):
    from metaq.server.broker import Broker
    from metaq.server.config import load_config
    cfg = secured_config(tmp_path)
    broker = Broker(load_config(None, cfg))
    try:
        path = broker.put_path
        moves = (
            ("a full disk", lambda: broker.gate.disk_full("disk full")),
            ("space again", lambda: broker.gate.refresh(disk_state=SimpleNamespace(refusing_writes=False))),
            ("the permissions file reloaded", lambda: (write_acl(tmp_path / "acl.yaml", users={}),
                                                       broker.guard.reload())),
            ("a topic created", lambda: broker.topic_admin.create("orders", {"partitions": "2"})),
            ("a topic deleted", lambda: broker.topic_admin.delete("orders")),
            ("a role change", lambda: broker.roles.set_role("slave", None)),
        )
        for what, change in moves:
            before = path.version
            assert path.decision_stands(before), what
            change()
            assert path.version != before and not path.decision_stands(before), what
        before = path.version
        broker.gate.refresh(disk_state=SimpleNamespace(refusing_writes=False))  # the same answer: no move
        assert path.version == before
    finally:
        broker.store.close(now_ms())


def test_a_replicating_master_asks_its_clock_driven_answer_each_time():
    path = _path(replication=object())
    assert path.decision_stands(path.version)
    path.roles.slave_refusal = "its lease ran out"  # moved by the clock alone: no version change
    assert not path.decision_stands(path.version)
    quiet = _path(slave=None)
    assert quiet.decision_stands(quiet.version) and not quiet.decision_stands(quiet.version - 1)


def _publishes(user="u"):
    path = _path()
    conn = SimpleNamespace(session=SimpleNamespace(user=user), mqtt=SimpleNamespace(client_id="dev-1"))
    port = SimpleNamespace(put_path=path, topics=DEFAULT_MAP)
    return Publishes(conn, port, None), path


def test_kept_decisions_start_again_after_a_change_another_user_or_mqtt_kept_decisions():
    publishes, path = _publishes()
    publishes._decisions()["orders"] = 2
    assert publishes._decisions() == {"orders": 2}
    path.changed()
    assert publishes._decisions() == {}
    publishes._decisions()["orders"] = 2
    publishes.conn.session.user = "other"
    assert publishes._decisions() == {}
    for extra in (0, 1):
        decided = publishes._decisions()
        decided.clear()
        decided.update(("t%d" % k, 1) for k in range(mqtt_limits.MQTT_KEPT_DECISIONS - 1 + extra))
        assert len(publishes._decisions()) == (mqtt_limits.MQTT_KEPT_DECISIONS - 1 if not extra else 0)


def test_a_kept_decision_skips_asking_only_while_no_answer_moves_with_the_clock():
    """``PutPath.standing``: a decision kept at it stands without ``decision_stands`` being asked (no replicating
    master, no election); once a promotion makes the broker a replicating master (the roles' listeners call
    ``changed``) the standing version is gone, so a lease that runs out between two messages (no version move)
    empties the kept decisions at the next turn. A standing version kept across the role change fails this."""
    publishes, path = _publishes()
    assert path.standing == path.version
    publishes._decisions()["orders"] = 2
    asked = []
    stands = path.decision_stands
    path.decision_stands = lambda version: asked.append(version) or stands(version)
    assert publishes._decisions() == {"orders": 2} and asked == []  # at the standing version: not asked
    path.roles.replication = object()  # promoted to a replicating master
    path.changed()
    assert path.standing is None
    publishes._decisions()["orders"] = 2
    assert publishes._decisions() == {"orders": 2} and asked  # asked: its lease still holds
    path.roles.slave_refusal = "its lease ran out"  # moved by the clock alone: no version change
    assert publishes._decisions() == {}
    path.roles.replication, path.roles.slave_refusal = None, None  # back to a lone broker (the listeners again)
    path.changed()
    assert path.standing == path.version


@pytest.mark.parametrize("extra", [0, 1], ids=["at", "past"])
def test_a_parked_connection_keeps_at_most_mqtt_parked_plans_plans_and_decisions(extra):
    publishes, _path_ = _publishes()
    for k in range(mqtt_limits.MQTT_PARKED_PLANS + extra):
        publishes._plan("t%d/x" % k)
        publishes._decisions()["t%d" % k] = 1
    publishes.parked()
    kept = mqtt_limits.MQTT_PARKED_PLANS if not extra else 0
    assert len(publishes.plans or {}) == kept and len(publishes.decided) == kept



def test_a_devices_read_passes_its_kept_decisions_only_while_they_stand_at_the_standing_version():
    """``Publishes.read`` gives the split the kept decisions without asking ``_decisions`` only when they were made
    at the put path's standing version for the session's user of now; another user, a change (``changed``), a
    promotion to a replicating master whose lease runs out, or the bound of ``MQTT_KEPT_DECISIONS`` each start
    them again, as ``_decisions`` decides. Each check left out of the shortcut fails one step here."""
    publishes, path = _publishes()
    publishes.conn.settings = SimpleNamespace(receive_maximum=10)
    publishes.acks = SimpleNamespace(unacked=0)
    given = []
    parser = SimpleNamespace(plain_read=lambda data, plans, decided, *rest: given.append(dict(decided)) or
                             ((), 0, 0, b"", False))

    def read():
        assert publishes.read(parser, b"\x30") is None
        return given[-1]

    publishes._decisions()["orders"] = 2
    assert read() == {"orders": 2}
    publishes.conn.session.user = "other"
    assert read() == {}
    publishes.decided["orders"] = 2
    assert read() == {"orders": 2}
    path.changed()
    assert read() == {}
    publishes.decided["orders"] = 2
    path.roles.replication = object()  # promoted to a replicating master
    path.changed()
    publishes._decisions()["orders"] = 2
    assert read() == {"orders": 2}  # asked: its lease still holds
    path.roles.slave_refusal = "its lease ran out"  # moved by the clock alone: no version change
    assert read() == {}
    path.roles.replication, path.roles.slave_refusal = None, None
    path.changed()
    publishes._decisions().update(("t%d" % k, 1) for k in range(mqtt_limits.MQTT_KEPT_DECISIONS))
    assert read() == {}
