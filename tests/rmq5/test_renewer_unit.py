"""Auto-renew's bookkeeping and rounds (metaq/rmq5/renewer.py), no network: ``Renewals`` pure, the time passed in;
``Renewer`` against a real store, roles, put path and ``PopService`` (tests/pop/test_deposed.py's in-process
broker): renewal through the journal, the delivery's handle acking after its first deadline, a nack ending renewal,
a client's end releasing what it held, the bounds at the limit and one past, nothing written once deposed."""

import logging

import pytest

from metaq.rmq5 import limits as rmq5_limits
from metaq.pop.records import InvalidHandle
from metaq.protocol.journaltopic import POP_TOPIC
from metaq.rmq5.renewer import RENEW_AHEAD_MS, Renewals, Renewer
from metaq.rmq5.calls import ClientKey
from metaq.clock import now_ms
from tests.pop.test_deposed import Broker

C1 = ClientKey("", "c1")  # a client as the port names it: no user (authentication off), its id
G, T = "workers", "orders"
NOW = 1_700_000_000_000


def test_limits_are_named():
    assert rmq5_limits.GRPC_RENEW_MAX_MS == 3 * 3600 * 1000 and rmq5_limits.GRPC_RELEASE_INVISIBLE_MS == 1000
    assert rmq5_limits.GRPC_MAX_RENEWED == 100_000 and rmq5_limits.GRPC_MAX_RENEWED_PER_CLIENT == 10_000
    assert rmq5_limits.GRPC_CLIENT_IDLE_MS == 120_000 and rmq5_limits.GRPC_RENEW_INVISIBLE_MS == 60_000


def test_messages_are_due_within_the_margin_and_dropped_past_the_maximum_age():
    r = Renewals(max_age_ms=10_000)
    assert r.hold("c1", G, T, [(0, 0, 1, NOW + 3000), (0, 1, 1, NOW + 9000)], NOW) == 0
    assert r.due(NOW, 2000) == {}
    assert r.due(NOW + 1000, 2000) == {(G, T): [(0, 0, 1, NOW + 3000)]}
    r.renewed(G, T, [(0, 0, 1, NOW + 3000)], [(0, 0, 1, NOW + 3000)], NOW + 8000)
    assert r.due(NOW + 7000, 2000) == {(G, T): [(0, 0, 1, NOW + 8000), (0, 1, 1, NOW + 9000)]}
    r.renewed(G, T, [(0, 0, 1, NOW + 8000), (0, 1, 1, NOW + 9000)], [(0, 1, 1, NOW + 9000)], NOW + 15_000)
    assert len(r) == 1  # (0, 0) was no longer the delivery held (acked, nacked, delivered again): dropped
    assert r.due(NOW + 10_000 - 1, 5000) == {}
    assert r.due(NOW + 10_000, 5000) == {} and len(r) == 0  # held 10 s since its delivery: no longer renewed
    assert r.counts["aged_out"] == 1 and r.by_client == {}


def test_the_bounds_at_the_limit_and_one_past():
    r = Renewals(max_total=5, max_per_client=3)
    assert r.hold("c1", G, T, [(0, o, 1, NOW) for o in range(3)], NOW) == 0  # at the client's limit
    assert r.hold("c1", G, T, [(0, 3, 1, NOW)], NOW) == 1  # one past it: delivered, not renewed
    assert r.hold("c2", G, T, [(1, o, 1, NOW) for o in range(2)], NOW) == 0  # at the broker's limit
    assert r.hold("c3", G, T, [(2, 0, 1, NOW)], NOW) == 1  # one past it
    assert len(r) == 5 and r.of_client("c1") == 3 and r.of_client("c3") == 0 and "c3" not in r.by_client
    r.release(G, T, 0, 0)  # c1 acked one: room again
    assert r.hold("c3", G, T, [(2, 0, 1, NOW)], NOW) == 0
    assert r.counts["not_renewed"] == 2


