"""The pending-request table of request-reply (``metaq.reqreply.state``): bounds at and one past, take, expire,
a connection closing; and the remoting producers' client-id map replies are pushed by."""

import pytest

from metaq import errors
from metaq.reqreply.state import PendingRequests
from metaq.server.remoting.clients import ProducerRegistry


class Conn:
    closed = False


def test_the_per_connection_bound_at_and_one_past():
    t = PendingRequests(max_total=100, per_connection=2)
    a, b = Conn(), Conn()
    t.add("1", a, "w1", 10.0)
    t.add("2", a, "w2", 10.0)  # at the limit
    with pytest.raises(errors.Unavailable, match="on this connection: the limit is 2"):
        t.add("3", a, "w3", 10.0)
    assert "3" not in t and t.refused == 1
    t.add("3", b, "w3", 10.0)  # another connection has its own share
    assert t.take("1").waiter == "w1" and t.take("1") is None
    t.add("4", a, "w4", 10.0)  # room again


def test_the_broker_bound_at_and_one_past():
    t = PendingRequests(max_total=2, per_connection=10)
    t.add("1", Conn(), None, 1.0)
    t.add("2", Conn(), None, 1.0)
    with pytest.raises(errors.Unavailable, match="on the broker: the limit is 2"):
        t.add("3", Conn(), None, 1.0)
    assert len(t) == 2
    assert t.remove("1") and not t.remove("1")
    t.add("3", Conn(), None, 1.0)


def test_a_correlation_id_waits_once():
    t = PendingRequests(10, 10)
    t.add("c", Conn(), None, 1.0)
    with pytest.raises(errors.ClientError):
        t.add("c", Conn(), None, 1.0)


def test_a_closing_connection_and_expiry_take_their_entries_out():
    t = PendingRequests(10, 10)
    a, b = Conn(), Conn()
    t.add("1", a, "w1", 5.0)
    t.add("2", a, "w2", 50.0)
    t.add("3", b, "w3", 5.0)
    assert sorted(e.waiter for e in t.connection_closed(a)) == ["w1", "w2"]
    assert t.waiting_on(a) == 0 and len(t) == 1
    assert t.expire(4.9) == []
    assert [cid for cid, _e in t.expire(5.0)] == ["3"]
    assert len(t) == 0 and t.waiting_on(b) == 0


def test_producers_are_found_by_client_id_while_connected():
    r = ProducerRegistry(timeout_s=10)
    a, b = Conn(), Conn()
    r.heartbeat(a, ["PG"], 0.0, "client-1")
    assert r.client("client-1") is a
    r.heartbeat(b, ["PG"], 1.0, "client-1")  # the client reconnected: replies go to its new connection
    assert r.client("client-1") is b
    r.connection_closed(a)  # the old one closing does not lose it
    assert r.client("client-1") is b
    r.connection_closed(b)
    assert r.client("client-1") is None
    r.heartbeat(a, [], 2.0, "consumer-only")  # no producer group: not a requester
    assert r.client("consumer-only") is None
    r.heartbeat(a, ["PG"], 3.0, "client-2")
    r.expire(100.0)
    assert r.client("client-2") is None


def test_drain_takes_every_entry_out():
    t = PendingRequests(10, 10)
    a = Conn()
    t.add("1", a, "w1", 1.0)
    t.add("2", Conn(), "w2", 1.0)
    assert sorted(e.waiter for e in t.drain()) == ["w1", "w2"]
    assert len(t) == 0 and t.waiting_on(a) == 0 and t.take("1") is None


def test_with_authentication_a_client_id_is_never_taken_over_by_another_user():
    """A subscriber of a request topic reads REPLY_TO_CLIENT: with authentication on, a heartbeat naming another
    user's live client id does not take its replies; the same user's reconnection does; a closed one frees it."""
    from types import SimpleNamespace

    def conn_of(user):
        c = Conn()
        c.session = SimpleNamespace(user=user)
        return c

    r = ProducerRegistry(timeout_s=10)
    alice, mallory, alice_again = conn_of("alice"), conn_of("mallory"), conn_of("alice")
    r.heartbeat(alice, ["PG"], 0.0, "client-1")
    r.heartbeat(mallory, ["PG"], 1.0, "client-1")
    assert r.client("client-1") is alice
    r.heartbeat(alice_again, ["PG"], 2.0, "client-1")
    assert r.client("client-1") is alice_again
    alice_again.closed = True
    r.heartbeat(mallory, ["PG"], 3.0, "client-1")  # the id's holder is gone: anyone may register it
    assert r.client("client-1") is mallory
