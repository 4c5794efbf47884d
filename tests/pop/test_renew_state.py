"""Auto-renew in the POP state, pure (metaq/pop/state.py, the ``r`` record of metaq/pop/records.py): a renewed
delivery keeps the handle it was handed out with, expires at its renewed deadline, ends with a change (a nack), and
the journal's replay and a snapshot hold it as the live state does (so a new master accepts the handle too)."""

import pytest

from metaq.pop.records import InvalidHandle, parse_handle
from metaq.pop.service import PopService
from metaq.pop.state import PopState
from metaq.clock import now_ms
from tests.harness.store import NOW
from tests.pop.test_deposed import Broker
from tests.pop.test_state import G, T, Log, Pop


def renew(pop, handle_text, deadline):
    p, o, attempt, _d = parse_handle(handle_text)
    pop.write([{"k": "r", "g": G, "t": T, "e": [[p, o, attempt, deadline]]}])


def test_a_renewed_delivery_is_not_handed_out_again_and_its_first_handle_acks_it_after_the_first_deadline():
    pop = Pop(Log([None] * 2))
    _got, [h0, h1] = pop.receive(2, NOW, inv=1000)
    renew(pop, h0, NOW + 5000)
    renew(pop, h0, NOW + 9000)  # renewed again: still the handle it was delivered with
    got, _hs = pop.receive(2, NOW + 2000, inv=1000)
    assert got == [(0, 1, 2)]  # the other one, unrenewed, comes back; the renewed one does not
    assert pop.state.next_deadline(G, T) == NOW + 3000
    p, o, f = pop.state.flight(G, T, h0, NOW + 8000)
    assert (p, o, f.deadline, f.handed) == (0, 0, NOW + 9000, NOW + 1000)
    pop.ack([h0], NOW + 8000)
    assert pop.state.flight(G, T, h0, NOW + 8001)[2] is None  # done (a repeated ack is fine)
    assert pop.rebuilt() == pop.state.view()


def test_a_renewed_delivery_expires_at_its_renewed_deadline_and_comes_back_with_the_next_attempt():
    pop = Pop(Log([None]))
    _got, [h0] = pop.receive(1, NOW, inv=1000)
    renew(pop, h0, NOW + 4000)
    with pytest.raises(InvalidHandle, match="expired"):
        pop.state.flight(G, T, h0, NOW + 4000)
    got, [h1] = pop.receive(1, NOW + 4000, inv=1000)
    assert got == [(0, 0, 2)]
    with pytest.raises(InvalidHandle):  # the first delivery's handle names no delivery in flight now
        pop.state.flight(G, T, h0, NOW + 4001)
    renew(pop, h0, NOW + 9000)  # a renewal of the older attempt changes nothing
    assert pop.state.flight(G, T, h1, NOW + 4001)[2].deadline == NOW + 5000


def test_a_change_ends_the_renewal_and_the_first_handle_no_longer_acks():
    pop = Pop(Log([None]))
    _got, [h0] = pop.receive(1, NOW, inv=1000)
    renew(pop, h0, NOW + 5000)
    p, o, f = pop.state.flight(G, T, h0, NOW + 2000)  # a nack with the delivery's handle
    pop.write([{"k": "c", "g": G, "t": T, "e": [[p, o, NOW + 2100]]}])
    with pytest.raises(InvalidHandle):
        pop.state.flight(G, T, h0, NOW + 2050)
    assert pop.state.flight(G, T, "0:0:1:%d" % (NOW + 2100), NOW + 2050)[2].handed is None
    assert pop.receive(1, NOW + 2100, inv=1000)[0] == [(0, 0, 2)]


def test_a_forged_deadline_is_refused_on_a_renewed_delivery():
    pop = Pop(Log([None]))
    _got, [h0] = pop.receive(1, NOW, inv=1000)
    renew(pop, h0, NOW + 5000)
    for forged in ("0:0:1:%d" % (NOW + 1001), "0:0:2:%d" % (NOW + 1000), "0:0:1:%d" % (NOW + 4999), "0:0:1:x"):
        with pytest.raises(InvalidHandle):
            pop.state.flight(G, T, forged, NOW + 10)


def test_a_snapshot_keeps_the_renewed_deliverys_handle():
    pop = Pop(Log([None] * 2))
    _got, [h0, _h1] = pop.receive(2, NOW, inv=1000)
    renew(pop, h0, NOW + 5000)
    s = PopState()
    for rec in pop.state.snapshot_records()[1:-1]:
        s.apply(rec)
    assert s.view() == pop.state.view()
    assert s.flight(G, T, h0, NOW + 3000)[2].deadline == NOW + 5000


def test_a_slave_following_the_journal_takes_the_renewed_deliverys_handle(tmp_path):
    """What a new master has after a failover: the state its follow of the journal built, renewals included."""
    b = Broker(tmp_path)
    try:
        b.store.put(T, 0, 0, b"job", now_ms())
        [m] = b.pop.receive(G, T, 1, 1000)
        assert b.pop.renew(G, T, [(0, m.offset, m.attempt, m.deadline_ms)], m.deadline_ms + 60_000)
        slave = PopService(b.store, b.path, is_master=False)  # follows the same log, as a slave follows its copy
        b.store.mark_flushed(b.store.flush_log())
        b.store.follow_now(slave.follow)
        assert slave.state.view() == b.pop.state.view()
        p, o, f = slave.state.flight(G, T, m.handle, m.deadline_ms + 1000)
        assert (o, f.deadline, f.handed) == (m.offset, m.deadline_ms + 60_000, m.deadline_ms)
    finally:
        b.close()
