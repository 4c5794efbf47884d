"""Consumer-group bookkeeping of RocketMQ clients (metaq.server.remoting.clients)."""

from metaq.protocol.rocketmq.bodies import ConsumerData, HeartbeatData
from metaq.server.remoting.clients import ClientRegistry


def hb(client, *groups):
    return HeartbeatData(client, tuple(ConsumerData(g) for g in groups))


def test_join_leave_close_and_expire_each_notify_the_group():
    changes = []
    reg = ClientRegistry(120.0, changes.append)
    a, b = object(), object()
    assert reg.heartbeat(a, hb("c1", "G1", "G2"), 0.0) == ["G1", "G2"]
    assert reg.heartbeat(a, hb("c1", "G1", "G2"), 30.0) == []  # a repeated heartbeat changes nothing
    reg.heartbeat(b, hb("c2", "G1"), 10.0)
    assert reg.consumers("G1") == ["c1", "c2"] and reg.connections("G1") == [a, b]
    assert reg.unregister("c1", "G1") == ["G1"] and reg.consumers("G1") == ["c2"]
    assert reg.consumers("G2") == ["c1"]
    assert reg.connection_closed(a) == ["G2"] and reg.consumers("G2") == []
    assert reg.expire(100.0) == [] and reg.expire(131.0) == ["G1"]
    assert reg.groups() == []
    assert changes == ["G1", "G2", "G1", "G1", "G2", "G1"]


def test_a_client_that_reconnects_is_moved_to_its_new_connection():
    reg = ClientRegistry(120.0)
    old, new = object(), object()
    reg.heartbeat(old, hb("c1", "G"), 0.0)
    assert reg.heartbeat(new, hb("c1", "G"), 1.0) == ["G"]
    assert reg.connection_closed(old) == [] and reg.consumers("G") == ["c1"]