def test_a_users_clients_hold_at_most_its_share_and_another_user_keeps_its_room():
    from metaq.rmq5.calls import ClientKey
    r = Renewals(max_total=6, max_per_client=3, max_per_user=4)
    a1, a2, b1 = ClientKey("alice", "a1"), ClientKey("alice", "a2"), ClientKey("bob", "b1")
    assert r.hold(a1, G, T, [(0, o, 1, NOW) for o in range(3)], NOW) == 0
    assert r.hold(a2, G, T, [(1, 0, 1, NOW)], NOW) == 0  # alice at her share over two clients
    assert r.hold(a2, G, T, [(1, 1, 1, NOW)], NOW) == 1  # one past it: delivered, not renewed
    assert r.of_user("alice") == 4
    assert r.hold(b1, G, T, [(2, o, 1, NOW) for o in range(2)], NOW) == 0  # bob's room is still there
    r.release(G, T, 0, 0)  # alice acked one: room again for her
    assert r.hold(a2, G, T, [(1, 1, 1, NOW)], NOW) == 0
    assert r.end(a1) and r.of_user("alice") == 2 and r.of_user("bob") == 2
    assert r.hold("c", G, T, [(3, 0, 1, NOW)], NOW) == 0  # no user (authentication off): the broker's bounds only


def test_a_client_ends_with_its_last_telemetry_stream_or_when_not_heard_from():
    r = Renewals(idle_ms=1000)
    r.stream_seen("c1", "call-a", NOW)
    r.stream_seen("c1", "call-b", NOW)
    r.hold("c1", G, T, [(0, 0, 1, NOW + 60_000)], NOW)
    assert not r.stream_closed("c1", "call-a")  # another stream of it is open
    assert r.stream_closed("c1", "call-b")
    assert r.end("c1") == {(G, T): [(0, 0, 1, NOW + 60_000)]} and len(r) == 0
    assert r.heard_ms == {} and r.streams == {}  # nothing kept of a client that ended
    r.hold("c2", G, T, [(0, 1, 1, NOW + 60_000)], NOW)
    r.heard("c2", NOW + 500)
    assert r.idle(NOW + 1499) == [] and r.idle(NOW + 1500) == ["c2"]


def test_a_message_delivered_again_to_another_client_is_held_for_that_one():
    r = Renewals()
    r.hold("c1", G, T, [(0, 0, 1, NOW)], NOW)
    r.hold("c2", G, T, [(0, 0, 2, NOW + 5)], NOW)
    assert r.of_client("c1") == 0 and r.of_client("c2") == 1 and r.end("c1") == {}
    r.renewed(G, T, [(0, 0, 1, NOW)], [], NOW + 10)  # a round's answer about the earlier delivery
    assert r.of_client("c2") == 1 and r.held[(G, T, 0, 0)].deadline == NOW + 5


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path)
    yield b
    b.close()


def delivered(b, renewer, client, n, invisible):
    for i in range(n):
        b.store.put(T, 0, 0, b"job%d" % i, now_ms())
    got = b.pop.receive(G, T, n, invisible)
    renewer.delivered(client, G, T, got)
    return got


def test_a_round_renews_through_the_journal_and_the_deliverys_handle_acks_after_its_first_deadline(broker):
    renewer = Renewer(broker.pop, 1000)
    [m] = delivered(broker, renewer, C1, 1, 1000)
    records = broker.store.max_offset(POP_TOPIC, 0)
    renewer.round(m.deadline_ms - 501)  # half of 1000 ms ahead: not due yet
    assert broker.store.max_offset(POP_TOPIC, 0) == records
    renewer.round(m.deadline_ms - 300)
    assert broker.store.max_offset(POP_TOPIC, 0) == records + 1  # one "r" record
    f = broker.pop.state.flight_at(G, T, 0, m.offset)
    assert (f.deadline, f.handed) == (m.deadline_ms - 300 + 1000, m.deadline_ms)
    assert broker.pop.state.flight(G, T, m.handle, m.deadline_ms + 100)[2] is f  # past the first deadline: valid
    assert (renewer.ahead_ms, renewer.interval_s) == (500, 0.25)
    assert (Renewer(broker.pop, 60_000).ahead_ms, Renewer(broker.pop, 60_000).interval_s) == (RENEW_AHEAD_MS, 1.0)


