"""A client id is the cluster's (docs/mqtt.md "A client id across the cluster"): brokers of one ZooKeeper root,
each a master with a replication port, with real paho-mqtt clients and the raw client.

A device whose persistent session lives on broker 0 and that connects to broker 1 with Clean Start 0 takes its
session over as on one broker: Session Present 1, its subscriptions kept, the messages queued for it while away
delivered once, the ones it acknowledged not again (MQTT 5 and 3.1.1); its old connection on broker 0 is told
DISCONNECT 0x8E; Clean Start 1 elsewhere ends the old session; 20 connects of one id at once over three brokers
end with one live session; a home's registry refuses an id past ``mqtt.cluster_max_ids`` (0x97) and takes it again
once one ends; a broker killed with sessions is gone from the cluster, and back, ends its copies of the ids
registered elsewhere meanwhile, even when it registers them first (a recovered copy gives way to a live one); of
two recovered copies one is left."""

import signal
import threading
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from metaq.client.local import free_port
from metaq.mqtt import wire
from tests.harness.mqttcluster import homed as _homed
from tests.harness.broker import wait_for
from tests.harness.mqtt import V5 as PAHO_V5
from tests.harness.mqtt import V311 as PAHO_V311
from tests.harness.mqtt import Paho, Raw, mqtt_config
from tests.harness.replication import stats

#: How long a connection that must get nothing more is watched for a PUBLISH.
QUIET_S = 1.0


def _cluster(broker_factory, tmp_path, zk_connect, n=3, zk=None, zk_of=None, **mqtt):
    """``n`` masters (broker ids 1..n) under one ZooKeeper root, each with an MQTT and a replication port; returned
    once each sees all ``n`` as members. ``zk_of``: broker id -> its own ``zk:`` settings over ``zk``."""
    brokers = []
    for i in range(n):
        cfg = mqtt_config(tmp_path / ("b%d" % i), **mqtt)
        cfg["broker"]["id"] = i + 1
        cfg["zk"] = dict({"connect": zk_connect}, **dict(zk or {}, **(zk_of or {}).get(i + 1, {})))
        cfg["replication"] = {"port": free_port()}
        brokers.append(broker_factory(cfg, workdir=tmp_path / ("b%d" % i)))
    for b in brokers:  # (a broker that is no cluster has no such figure: the test then fails on what it checks)
        wait_for(lambda b=b: stats(b).get("mqtt_cluster_members", str(n)) == str(n), 30, "the cluster's members")
    return brokers


def _device(b, version, client_id, clean=False):
    props = None
    if version == PAHO_V5:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = 3600
    return Paho(b, client_id, version, clean=clean, properties=props)


@pytest.mark.parametrize("version", [PAHO_V5, PAHO_V311], ids=["mqtt5", "mqtt311"])
def test_a_session_moves_to_another_broker(broker_factory, tmp_path, zk_connect, version):
    b0, b1, _b2 = _cluster(broker_factory, tmp_path, zk_connect)
    device = _device(b0, version, "meter-7")
    assert device.subscribe("t/a", 1) == [1]
    publisher = Paho(b0, "publisher")
    publisher.publish("t/a", b"acked", 1)
    assert [m.payload for m in device.wait_messages(1)] == [b"acked"]
    device.settle()
    device.close()
    for payload in (b"away-1", b"away-2"):
        publisher.publish("t/a", payload, 1)
    back = _device(b1, version, "meter-7")
    assert back.connack == 0 and back.session_present
    got = back.wait_messages(2)
    assert [m.payload for m in got] == [b"away-1", b"away-2"]  # once each, the acknowledged one not again
    back.settle()
    other = Paho(b1, "publisher-1")
    other.publish("t/a", b"here", 1)  # its subscription lives on broker 1 now
    assert [m.payload for m in back.wait_messages(3)][2:] == [b"here"]
    back.settle()
    assert len(back.wait_messages(4, timeout=QUIET_S)) == 3
    assert stats(b1)["mqtt_cluster_takeovers"] == "1"
    wait_for(lambda: stats(b0)["mqtt_sessions"] == "0", 10, "the session ended on broker 0")
    back.close()
    again = _device(b1, version, "meter-7")  # the moved session is broker 1's own now: nothing comes twice
    assert again.session_present
    assert again.wait_messages(1, timeout=QUIET_S) == []


