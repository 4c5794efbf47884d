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


def test_registry_entries_at_the_limit_and_one_past():
    import pytest

    from metaq.errors import ClientError

    reg = ClientRegistry(120.0, max_members=3)
    a = object()
    reg.heartbeat(a, hb("c1", "G1", "G2"), 0.0)
    reg.heartbeat(a, hb("c2", "G1"), 0.0)  # 3 entries: the limit
    with pytest.raises(ClientError, match="too many RocketMQ clients registered: the limit is 3"):
        reg.heartbeat(a, hb("c3", "G1"), 1.0)  # one past
    assert reg.consumers("G1") == ["c1", "c2"] and reg.members == 3  # nothing of it recorded
    reg.heartbeat(a, hb("c1", "G1", "G2"), 2.0)  # known entries still beat
    reg.unregister("c2", "G1")
    reg.heartbeat(a, hb("c3", "G1"), 3.0)  # a freed place is taken
    assert reg.members == 3
    assert reg.connection_closed(a) == ["G1", "G2"] and reg.members == 0 and reg.groups() == []


def test_closing_one_connection_removes_only_what_it_registered():
    reg = ClientRegistry(120.0)
    conns = [object() for _ in range(2000)]
    for i, c in enumerate(conns):
        reg.heartbeat(c, hb("c%d" % i, "G%d" % (i % 10)), 0.0)
    assert reg.connection_closed(conns[5]) == ["G5"]
    assert reg.members == 1999 and "c5" not in reg.consumers("G5")
