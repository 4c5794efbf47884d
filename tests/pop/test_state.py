"""The POP state, pure (metaq/pop/state.py): receive, ack, expiry, redelivery, dead letters, FIFO groups, the bounds,
and the journal's replay equal to the live state (metaq/pop/follow.py) over a real store."""

import gevent
import pytest

from metaq import errors
from metaq.pop import limits as pop_limits
from metaq.pop.follow import PopLog, replay
from metaq.pop.records import InvalidHandle, decode, encode, handle, parse_handle
from metaq.pop.service import PopService
from metaq.pop.state import PopState
from metaq.clock import now_ms
from metaq.serving.putpath import journal_append
from metaq.protocol.journaltopic import POP_TOPIC
from tests.harness.store import NOW, open_store

G, T = "g", "t"


class Log:
    """A topic's partitions as lists of message groups (None: no group); ``first``: each partition's first offset."""

    def __init__(self, *partitions):
        self.parts = [list(p) for p in partitions]
        self.first = [0] * len(partitions)

    def read(self, p, offset, count):
        if offset < self.first[p]:
            return [], self.first[p]
        return [(o, self.parts[p][o]) for o in range(offset, min(len(self.parts[p]), offset + count))], None


class Pop:
    """A PopState driven as the service drives it: plan, then apply its records (kept, for the replay tests)."""

    def __init__(self, log, **kw):
        self.log, self.state, self.records = log, PopState(**kw), []

    def write(self, recs):
        for rec in recs:
            rec = decode(encode(rec))  # what the journal gives back
            self.records.append(rec)
            self.state.apply(rec)

    def receive(self, n, now, inv=1000, attempts=3, fifo=False, start=lambda p: 0):
        plan = self.state.plan(G, T, len(self.log.parts), n, inv, now, attempts, self.log.read, start, fifo)
        self.write(plan.records(G, T))
        self.dead = [tuple(e) for e in plan.dead]
        return [(p, o, a) for p, o, a, _d, _g in plan.deliver], self.state.handles(plan)

    def ack(self, handles, now):
        done = []
        for h in handles:
            p, o, f = self.state.flight(G, T, h, now)
            if f is not None:
                done.append([p, o])
        if done:
            self.write([{"k": "a", "g": G, "t": T, "e": done}])

    def rebuilt(self):
        s = PopState()
        for rec in self.records:
            s.apply(rec)
        return s.view()


def test_two_receives_get_different_messages_and_acks_move_the_low_water():
    pop = Pop(Log([None] * 5))
    first, h1 = pop.receive(2, NOW)
    second, h2 = pop.receive(2, NOW)
    assert first == [(0, 0, 1), (0, 1, 1)] and second == [(0, 2, 1), (0, 3, 1)]
    pop.ack([h2[0]], NOW + 1)  # out of order: offset 2 done, low stays 0
    c = pop.state.groups[(G, T)].cursors[0]
    assert (c.low, c.done) == (0, {2})
    pop.ack(h1, NOW + 1)
    assert (c.low, c.done, sorted(c.flights)) == (3, set(), [3])
    pop.ack(h1, NOW + 2)  # a repeated ack is fine
    assert pop.rebuilt() == pop.state.view()


def test_an_unacked_message_comes_back_with_the_next_attempt_then_goes_to_the_dead_letters():
    pop = Pop(Log([None]))
    got, hs = pop.receive(1, NOW, inv=1000, attempts=3)
    assert got == [(0, 0, 1)]
    assert pop.receive(1, NOW + 999)[0] == []  # still invisible
    got, hs2 = pop.receive(1, NOW + 1000)
    assert got == [(0, 0, 2)]
    with pytest.raises(InvalidHandle):  # the first delivery's handle no longer acks
        pop.state.flight(G, T, hs[0], NOW + 1001)
    assert pop.receive(1, NOW + 2000)[0] == [(0, 0, 3)]
    assert pop.receive(1, NOW + 3000)[0] == [] and pop.dead == [(0, 0)]  # 3 deliveries, then the DLQ
    g = pop.state.groups[(G, T)]
    assert (g.redelivered, g.dead, g.cursors[0].low, g.in_flight()) == (2, 1, 1, 0)
    assert pop.rebuilt() == pop.state.view()