def test_the_old_connection_is_told_session_taken_over(broker_factory, tmp_path, zk_connect):
    b0, b1, _b2 = _cluster(broker_factory, tmp_path, zk_connect)
    old = Raw(b0)
    assert old.connect("pump-3", clean_start=False, properties={"session_expiry_interval": 600}).reason_code == 0
    new = Raw(b1)
    ack = new.connect("pump-3", clean_start=False, properties={"session_expiry_interval": 600})
    assert ack.reason_code == 0 and ack.session_present
    assert old.read() == wire.Disconnect(wire.SESSION_TAKEN_OVER)
    assert old.closed()
    wait_for(lambda: stats(b0)["mqtt_connections"] == "0", 10, "the old connection closed")


def test_clean_start_elsewhere_ends_the_old_session(broker_factory, tmp_path, zk_connect):
    b0, b1, _b2 = _cluster(broker_factory, tmp_path, zk_connect)
    device = _device(b0, PAHO_V5, "valve-9")
    device.subscribe("t/a", 1)
    device.close()
    Paho(b0, "publisher").publish("t/a", b"away", 1)
    fresh = Paho(b1, "valve-9", PAHO_V5, clean=True)
    assert fresh.connack == 0 and not fresh.session_present
    assert fresh.wait_messages(1, timeout=QUIET_S) == []
    wait_for(lambda: stats(b0)["mqtt_sessions"] == "0", 10, "the old session ended on broker 0")


