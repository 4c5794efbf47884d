"""Consumer- and producer-group bookkeeping of RocketMQ clients (metaq.server.remoting.clients)."""

import pytest

from metaq.server.remoting import limits as remoting_limits
from metaq.errors import ClientError
from metaq.protocol.rocketmq.bodies import ConsumerData, HeartbeatData
from metaq.server.remoting.clients import ClientRegistry, ProducerRegistry


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


def test_an_unregister_touches_the_named_group_only_and_without_one_every_group_of_the_client():
    reg = ClientRegistry(120.0)
    conns = [object() for _ in range(200)]
    for i, c in enumerate(conns):
        reg.heartbeat(c, hb("c%d" % i, *["G%d" % g for g in range(50)]), 0.0)  # 10,000 entries

    class Counting(dict):
        items_calls = 0

        def items(self):
            Counting.items_calls += 1
            return super().items()
    for name in list(reg._groups):
        reg._groups[name] = Counting(reg._groups[name])
    assert reg.unregister("c7", "G3") == ["G3"] and Counting.items_calls == 0  # no member was walked
    assert "c7" not in reg.consumers("G3") and "c7" in reg.consumers("G4") and reg.members == 9_999
    assert reg.unregister("c7") == ["G%d" % g for g in range(50) if g != 3] and reg.members == 9_950
    assert Counting.items_calls == 0
    assert reg.unregister("c7") == [] and reg.unregister("nobody", "G1") == [] and reg.unregister("c8", "G99") == []
    assert reg.connection_closed(conns[7]) == []  # its index entries went with the unregisters


# -- producer groups (the transaction check-back's channels) ----------------------------------------


class Conn:
    def __init__(self, closed=False):
        self.closed = closed


def test_producers_join_by_heartbeat_and_leave_by_unregister_close_and_expiry():
    reg = ProducerRegistry(120.0)
    a, b = Conn(), Conn()
    reg.heartbeat(a, ["PG", "CLIENT_INNER_PRODUCER"], 0.0)
    reg.heartbeat(a, ["PG"], 50.0)  # a repeat refreshes, adds nothing
    reg.heartbeat(b, ["PG"], 10.0)
    assert reg.members == 3 and reg.groups() == ["CLIENT_INNER_PRODUCER", "PG"]
    assert {reg.pick("PG") for _ in range(4)} == {a, b}  # in turn
    reg.unregister(b, "PG")
    assert [reg.pick("PG") for _ in range(3)] == [a, a, a]
    assert reg.expire(140.0) == 1 and reg.groups() == ["PG"]  # a's inner group was last seen at 0
    reg.connection_closed(a)
    assert reg.pick("PG") is None and reg.members == 0 and reg.groups() == []


def test_pick_skips_closed_and_unusable_connections():
    reg = ProducerRegistry(120.0)
    gone, other, mine = Conn(closed=True), Conn(), Conn()
    for conn in (gone, other, mine):
        reg.heartbeat(conn, ["PG"], 0.0)
    assert {reg.pick("PG", lambda c: c is not other) for _ in range(4)} == {mine}
    assert reg.pick("PG", lambda c: False) is None and reg.pick("NOBODY") is None


def test_producer_entries_are_bounded_at_the_limit_and_refused_one_past_it():
    reg = ProducerRegistry(120.0, max_members=3)
    a, b = Conn(), Conn()
    reg.heartbeat(a, ["G1", "G2"], 0.0)
    reg.heartbeat(b, ["G1"], 0.0)  # the limit: 3 entries
    with pytest.raises(ClientError):
        reg.heartbeat(b, ["G2"], 0.0)
    assert reg.members == 3 and reg.pick("G2") is a
    reg.heartbeat(b, ["G1"], 1.0)  # a known entry is refreshed at the limit
    with pytest.raises(ClientError):
        reg.heartbeat(Conn(), ["G%d" % n for n in range(remoting_limits.MAX_HEARTBEAT_GROUPS + 1)], 0.0)