def test_an_expired_handle_is_refused_and_change_invisible_gives_a_new_handle():
    pop = Pop(Log([None]))
    _got, hs = pop.receive(1, NOW, inv=1000)
    with pytest.raises(InvalidHandle, match="expired"):
        pop.state.flight(G, T, hs[0], NOW + 1000)
    p, o, f = pop.state.flight(G, T, hs[0], NOW + 500)
    pop.write([{"k": "c", "g": G, "t": T, "e": [[p, o, NOW + 5000]]}])
    assert pop.receive(1, NOW + 2000)[0] == []  # invisible longer now
    with pytest.raises(InvalidHandle):
        pop.state.flight(G, T, hs[0], NOW + 600)
    pop.ack([handle(0, 0, 1, NOW + 5000)], NOW + 4999)
    assert pop.state.groups[(G, T)].cursors[0].low == 1
    for bad in ("", "1:2:3", "a:b:c:d", "0:0:1:" + "9" * 100, None, "\u0661:0:1:5", "0:0:1:5\n", "0:0:1:5:6",
                " 0:0:1:5", "0:-0:1:5"):
        with pytest.raises(InvalidHandle):
            parse_handle(bad)


def test_fifo_groups_go_out_one_at_a_time_in_order():
    pop = Pop(Log(["A", "A", "B", "A", "B", None]))
    got, hs = pop.receive(10, NOW, fifo=True)
    assert got == [(0, 0, 1)]  # A0 in flight: the partition is read no further than A1
    pop.ack(hs, NOW + 1)
    got, hs = pop.receive(10, NOW + 2, fifo=True)
    assert got == [(0, 1, 1), (0, 2, 1)]  # A1, B2; A3 waits for A1
    got2, _ = pop.receive(10, NOW + 3, fifo=True)
    assert got2 == []
    pop.ack([hs[1]], NOW + 4)  # B2 done: A3 still behind A1
    assert pop.receive(10, NOW + 5, fifo=True)[0] == []
    got, _ = pop.receive(10, NOW + 2000, fifo=True)  # A1 expired: it comes back first, nothing of A after it
    assert got[0] == (0, 1, 2) and (0, 3, 1) not in got
    assert pop.rebuilt() == pop.state.view()


def test_receives_are_served_across_partitions_in_turn():
    pop = Pop(Log([None] * 3, [None] * 3))
    a, _ = pop.receive(1, NOW)
    b, _ = pop.receive(1, NOW)
    assert {a[0][0], b[0][0]} == {0, 1}  # consumers outnumbering partitions: each receive starts one further
    c, _ = pop.receive(10, NOW)
    assert len(c) == 4


def test_retention_below_the_cursor_and_a_start_offset_are_skips():
    log = Log([None] * 6)
    pop = Pop(log)
    got, _ = pop.receive(2, NOW, start=lambda p: 3)
    assert got == [(0, 3, 1), (0, 4, 1)]
    log2 = Log([None] * 10)
    log2.first[0] = 8
    pop.log = log2
    got, _ = pop.receive(5, NOW + 5000)  # 3 and 4 expired, deleted meanwhile: the cursor moves past them
    c = pop.state.groups[(G, T)].cursors[0]
    assert got == [(0, 8, 1), (0, 9, 1)] and c.low == 8 and sorted(c.flights) == [8, 9]
    assert pop.rebuilt() == pop.state.view()


def test_in_flight_bound_at_the_limit_and_one_past():
    pop = Pop(Log([None] * 10), max_in_flight=3)
    got, hs = pop.receive(5, NOW)
    assert len(got) == 3  # at the limit
    assert pop.receive(5, NOW)[0] == []  # one past: nothing more until an ack
    pop.ack(hs[:1], NOW + 1)
    assert len(pop.receive(5, NOW + 1)[0]) == 1


def test_span_bound_at_the_limit_and_one_past():
    pop = Pop(Log([None] * 10), max_span=4)
    got, hs = pop.receive(10, NOW)
    assert [o for _p, o, _a in got] == [0, 1, 2, 3]
    pop.ack(hs[1:], NOW + 1)  # offset 0 still in flight: 3 done out of order, no room past the span
    assert pop.receive(10, NOW + 1)[0] == []
    pop.ack(hs[:1], NOW + 2)
    assert [o for _p, o, _a in pop.receive(10, NOW + 2)[0]] == [4, 5, 6, 7]