def test_one_live_session_after_concurrent_connects(broker_factory, tmp_path, zk_connect):
    brokers = _cluster(broker_factory, tmp_path, zk_connect)
    clients = [Raw(brokers[i % 3]) for i in range(20)]
    acks = [None] * 20
    start = threading.Barrier(20)

    def connect(i):
        start.wait()
        acks[i] = clients[i].connect("storm-1", clean_start=False, properties={"session_expiry_interval": 600})

    threads = [threading.Thread(target=connect, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(a is not None and a.reason_code == 0 for a in acks), acks
    wait_for(lambda: sum(int(stats(b)["mqtt_connections"]) for b in brokers) == 1, 20, "one live session")
    live = [c for c in clients if _open(c)]
    assert len(live) == 1
    held = [int(stats(b)["mqtt_sessions"]) for b in brokers]
    assert sorted(held) == [0, 0, 1]


def _open(raw, wait=0.2):
    """True when nothing closed ``raw`` within ``wait`` s (a live connection with nothing to say)."""
    raw.sock.settimeout(wait)
    try:
        while raw.read() is not None:  # a DISCONNECT (0x8E) before the close
            pass
        return False
    except TimeoutError:
        return True


def test_registry_limit_at_and_past_it(broker_factory, tmp_path, zk_connect):
    b1, b2 = _cluster(broker_factory, tmp_path, zk_connect, n=2, cluster_max_ids=3)
    ids = _homed(4, 1, [1, 2], "dev")
    held = []
    # at the limit: registered, wherever they connect (broker 2 within its share of the home's registry: one)
    for client_id, b in zip(ids[:3], (b2, b1, b1), strict=True):
        raw = Raw(b)
        assert raw.connect(client_id).reason_code == 0
        held.append(raw)
    past = Raw(b2)
    ack = past.connect(ids[3])
    assert ack.reason_code == wire.QUOTA_EXCEEDED, ack  # one past it: refused, clearly
    assert past.closed()
    old = Raw(b1, wire.MQTT_311)
    assert old.connect(ids[3]).reason_code == 0x03  # MQTT 3.1.1: Server unavailable
    elsewhere = Raw(b1)
    assert elsewhere.connect(_homed(1, 2, [1, 2], "other")[0]).reason_code == 0  # the other home has room
    assert all(_open(raw) for raw in held)  # nothing else lost
    held[0].send(wire.Disconnect())
    held[0].close()

    def room():
        raw = Raw(b2)
        ok = raw.connect(ids[3]).reason_code == 0
        raw.close()
        return ok

    wait_for(room, 10, "the id that ended released on its home")


@pytest.mark.slow
@pytest.mark.fault
def test_a_broker_killed_holding_sessions(broker_factory, tmp_path, zk_connect):
    b0, b1, b2 = _cluster(broker_factory, tmp_path, zk_connect, zk={"session_timeout_ms": 4000})
    device = _device(b0, PAHO_V5, "meter-killed")
    device.subscribe("t/a", 1)
    device.close()
    b0.kill()

    def reconnects():
        raw = Raw(b1)
        ack = raw.connect("meter-killed", clean_start=False, properties={"session_expiry_interval": 600})
        if ack is None or ack.reason_code != 0:
            raw.close()
            return None
        return raw, ack

    raw, ack = wait_for(reconnects, 60, "a connect once the killed broker is gone from the cluster")
    assert not ack.session_present  # its session went with the broker (no slave): a new one here
    wait_for(lambda: stats(b1).get("mqtt_cluster_members") == "2", 30, "the killed broker left")
    raw.close()
    b0.start()  # back with the session its log holds: registered on broker 1 meanwhile, so it ends it here
    wait_for(lambda: stats(b0).get("mqtt_cluster_members") == "3", 30, "the broker back")
    wait_for(lambda: stats(b0)["mqtt_sessions"] == "0", 30, "its copy of the session ended")
    assert stats(b2)["mqtt_connections"] == "0"


def _sessions_persist(b, client_id):
    """A raw MQTT 5 connection of ``client_id`` to ``b`` with Clean Start 0 and a session kept 600 s: ``(raw, ack)``,
    or None when refused (the cluster still settling)."""
    raw = Raw(b)
    ack = raw.connect(client_id, clean_start=False, properties={"session_expiry_interval": 600})
    if ack is None or ack.reason_code != 0:
        raw.close()
        return None
    return raw, ack


def _subscribe(raw, topic_filter):
    raw.send(wire.Subscribe(1, (wire.Subscription(topic_filter, 1),)))
    return raw.read()


def _watch_live(brokers, stop, seen):
    """Until ``stop`` is set: the most connections of the test's one device live at once over ``brokers``."""
    while not stop.is_set():
        try:
            seen.append(sum(int(stats(b)["mqtt_connections"]) for b in brokers))
        except Exception:  # noqa: BLE001 - a broker restarting
            pass
        stop.wait(0.05)


@pytest.mark.slow
@pytest.mark.fault
def test_a_restarted_brokers_copy_gives_way_to_the_live_one(broker_factory, tmp_path, zk_connect):
    """The race of a restart: broker 2 holds the device's newer session and is paused (SIGSTOP) while broker 1,
    the id's home, starts again with its copy from before its kill and registers it first. Once broker 2 answers,
    its live session stands, whatever order the two copies reached the home in: broker 1's recovered copy ends."""
    b1, b2, b3 = _cluster(broker_factory, tmp_path, zk_connect, zk={"session_timeout_ms": 4000},
                          zk_of={2: {"session_timeout_ms": 30000}, 3: {"session_timeout_ms": 30000}})
    client_id = _homed(1, 1, [1, 2, 3], "meter-paused")[0]
    device = _device(b1, PAHO_V5, client_id)
    device.subscribe("t/old", 1)
    device.close()
    b1.kill()
    live, ack = wait_for(lambda: _sessions_persist(b2, client_id), 60, "a connect once broker 1 left the cluster")
    assert not ack.session_present  # its session went with the broker: a new one here
    assert _subscribe(live, "t/new") == wire.Suback(1, (1,))
    wait_for(lambda: stats(b2).get("mqtt_cluster_members") == "2", 30, "broker 1 left")
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=_watch_live, args=([b1, b3], stop, seen), daemon=True)
    watcher.start()
    b2.proc.send_signal(signal.SIGSTOP)  # slow to see broker 1 come back: broker 1's hold reaches the home first
    try:
        b1.start()
        wait_for(lambda: stats(b1).get("mqtt_cluster_members") == "3", 30, "broker 1 back")
        wait_for(lambda: stats(b1)["mqtt_cluster_ids_homed"] == "1", 30, "broker 1's recovered copy registered")
        assert stats(b1)["mqtt_sessions"] == "1"
    finally:
        b2.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: stats(b1)["mqtt_sessions"] == "0", 30, "broker 1's recovered copy ended")
    stop.set()
    watcher.join(10)
    assert max(seen, default=0) == 0  # the device was never connected on broker 1 or 3 meanwhile
    assert _open(live, QUIET_S)  # not taken over: its connection on broker 2 goes on
    live.sock.settimeout(10)
    Paho(b3, "publisher").publish("t/new", b"after", 1)
    got = live.read()
    assert isinstance(got, wire.Publish) and got.payload == b"after", got
    assert stats(b2)["mqtt_sessions"] == "1"
    live.send(wire.PubAck(got.packet_id))
    live.send(wire.Disconnect())
    live.close()
    again, ack = _sessions_persist(b2, client_id)
    assert ack.session_present  # its session on broker 2 stood
    Paho(b3, "publisher-2").publish("t/new", b"later", 1)
    got = again.read()
    assert isinstance(got, wire.Publish) and got.payload == b"later", got