def test_a_nack_ends_renewal_and_an_ack_settles_it(broker):
    renewer = Renewer(broker.pop, 1000)
    a, b = delivered(broker, renewer, C1, 2, 1000)
    new = broker.pop.change_invisible(G, T, a.handle, 5000)  # the push consumer's nack
    renewer.settled(G, T, [a.handle])
    assert broker.pop.ack(G, T, [b.handle]) == [None]
    renewer.settled(G, T, [b.handle])
    assert len(renewer.renewals) == 0
    renewer.round(now_ms() + 900)  # nothing is renewed: the nacked one comes back at its new deadline
    assert broker.pop.state.flight(G, T, new, now_ms())[2].handed is None


def test_a_change_the_renewer_was_not_told_of_still_ends_renewal(broker):
    renewer = Renewer(broker.pop, 1000)
    [a] = delivered(broker, renewer, C1, 1, 1000)
    broker.pop.change_invisible(G, T, a.handle, 500)
    renewer.round(a.deadline_ms - 100)  # its flight is no longer the delivery held: dropped, not renewed
    assert len(renewer.renewals) == 0 and renewer.counts["renewed"] == 0


def test_a_terminated_client_s_messages_are_visible_again_soon(broker):
    renewer = Renewer(broker.pop, 60_000)
    got = delivered(broker, renewer, C1, 2, 60_000)
    renewer.terminated(C1)
    now = now_ms()
    renewer.round(now)
    assert len(renewer.renewals) == 0
    for m in got:
        assert broker.pop.state.flight_at(G, T, 0, m.offset).deadline == now + rmq5_limits.GRPC_RELEASE_INVISIBLE_MS
        with pytest.raises(InvalidHandle):  # the ended client's handles no longer ack
            broker.pop.state.flight(G, T, m.handle, now)


def test_past_the_per_client_bound_a_receive_is_delivered_not_renewed_and_logged_once(broker, caplog):
    renewer = Renewer(broker.pop, 1000, Renewals(max_per_client=2))
    with caplog.at_level(logging.WARNING, logger="metaq.rmq5.renewer"):
        delivered(broker, renewer, C1, 2, 1000)  # at the limit
        assert not caplog.records
        extra = delivered(broker, renewer, C1, 3, 1000)  # past it: three more, one line
        delivered(broker, renewer, C1, 1, 1000)
    assert len([r for r in caplog.records if "not renewed" in r.getMessage()]) == 1
    assert len(renewer.renewals) == 2
    renewer.round(extra[0].deadline_ms - 100)
    assert broker.pop.state.flight_at(G, T, 0, extra[0].offset).handed is None  # delivered, not renewed


def test_a_deposed_broker_s_renewer_writes_nothing(broker, caplog):
    renewer = Renewer(broker.pop, 1000)
    [m] = delivered(broker, renewer, C1, 1, 1000)
    broker.depose()
    written = broker.store.written_position
    with caplog.at_level(logging.WARNING, logger="metaq.rmq5.renewer"):
        renewer.round(m.deadline_ms - 100)
        renewer.round(m.deadline_ms - 50)
    assert broker.store.written_position == written
    assert renewer.counts["rounds_refused"] == 2
    assert len([r for r in caplog.records if "writes nothing" in r.getMessage()]) == 1
    assert len(renewer.renewals) == 1  # held: renewed again should this broker lead again


def test_a_dead_letter_with_the_deliverys_handle_applies_to_the_renewed_message(broker):
    renewer = Renewer(broker.pop, 1000)
    [m] = delivered(broker, renewer, C1, 1, 1000)
    renewer.round(m.deadline_ms - 300)
    assert broker.pop.state.flight_at(G, T, 0, m.offset).handed == m.deadline_ms
    broker.pop.dead_letter(G, T, m.handle)  # ForwardMessageToDeadLetterQueue with the delivery's handle
    renewer.settled(G, T, [m.handle])
    assert broker.pop.state.flight_at(G, T, 0, m.offset) is None and len(renewer.renewals) == 0
    assert broker.store.max_offset("%DLQ%" + G, 0) == 1