def test_groups_bound_at_the_limit_and_one_past():
    s = PopState(max_groups=2)
    log = Log([None])
    for g in ("a", "b"):
        plan = s.plan(g, T, 1, 1, 1000, NOW, 3, log.read, lambda p: 0)
        for rec in plan.records(g, T):
            s.apply(rec)
    with pytest.raises(errors.Unavailable, match="POP_MAX_GROUPS"):
        s.plan("c", T, 1, 1, 1000, NOW, 3, log.read, lambda p: 0)
    s.plan("a", T, 1, 1, 1000, NOW, 3, log.read, lambda p: 0)  # a pair it holds is still served


def test_the_journal_in_a_store_replays_to_the_live_state_and_a_snapshot_replaces_what_came_before(tmp_path):
    store = open_store(tmp_path)
    try:
        journal = PopLog(store, journal_append(store))
        pop = Pop(Log([None] * 6, ["A", "A", None]))
        _g, hs = pop.receive(4, NOW, fifo=True)
        pop.ack(hs[:2], NOW + 1)
        pop.receive(4, NOW + 5000, fifo=True)
        for rec in pop.records:
            journal.append(rec, NOW)
        assert replay(journal).state.view() == pop.state.view()
        journal.write_snapshot(pop.state, NOW)
        snap_at = journal.snapshots.latest
        got, hs = pop.receive(2, NOW + 6000)
        for rec in pop.records[-1:]:
            journal.append(rec, NOW)
        r = replay(journal)
        assert r.snapshot_at == snap_at and r.state.view() == pop.state.view()
        # an incomplete snapshot (a crash within it) is ignored
        journal.append({"k": "S"}, NOW)
        journal.append({"k": "P", "g": G, "t": T, "p": 0, "low": 0, "next": 0, "done": [], "f": [], "r": 0, "x": 0},
                       NOW)
        assert replay(journal).state.view() == pop.state.view()
    finally:
        store.close(NOW)


def test_the_retention_floor_moves_to_a_snapshot_only_once_its_end_is_durable(tmp_path):
    """A snapshot written but not flushed is lost with a power cut (replay ignores an incomplete one): until the log is
    flushed past its end, retention must keep the log from where the state is whole without it."""
    store = open_store(tmp_path)
    try:
        svc = PopService(store, None)
        pop = Pop(Log([None] * 6))
        _g, hs = pop.receive(4, NOW)
        pop.ack(hs[:2], NOW + 1)
        for rec in pop.records:
            svc.journal.append(rec, NOW)
            svc.state.apply(rec)
        store.mark_flushed(store.flush_log())
        first = svc.follow.retention_floor()
        assert first == store.record_spans(POP_TOPIC, 0, 0, store.written_position, 1)[0][1]
        while store.written_position - first <= store.config.segment_size:  # other traffic: the log grows a segment
            store.put("other", 0, 0, b"o" * 1000, NOW)
        svc.journal.write_snapshot(svc.state, NOW)
        snap_at = svc.journal.snapshots.latest
        assert snap_at > first + store.config.segment_size
        assert store.flushed_position < store.written_position  # the snapshot's records are in the page cache only
        assert svc.follow.retention_floor() == first  # its end is not durable: the records before it are kept
        store.mark_flushed(store.flush_log())
        assert svc.follow.retention_floor() == snap_at  # now it is: retention may delete what lies before it
        assert replay(svc.journal).snapshot_at == snap_at
    finally:
        store.close(NOW)


def test_limits_are_named():
    assert pop_limits.POP_MAX_ATTEMPTS == 16 and pop_limits.POP_MAX_BATCH == 32


def test_a_slave_keeps_the_log_from_the_last_snapshot_its_own_flush_made_durable(tmp_path):
    """A slave learns the master's snapshot from records it copied: until its own log is flushed past them, a power
    cut on the slave would lose them, so its retention keeps the log from the snapshot before."""
    store = open_store(tmp_path)
    try:
        master = PopService(store, None)
        slave = PopService(store, None, is_master=False)  # follows the same log, as a slave follows its copy
        pop = Pop(Log([None] * 6))
        _g, hs = pop.receive(4, NOW)
        pop.ack(hs[:2], NOW + 1)
        for rec in pop.records:
            master.journal.append(rec, NOW)
            master.state.apply(rec)
        store.mark_flushed(store.flush_log())
        store.follow_now(slave.follow)
        first = slave.follow.retention_floor()
        assert first == store.record_spans(POP_TOPIC, 0, 0, store.written_position, 1)[0][1]
        while store.written_position - first <= store.config.segment_size:  # other traffic: the log grows a segment
            store.put("other", 0, 0, b"o" * 1000, NOW)
        master.journal.write_snapshot(master.state, NOW)
        snap_at = master.journal.snapshots.latest
        store.follow_now(slave.follow)
        assert store.flushed_position < store.written_position
        assert slave.follow.retention_floor() == first  # learned, not durable on the slave yet
        store.mark_flushed(store.flush_log())
        assert slave.follow.retention_floor() == snap_at
    finally:
        store.close(NOW)