@pytest.mark.slow
@pytest.mark.fault
def test_both_copies_recovered(broker_factory, tmp_path, zk_connect):
    """Both brokers holding a copy of one device's session restart (kill -9): the first copy registered with the
    home stands, the other ends; the device finds one session, never two."""
    b1, b2, b3 = _cluster(broker_factory, tmp_path, zk_connect, zk={"session_timeout_ms": 4000})
    client_id = _homed(1, 1, [1, 2, 3], "meter-twice")[0]
    device = _device(b1, PAHO_V5, client_id)
    device.subscribe("t/a", 1)
    device.close()
    b1.kill()
    raw, _ack = wait_for(lambda: _sessions_persist(b2, client_id), 60, "a connect once broker 1 left the cluster")
    assert _subscribe(raw, "t/a") == wire.Suback(1, (1,))
    raw.send(wire.Disconnect())
    raw.close()
    wait_for(lambda: stats(b2)["mqtt_connections"] == "0", 10, "the device gone from broker 2")
    b2.kill()
    wait_for(lambda: stats(b3).get("mqtt_cluster_members") == "1", 30, "both left")
    b1.start()
    b2.start()
    for b in (b1, b2, b3):
        wait_for(lambda b=b: stats(b).get("mqtt_cluster_members") == "3", 30, "the two back")
    wait_for(lambda: sorted(int(stats(b)["mqtt_sessions"]) for b in (b1, b2)) == [0, 1], 30, "one copy left")
    time.sleep(QUIET_S)
    assert sorted(int(stats(b)["mqtt_sessions"]) for b in (b1, b2)) == [0, 1]  # and it stays
    again, ack = _sessions_persist(b3, client_id)
    assert ack.session_present  # the copy that stood moved here
    Paho(b3, "publisher").publish("t/a", b"after", 1)  # its subscription came with it
    got = again.read()
    assert isinstance(got, wire.Publish) and got.payload == b"after", got
    wait_for(lambda: [stats(b)["mqtt_sessions"] for b in (b1, b2)] == ["0", "0"], 10, "no other copy")


def test_messages_in_flight_move_with_the_session(broker_factory, tmp_path, zk_connect):
    b0, b1, _b2 = _cluster(broker_factory, tmp_path, zk_connect)
    device = Raw(b0)
    assert device.connect("meter-9", clean_start=False, properties={"session_expiry_interval": 600}).reason_code == 0
    device.send(wire.Subscribe(1, (wire.Subscription("t/a", 2),)))
    assert isinstance(device.read(), wire.Suback)
    publisher = Paho(b0, "publisher")
    publisher.publish("t/a", b"one", 1)
    publisher.publish("t/a", b"two", 2)
    first, second = device.read(), device.read()
    assert (first.payload, first.qos, second.payload, second.qos) == (b"one", 1, b"two", 2)
    device.send(wire.PubRec(second.packet_id))  # QoS 2: its PUBREC, no PUBCOMP; QoS 1: no PUBACK
    assert device.read() == wire.PubRel(second.packet_id)
    device.close()  # a network failure: the session keeps both in flight
    wait_for(lambda: stats(b0)["mqtt_connections"] == "1", 10, "the device's connection ended")
    publisher.publish("t/a", b"three", 1)
    back = Raw(b1)
    ack = back.connect("meter-9", clean_start=False, properties={"session_expiry_interval": 600})
    assert ack.reason_code == 0 and ack.session_present
    again = back.read()
    assert (again.payload, again.qos, again.dup, again.packet_id) == (b"one", 1, True, first.packet_id)
    assert back.read() == wire.PubRel(second.packet_id)
    queued = back.read()
    assert (queued.payload, queued.qos, queued.dup) == (b"three", 1, False)
    back.send(wire.PubAck(first.packet_id))
    back.send(wire.PubComp(second.packet_id))
    back.send(wire.PubAck(queued.packet_id))
    back.sock.settimeout(QUIET_S)
    with pytest.raises(TimeoutError):
        back.read()  # nothing twice