def test_message_states_say_where_one_message_is_for_each_group():
    pop = Pop(Log([None] * 4))
    _got, hs = pop.receive(3, NOW, inv=1000)
    pop.ack([hs[1]], NOW + 1)  # offset 1 done out of order, 0 and 2 in flight, 3 never handed out
    s = pop.state
    assert s.message_states(T, 0, 1) == [(G, "done", None)]
    [(group, state, flight)] = s.message_states(T, 0, 0)
    assert (group, state, flight.attempt, flight.deadline) == (G, "in_flight", 1, NOW + 1000)
    assert s.message_states(T, 0, 3) == [(G, "not_received", None)]
    assert s.message_states(T, 1, 0) == [(G, "not_received", None)]  # a partition the group never read
    assert s.message_states("other", 0, 0) == []  # no group receives that topic
    pop.ack([hs[0]], NOW + 2)
    assert s.message_states(T, 0, 0) == [(G, "done", None)]  # below the low water


def test_a_deposed_masters_cut_tail_leaves_nothing_in_the_state_even_when_no_follower_step_ran_since(tmp_path):
    """A master's journal subscriber is passive: the follower moves it to the log end only in its steps (after flush
    rounds). Deposed right after writing records (no step since) and then cut below them by the epoch handshake,
    its state must still lose what the cut tail held (here two acks), as the log does."""
    store = open_store(tmp_path)
    try:
        svc = PopService(store, None)
        pop = Pop(Log([None] * 6))
        _g, hs = pop.receive(4, NOW)
        for rec in pop.records:
            svc.journal.append(rec, NOW)
            svc.state.apply(rec)
        store.mark_flushed(store.flush_log())
        store.follow_log(None)  # a step after the flush: the passive subscriber at the end
        agreed, before, n = store.written_position, svc.state.view(), len(pop.records)
        pop.ack(hs[:2], NOW + 1)  # the deposed master's tail: the new master never had it
        for rec in pop.records[n:]:
            svc.journal.append(rec, NOW)
            svc.state.apply(rec)
        assert svc.state.view() != before and svc.follow.position == agreed  # no step since
        svc.role_changed(1)
        store.truncate_log(agreed, NOW)
        assert svc.state.view() == before
    finally:
        store.close(NOW)


def test_a_receives_walk_does_not_grow_with_the_messages_in_flight():
    """A receive visits the expired flights and what it hands out, never every flight: with 10,000 in flight and
    none expired, a receive meets a bounded number of deadline entries; once some expire, about that many."""
    n = 10_000
    pop = Pop(Log([None] * (n + 100)), max_in_flight=n + 100, max_span=n + 200)
    for i in range(n // 100):
        got, _ = pop.receive(100, NOW + i, inv=60_000)
        assert len(got) == 100
    assert pop.state.groups[(G, T)].in_flight() == n
    before = pop.state.visited
    for i in range(20):
        assert len(pop.receive(1, NOW + 1000 + i, inv=60_000)[0]) == 1
    assert pop.state.visited - before <= 2 * 20
    before = pop.state.visited
    got, _ = pop.receive(32, NOW + 60_000 + 4, inv=60_000)  # the first 5 receives' 500 messages expired
    assert len(got) == 32 and all(a == 2 for _p, _o, a in got)
    assert pop.state.visited - before <= 500 + 32 + 2
    before = pop.state.visited
    assert pop.receive(1, NOW + 60_000 + 4, inv=60_000)[0][0][2] == 2  # the next expired one, oldest first
    assert pop.state.visited - before <= 500 + 2
    assert pop.rebuilt() == pop.state.view()


def test_the_deadline_index_agrees_with_every_flight_through_acks_renewals_skips_and_a_snapshot():
    """What a receive hands out again and the earliest deadline, taken from the index, equal what every flight
    says, over a mixed run (acks, changed and renewed deadlines, retention skips, FIFO groups, a snapshot)."""
    import random
    rnd = random.Random(5)
    log = Log([rnd.choice(["A", "B", "C", None]) for _ in range(3000)], [None] * 3000)
    pop = Pop(log)
    now, handles = NOW, []
    for step in range(400):
        now += rnd.randrange(0, 400)
        op = rnd.random()
        if op < 0.45:
            _got, hs = pop.receive(rnd.randrange(1, 8), now, inv=rnd.randrange(100, 2000), fifo=step % 3 == 0)
            handles.extend(hs)
        elif op < 0.75 and handles:
            pick = [handles.pop(rnd.randrange(len(handles))) for _ in range(min(len(handles), 3))]
            for h in pick:
                try:
                    pop.ack([h], now)
                except InvalidHandle:
                    pass
        elif op < 0.85:
            g = pop.state.groups.get((G, T))
            live = [(p, o) for p, c in (g.cursors.items() if g else []) for o in c.flights]
            if live:
                p, o = rnd.choice(live)
                kind = rnd.choice("cr")
                f = g.cursors[p].flights[o]
                e = [p, o, now + 700] if kind == "c" else [p, o, f.attempt, now + 900]
                pop.write([{"k": kind, "g": G, "t": T, "e": [e]}])
        elif op < 0.9:
            p = rnd.randrange(2)
            log.first[p] = min(len(log.parts[p]), log.first[p] + rnd.randrange(1, 20))
        elif op < 0.95:
            recs = pop.state.snapshot_records()
            pop.records = [decode(encode(rec)) for rec in recs if rec["k"] == "P"]
            pop.state = PopState()
            for rec in pop.records:
                pop.state.apply(rec)
        g = pop.state.groups.get((G, T))
        if g is None:
            continue
        flights = [(f.deadline, p, o) for p, c in g.cursors.items() for o, f in c.flights.items()]
        assert g.in_flight() == len(flights)
        assert pop.state.next_deadline(G, T) == min((d for d, _p, _o in flights), default=None)
        assert [(d, p, o) for d, p, o, _f in g.expired(now, lambda n: None)] == sorted(
            e for e in flights if e[0] <= now)
        groups = {}
        for c in g.cursors.values():
            for f in c.flights.values():
                if f.group is not None:
                    groups[f.group] = groups.get(f.group, 0) + 1
        assert g.mgroups == groups
    assert pop.rebuilt() == pop.state.view()


def test_an_acks_handles_are_looked_up_in_one_pass_each_as_alone():
    """``flights`` answers each handle of an ack as ``flight`` does alone: in flight, done already, expired,
    superseded, malformed or of an unknown partition, in order, one bad handle failing only itself."""
    pop = Pop(Log([None] * 4))
    _got, hs = pop.receive(3, NOW, inv=1000)
    pop.ack([hs[0]], NOW + 1)
    handles = [hs[1], hs[0], handle(0, 1, 2, NOW + 1000), "nonsense", handle(7, 0, 1, NOW + 1000), hs[2]]
    found = pop.state.flights(G, T, handles, NOW + 2)
    assert [type(x).__name__ if isinstance(x, InvalidHandle) else x[:2] + (x[2] is not None,) for x in found] == [
        (0, 1, True), (0, 0, False), "InvalidHandle", "InvalidHandle", "InvalidHandle", (0, 2, True)]
    for text, one in zip(handles, found, strict=True):
        if isinstance(one, InvalidHandle):
            with pytest.raises(InvalidHandle):
                pop.state.flight(G, T, text, NOW + 2)
        else:
            assert pop.state.flight(G, T, text, NOW + 2) == one
    assert all(isinstance(x, InvalidHandle) and "expired" in str(x)
               for x in pop.state.flights(G, T, [hs[1], hs[2]], NOW + 1000))


class _Writable:
    """A put path that always writes (the master's, undeposed)."""

    def check_writable(self):
        pass


def test_an_ack_that_cannot_wait_writes_the_turns_acks_at_once_and_never_yields(tmp_path):
    """``ack(..., wait=False)`` (a gRPC connection's reader): its record, and those of acks made before it in the same
    turn, are in the log when it returns, without a switch to the loop; a greenlet waiting for the turn's end is told
    too, and the turn's end writes nothing twice."""
    store = open_store(tmp_path)
    try:
        svc = PopService(store, _Writable())
        pop = Pop(Log([None] * 6))
        now = now_ms()
        _g, hs = pop.receive(4, now, inv=60_000)
        for rec in pop.records:
            svc.journal.append(rec, NOW)
            svc.state.apply(rec)
        before = svc.journal.written
        p, o, _f = svc.state.flight(G, T, hs[0], now)
        waiting = svc._acks.add(G, T, [[p, o]], svc.state)  # an ack of this turn that waits for its end
        switched = []
        gevent.get_hub().loop.run_callback(lambda: switched.append(True))
        assert svc.ack(G, T, [hs[1], "not-a-handle"], wait=False)[0] is None
        assert not switched and svc.journal.written > before  # written before any switch to the loop
        assert waiting.ready() and waiting.get() is None  # the waiting ack was written with it
        written = svc.journal.written
        gevent.sleep(0.01)
        assert svc.journal.written == written  # the turn's end found nothing left to write
        assert replay(svc.journal).state.view() == svc.state.view()  # the log holds both acks
    finally:
        store.close(NOW)


def test_a_receives_one_index_entry_never_hands_out_what_was_acked_or_moved_since():
    """A receive's deliveries share one deadline and one index entry: after one of them is acknowledged and another's
    deadline moved (a ``c`` record), the entry's expiry hands out exactly the other two, oldest first, and the
    earliest deadline is then the moved one's."""
    pop = Pop(Log([None] * 4))
    got, hs = pop.receive(4, NOW, inv=1000)
    assert [o for _p, o, _a in got] == [0, 1, 2, 3]
    g = pop.state.groups[(G, T)]
    assert len(g.deadlines) == 1  # one entry for the receive's four flights
    pop.ack([hs[1]], NOW + 1)
    pop.write([{"k": "c", "g": G, "t": T, "e": [[0, 2, NOW + 5000]]}])
    assert pop.state.next_deadline(G, T) == NOW + 1000
    assert [(d, p, o) for d, p, o, _f in g.expired(NOW + 1000, lambda n: None)] == [(NOW + 1000, 0, 0),
                                                                                    (NOW + 1000, 0, 3)]
    again, hs2 = pop.receive(4, NOW + 1000, inv=1000)
    assert [(o, a) for _p, o, a in again] == [(0, 2), (3, 2)]
    assert g.expired(NOW + 1999, lambda n: None) == []
    assert pop.state.next_deadline(G, T) == NOW + 2000
    pop.ack(hs2, NOW + 1001)
    assert pop.state.next_deadline(G, T) == NOW + 5000
    assert pop.rebuilt() == pop.state.view()


def test_a_receives_messages_name_their_delivery_and_their_handles_ack_them(tmp_path):
    """Each ``Received`` of ``PopService.receive`` (built in the receive's loop) holds its topic, partition, offset,
    attempt, deadline and record, and its handle is ``handle`` of them: it acks that delivery; a second delivery's
    handle names the new attempt and deadline, the first no longer acks."""
    from metaq.pop.service import Received
    from tests.pop.test_deposed import Broker
    b = Broker(tmp_path)
    try:
        for i in range(3):
            b.store.put(T, 0, 0, b"job%d" % i, now_ms())
        before = now_ms()
        got = b.pop.receive(G, T, 3, 60_000)
        assert [type(r) for r in got] == [Received] * 3
        assert [(r.topic, r.partition, r.offset, r.attempt, r.record.data) for r in got] == \
            [(T, 0, o, 1, b"job%d" % o) for o in range(3)]
        for r in got:
            assert before + 60_000 <= r.deadline_ms <= now_ms() + 60_000
            assert r.handle == handle(r.partition, r.offset, r.attempt, r.deadline_ms)
            assert parse_handle(r.handle) == (r.partition, r.offset, r.attempt, r.deadline_ms)
        assert b.pop.ack(G, T, [got[0].handle]) == [None]
        b.pop.change_invisible(G, T, got[1].handle, pop_limits.POP_MIN_INVISIBLE_MS)
        gevent.sleep(pop_limits.POP_MIN_INVISIBLE_MS / 1000 + 0.05)
        [again] = b.pop.receive(G, T, 3, 60_000)
        assert (again.offset, again.attempt) == (1, 2) and again.handle == handle(0, 1, 2, again.deadline_ms)
        assert isinstance(b.pop.ack(G, T, [got[1].handle])[0], InvalidHandle)
        assert b.pop.ack(G, T, [again.handle, got[2].handle]) == [None, None]
    finally:
        b.close()