def test_peers_prove_the_replication_secret(broker_factory, tmp_path, zk_connect):
    """Brokers 1 and 2 share the replication secret, broker 3 holds another: 1 and 2 move sessions between them;
    broker 3's calls are refused, so a CONNECT there whose id's home is another broker is refused (0x88)."""
    brokers = []
    for i, secret in enumerate(("s" * 64, "s" * 64, "t" * 64)):
        cfg = mqtt_config(tmp_path / ("b%d" % i), cluster_start_hold_s=0)  # (broker 3 is never followed)
        cfg["broker"]["id"] = i + 1
        cfg["zk"] = {"connect": zk_connect}
        cfg["replication"] = {"port": free_port()}
        cfg["security"] = {"replication_secret": secret}
        brokers.append(broker_factory(cfg, workdir=tmp_path / ("b%d" % i)))
    for b in brokers:
        wait_for(lambda b=b: stats(b).get("mqtt_cluster_members") == "3", 30, "the cluster's members")
    b1, b2, b3 = brokers
    client_id = _homed(1, 1, [1, 2, 3], "proved")[0]
    old = Raw(b1)
    assert old.connect(client_id, clean_start=False, properties={"session_expiry_interval": 600}).reason_code == 0
    new = Raw(b2)
    ack = new.connect(client_id, clean_start=False, properties={"session_expiry_interval": 600})
    assert ack.reason_code == 0 and ack.session_present
    assert old.read() == wire.Disconnect(wire.SESSION_TAKEN_OVER)
    stranger = Raw(b3)
    ack = stranger.connect(_homed(1, 1, [1, 2, 3], "unproved")[0])
    assert ack.reason_code == wire.SERVER_UNAVAILABLE, ack
    assert int(stats(b3)["mqtt_cluster_call_failures"]) >= 1


@pytest.mark.fault
def test_an_unreachable_home_refuses_the_connect(broker_factory, tmp_path, zk_connect):
    b1, b2 = _cluster(broker_factory, tmp_path, zk_connect, n=2, zk={"session_timeout_ms": 30000})
    client_id = _homed(1, 2, [1, 2], "far")[0]
    b2.proc.send_signal(signal.SIGSTOP)  # listed in ZooKeeper, answers nothing
    try:
        ack = Raw(b1, timeout=30).connect(client_id)
        assert ack.reason_code == wire.SERVER_UNAVAILABLE, ack
    finally:
        b2.proc.send_signal(signal.SIGCONT)

    def served():
        raw = Raw(b1)
        ok = raw.connect(client_id).reason_code == 0
        raw.close()
        return ok

    wait_for(served, 30, "the CONNECT served once the home answers")


@pytest.mark.fault
def test_an_unreachable_holder(broker_factory, tmp_path, zk_connect):
    """The broker holding a live session stops answering (SIGSTOP, still listed in ZooKeeper): a CONNECT of its id
    elsewhere is refused (0x88) until the old holder's lease of the id surely ran out, then goes on with a new
    session; once the old holder answers again, its connection of that id is closed (its lease ran out: 0x9C, or
    told 0x8E) and its session ends."""
    b1, b2, b3 = _cluster(broker_factory, tmp_path, zk_connect, zk={"session_timeout_ms": 30000})
    client_id = _homed(1, 2, [1, 2, 3], "stuck")[0]  # its home is broker 2; it lives on broker 1
    old = Raw(b1, timeout=60)
    assert old.connect(client_id, clean_start=False, properties={"session_expiry_interval": 600}).reason_code == 0
    b1.proc.send_signal(signal.SIGSTOP)
    try:
        refused = []
        while len(refused) < 10:
            new = Raw(b3, timeout=30)
            ack = new.connect(client_id, clean_start=False, properties={"session_expiry_interval": 600})
            if ack.reason_code != wire.SERVER_UNAVAILABLE:
                break
            refused.append(ack)
            new.close()
        assert ack.reason_code == 0 and not ack.session_present  # what this broker has of it: nothing
    finally:
        b1.proc.send_signal(signal.SIGCONT)
    assert old.read() in (wire.Disconnect(wire.SESSION_TAKEN_OVER), wire.Disconnect(wire.USE_ANOTHER_SERVER))
    wait_for(lambda: stats(b1)["mqtt_sessions"] == "0", 20, "the old holder's copy ended")
    assert stats(b3)["mqtt_connections"] == "1" and _open(new)
