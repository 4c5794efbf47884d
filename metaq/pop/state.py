"""The POP state: per group and topic-partition, which messages are handed out, in flight or acknowledged (pure,
the time passed in; docs/messaging.md "Per-message acknowledgement (POP)").

Per (group, topic, partition) a ``Cursor`` holds ``low`` (every offset below is done: acknowledged or
dead-lettered), ``next`` (the first offset never handed out), ``flights`` (offset -> ``Flight``: the delivery's
attempt, its invisible deadline, its message group for FIFO) and ``done`` (offsets in ``[low, next)`` acknowledged
out of order). An offset in ``[low, next)`` is in flight or done, never both. Expired flights stay in flight until
they are handed out again (attempt + 1) or dead-lettered.

``plan`` decides a receive without changing anything and returns the records that carry it out; ``apply`` is the
only change, the same for a record written now and one replayed from the journal, so the replay of the journal
equals the live state (``pop/records.py`` says the records). Every map is bounded: (group, topic) pairs
(``POP_MAX_GROUPS``), messages in flight per pair (``POP_MAX_IN_FLIGHT``), the span of a partition ahead of its
lowest unacknowledged offset (``POP_MAX_SPAN``, which bounds ``done``).

Each pair keeps its flights' deadlines in a heap (``GroupPop.deadlines``, an entry a record's deliveries of one
deadline; an item whose flight has since moved on or ended is dropped when met, the heap rebuilt when its entries
outnumber the flights), its count in flight and
its message groups in flight, so a receive visits the expired flights and the messages it hands out, never every
flight (``PopState.visited`` counts what it visits).

FIFO: with ``fifo``, a message carrying a message group is handed out only when no message of that group is in
flight (expired ones included), and a partition is read no further than its first such message, so each group's
messages go out one at a time, in log order; a redelivery keeps its place ahead of the group's later messages.
"""

import heapq

from metaq import errors
from metaq.pop import limits as pop_limits
from metaq.pop.records import InvalidHandle, handle, parse_handle, parse_handles

__all__ = ["Flight", "Cursor", "PopState", "Plan"]


class Flight:
    """One delivery in flight: its ``attempt``, its invisible ``deadline`` (when it is handed out again), its message
    ``group`` (FIFO), and ``handed``: the deadline the delivery's receipt handle names while the broker renews it
    (auto-renew: ``r`` records move ``deadline`` on, the client's handle still names the delivery), else None."""

    __slots__ = ("attempt", "deadline", "group", "handed")

    def __init__(self, attempt, deadline, group, handed=None):
        self.attempt, self.deadline, self.group, self.handed = attempt, deadline, group, handed

    def names(self, attempt, deadline):
        """Whether a handle of ``attempt`` and ``deadline`` names this delivery: its current deadline, or the one
        its handle was given with while the broker renews it."""
        return attempt == self.attempt and deadline in (self.deadline, self.handed)

    def as_list(self, offset):
        out = [offset, self.attempt, self.deadline, self.group]
        if self.handed is not None:
            out.append(self.handed)
        return out


class Cursor:
    """One partition of one (group, topic): see the module doc."""

    __slots__ = ("low", "next", "flights", "done")

    def __init__(self, low=0, nxt=0):
        self.low, self.next, self.flights, self.done = low, nxt, {}, set()

    def finish(self, offset):
        """``offset`` acknowledged or dead-lettered: out of flight, and ``low`` moved past what is done; returns
        the flight that ended (None: it was not in flight)."""
        f = self.flights.pop(offset, None)
        if offset < self.low or offset >= self.next:
            return f
        self.done.add(offset)
        while self.low in self.done:
            self.done.discard(self.low)
            self.low += 1
        return f

    def skip_to(self, offset):
        """Every offset below ``offset`` passed over (deleted by retention); returns the flights that ended."""
        if offset <= self.low:
            return []
        self.low, self.next = offset, max(self.next, offset)
        ended = [f for o, f in self.flights.items() if o < offset]
        self.flights = {o: f for o, f in self.flights.items() if o >= offset}
        self.done = {o for o in self.done if o >= offset}
        while self.low in self.done:
            self.done.discard(self.low)
            self.low += 1
        return ended

    def snapshot(self):
        return {"low": self.low, "next": self.next, "done": sorted(self.done),
                "f": [f.as_list(o) for o, f in sorted(self.flights.items())]}


class GroupPop:
    """One (group, topic): its partitions' cursors, its counts (redelivered, dead-lettered) and what a receive
    needs without walking every flight: ``deadlines`` (a heap of ``(deadline, seq, [(p, offset, Flight)])``, the
    flights a record set in flight until one deadline; an item whose flight ended or moved its deadline is stale),
    ``flying`` (the count in flight) and ``mgroups`` (message
    group -> its count in flight). Every flight begins in ``fly``, ends in ``land`` and moves in ``moved``."""

    __slots__ = ("cursors", "redelivered", "dead", "turn", "deadlines", "flying", "mgroups", "seq")

    def __init__(self):
        self.cursors, self.redelivered, self.dead, self.turn = {}, 0, 0, 0
        self.deadlines, self.flying, self.mgroups, self.seq = [], 0, {}, 0

    def in_flight(self):
        return self.flying

    def fly(self, c, p, o, f):
        """``f`` in flight at offset ``o`` of partition ``p`` (cursor ``c``), in place of one there."""
        old = c.flights.get(o)
        if old is not None:
            self.land(old)
        c.flights[o] = f
        self.flying += 1
        if f.group is not None:
            self.mgroups[f.group] = self.mgroups.get(f.group, 0) + 1
        self.moved(p, o, f)

    def land(self, f):
        """``f`` (taken out of its cursor's flights) ended."""
        if f is None:
            return
        self.flying -= 1
        _ungroup(self.mgroups, f.group)

    def moved(self, p, o, f):
        """``f``'s deadline set: indexed at it (its older entry goes stale); the heap is rebuilt from the flights
        when stale entries outnumber them (``reindex``)."""
        self.index(f.deadline, [(p, o, f)])
        self.reindex()

    def index(self, deadline, items):
        """``items`` (``[(p, offset, Flight)]``, in flight until ``deadline``) indexed as one entry: a receive's
        deliveries share their deadline, so its record is one entry, not one a message."""
        self.seq += 1
        heapq.heappush(self.deadlines, (deadline, self.seq, items))

    def reindex(self):
        """The heap rebuilt from the flights (an entry each) when its entries outnumber them."""
        if len(self.deadlines) > 2 * self.flying + 64:
            flights = [(p, o, f) for p, c in self.cursors.items() for o, f in c.flights.items()]
            self.deadlines = [(f.deadline, n, [(p, o, f)]) for n, (p, o, f) in enumerate(flights)]
            heapq.heapify(self.deadlines)
            self.seq = len(flights)

    def _trim(self):
        """The top entry's leading items that no longer name a flight at its deadline dropped, and the top entry
        with none left, until a live one is on top; returns the items dropped."""
        heap, cursors, dropped = self.deadlines, self.cursors, 0
        while heap:
            d, _s, items = heap[0]
            for i, (p, o, f) in enumerate(items):
                c = cursors.get(p)
                if c is not None and c.flights.get(o) is f and f.deadline == d:
                    if i:
                        del items[:i]
                    return dropped + i
            dropped += len(items)
            heapq.heappop(heap)
        return dropped

    def expired(self, now_ms, visit):
        """The flights whose deadline is at or before ``now_ms``, ``[(deadline, p, offset, Flight)]`` oldest
        first (stale items met on the way are dropped; the live ones stay indexed); ``visit(n)`` counts the
        items met."""
        heap, cursors, out, back, met, seen = self.deadlines, self.cursors, [], [], 0, set()
        while heap and heap[0][0] <= now_ms:
            d, s, items = heapq.heappop(heap)
            met += len(items)
            live = []
            for p, o, f in items:
                c = cursors.get(p)
                if c is not None and c.flights.get(o) is f and f.deadline == d and (p, o) not in seen:
                    seen.add((p, o))
                    live.append((p, o, f))
                    out.append((d, p, o, f))
            if live:
                back.append((d, s, live))
        for entry in back:
            heapq.heappush(heap, entry)
        visit(met + self._trim() + 1)
        if len(out) > 1:
            out.sort(key=_deadline_order)
        return out

    def next_deadline(self):
        """The earliest deadline in flight, or None."""
        self._trim()
        heap = self.deadlines
        return heap[0][0] if heap else None


def _deadline_order(entry):
    return entry[0], entry[1], entry[2]


class _Busy:
    """The message groups a FIFO receive must not hand out: those in flight for the pair (``mgroups``), less the
    ones the receive dead-letters, plus the ones it hands out."""

    __slots__ = ("flying", "freed", "added")

    def __init__(self, flying):
        self.flying, self.freed, self.added = flying, set(), set()

    def __contains__(self, m):
        return m in self.added or (m in self.flying and m not in self.freed)

    def add(self, m):
        self.added.add(m)

    def discard(self, m):
        self.freed.add(m)
        self.added.discard(m)


class Plan:
    """What one receive does: ``skips`` ``[[p, offset]]``, ``dead`` ``[[p, offset]]`` (copied to the dead-letter
    topic first), ``deliver`` ``[[p, offset, attempt, deadline, message_group]]``; ``records(group, topic)``: the
    journal records that carry it out, in order."""

    __slots__ = ("skips", "dead", "deliver")

    def __init__(self):
        self.skips, self.dead, self.deliver = [], [], []

    def records(self, group, topic):
        out = []
        for kind, entries in (("s", self.skips), ("x", self.dead), ("d", self.deliver)):
            if entries:
                out.append({"k": kind, "g": group, "t": topic, "e": entries})
        return out


class PopState:
    """Every (group, topic)'s ``GroupPop`` (see the module doc). ``apply(rec)`` takes a journal record; snapshot
    records are taken by ``pop/follow.py``'s replay, which builds a fresh state from them."""

    def __init__(self, max_groups=pop_limits.POP_MAX_GROUPS, max_in_flight=pop_limits.POP_MAX_IN_FLIGHT,
                 max_span=pop_limits.POP_MAX_SPAN):
        self.groups = {}  # (group, topic) -> GroupPop
        self.max_groups, self.max_in_flight, self.max_span = max_groups, max_in_flight, max_span
        self.visited = 0  # the deadline entries receives met (what a receive walks beyond what it hands out)

    def _visit(self, n):
        self.visited += n

    # -- reading ----------------------------------------------------------------

    def flight(self, group, topic, handle_text, now_ms):
        """``(partition, offset, Flight)`` of a handle in flight now, ``(partition, offset, None)`` when that
        message is done already (a repeated ack); InvalidHandle for a malformed, expired or superseded handle."""
        found = self.flights(group, topic, [handle_text], now_ms)[0]
        if isinstance(found, InvalidHandle):
            raise found
        return found

    def flights(self, group, topic, handles, now_ms):
        """``flight`` of each handle of an ack, looked up in one pass (the pair found once, then one cursor and one
        flight lookup a handle): a list of ``(partition, offset, Flight or None)`` or ``InvalidHandle``, in order.
        A renewed delivery (``Flight.handed``) is named by the handle it was delivered with, expired at its current
        deadline."""
        g = self.groups.get((group, topic))
        cursors = g.cursors if g is not None else {}
        out = []
        for text, parsed in zip(handles, parse_handles(handles), strict=True):
            if parsed is None:
                try:
                    parse_handle(text)  # raises, saying why
                except InvalidHandle as exc:
                    out.append(exc)
                continue
            p, o, attempt, deadline = parsed
            c = cursors.get(p)
            if c is None:
                f = None
            elif o < c.low or o in c.done:
                out.append((p, o, None))
                continue
            else:
                f = c.flights.get(o)
            if f is None or not f.names(attempt, deadline):
                out.append(InvalidHandle("receipt handle %s names no message of %s/%s in flight (an older "
                                         "delivery's?)" % (text, group, topic)))
            elif f.deadline <= now_ms:  # a renewed delivery's handle works until the renewed deadline
                out.append(InvalidHandle("receipt handle %s is expired" % text))
            else:
                out.append((p, o, f))
        return out

    def flight_at(self, group, topic, partition, offset):
        """The ``Flight`` of the message at ``offset`` of ``partition`` for ``group`` now; None when it is not in
        flight (never handed out, or done)."""
        g = self.groups.get((group, topic))
        c = g.cursors.get(partition) if g is not None else None
        return c.flights.get(offset) if c is not None else None

    def next_deadline(self, group, topic):
        """The earliest invisible deadline of the pair's flights (when a receive may hand one out again), or None."""
        g = self.groups.get((group, topic))
        return g.next_deadline() if g is not None else None

    def message_states(self, topic, partition, offset):
        """``[(group, state, Flight or None)]``, sorted by group, for every group that receives ``topic``: where the
        message at ``offset`` of ``partition`` is for it: ``"in_flight"`` (handed out and not acknowledged: its
        Flight says the attempt and the invisible deadline, past which it is handed out again), ``"done"``
        (acknowledged or dead-lettered: the state does not keep which) or ``"not_received"``."""
        out = []
        for (group, t), g in sorted(self.groups.items()):
            if t != topic:
                continue
            c = g.cursors.get(partition)
            if c is None or offset >= c.next:
                out.append((group, "not_received", None))
            elif offset in c.flights:
                out.append((group, "in_flight", c.flights[offset]))
            elif offset < c.low or offset in c.done:
                out.append((group, "done", None))
            else:  # below next, neither in flight nor done: passed over by a skip (retention) or never read
                out.append((group, "not_received", None))
        return out

    def cursors(self):
        """``(group, topic, {partition: (low, acknowledged above low, in flight)})`` of every pair (``stats
        groups``: where each POP group is; a partition it never received from is not in its map)."""
        return [(g, t, {p: (c.low, len(c.done), len(c.flights)) for p, c in gp.cursors.items()})
                for (g, t), gp in self.groups.items()]

    def rows(self):
        """``(group, topic, in_flight, redelivered, dead_lettered)`` of every pair, sorted."""
        return [(g, t, gp.in_flight(), gp.redelivered, gp.dead) for (g, t), gp in sorted(self.groups.items())]

    # -- deciding ---------------------------------------------------------------

    def plan(self, group, topic, partitions, max_messages, invisible_ms, now_ms, max_attempts, read, start,
             fifo=False):
        """A receive's ``Plan`` (nothing changed). ``read(p, offset, count)`` -> ``(items, moved)``: up to ``count``
        ``(offset, message_group)`` from ``offset`` (fewer at the end), or ``moved`` the partition's first offset
        when ``offset`` lies below it (items empty then); ``start(p)``: where the group starts on a partition it
        never read. Expired flights come first (oldest deadline first); past ``max_attempts`` deliveries they are
        dead-lettered instead, then new messages are read from the partitions in turn, starting one further each
        receive (so consumers outnumbering partitions share them)."""
        key = (group, topic)
        g = self.groups.get(key)
        if g is None and len(self.groups) >= self.max_groups:
            raise errors.Unavailable("POP state holds %d group/topic pairs (limits.POP_MAX_GROUPS): %s/%s refused"
                                     % (self.max_groups, group, topic))
        plan = Plan()
        deadline = now_ms + invisible_ms
        cursors = g.cursors if g is not None else {}
        expired = g.expired(now_ms, self._visit) if g is not None else []
        busy = _Busy(g.mgroups if g is not None and fifo else {})
        self._plan_expired(plan, expired, deadline, max_messages, max_attempts, busy)
        room = self.max_in_flight - (g.in_flight() if g is not None else 0) + len(plan.dead)
        turn = g.turn if g is not None else 0
        for p in [(turn + i) % partitions for i in range(partitions)]:
            room = self._plan_new(plan, p, cursors.get(p), room, deadline, max_messages, read, start, busy, fifo)
        _drop_skipped(plan)
        return plan

    @staticmethod
    def _plan_expired(plan, expired, deadline, max_messages, max_attempts, busy):
        """Adds the ``expired`` flights (oldest deadline first) to ``plan``: dead-lettered past ``max_attempts``
        deliveries (their message group no longer ``busy``: a FIFO group's next message waits only for the
        group's flights), delivered again while ``max_messages`` has room."""
        for _d, p, o, f in expired:
            if f.attempt >= max(1, max_attempts):
                plan.dead.append([p, o])
                busy.discard(f.group)
            elif len(plan.deliver) < max_messages:
                plan.deliver.append([p, o, f.attempt + 1, deadline, f.group])

    def _plan_new(self, plan, p, c, room, deadline, max_messages, read, start, busy, fifo):
        """Adds new messages of partition ``p`` (cursor ``c``, None: never read) to ``plan``, within ``room`` more
        flights, ``max_messages`` and the cursor's span, skipping past what retention deleted and stopping at a
        message whose group is busy (``fifo``); returns the room left."""
        if c is None:
            low = nxt = start(p)
            if low:
                plan.skips.append([p, low])
        else:
            low, nxt = c.low, c.next
        while len(plan.deliver) < max_messages and room > 0:
            want = min(max_messages - len(plan.deliver), room, low + self.max_span - nxt)
            if want <= 0:
                break
            items, moved = read(p, nxt, want)
            if moved is not None and moved > nxt:
                plan.skips.append([p, moved])
                low, nxt = max(low, moved), moved
                continue
            if not items:
                break
            for offset, mgroup in items:
                mgroup = mgroup if fifo else None
                if mgroup is not None and mgroup in busy:
                    return room
                if mgroup is not None:
                    busy.add(mgroup)
                plan.deliver.append([p, offset, 1, deadline, mgroup])
                room -= 1
                nxt = offset + 1
        return room

    def handles(self, plan):
        """The receipt handles of ``plan.deliver``, in order."""
        return [handle(p, o, a, d) for p, o, a, d, _g in plan.deliver]

    # -- changing ---------------------------------------------------------------

    def _group(self, group, topic):
        key = (group, topic)
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = GroupPop()
        return g

    @staticmethod
    def _cursor(g, p):
        c = g.cursors.get(p)
        if c is None:
            c = g.cursors[p] = Cursor()
        return c

    def apply(self, rec):
        """Take one journal record (``d``, ``a``, ``x``, ``c``, ``r``, ``s``); see ``pop/records.py``."""
        apply = self._APPLY.get(rec["k"])
        g = self._group(rec["g"], rec["t"])
        if apply is not None:
            apply(self, g, rec)

    def _apply_delivered(self, g, rec):
        """``d``: deliveries (first or again) of the group's messages; the group's turn moves one on. One pass over
        the entries (``GroupPop.fly``'s and ``moved``'s work done in line: a receive's batch is applied here)."""
        g.turn += 1
        cursors, mgroups = g.cursors, g.mgroups
        flying, redelivered = g.flying, g.redelivered
        run_deadline, run = None, None
        for p, o, attempt, deadline, mgroup in rec["e"]:
            c = cursors.get(p)
            if c is None:
                c = cursors[p] = Cursor()
            if o < c.low or o in c.done:
                continue
            flights = c.flights
            old = flights.get(o)
            if old is not None:
                flying -= 1
                _ungroup(mgroups, old.group)
            flights[o] = f = Flight(attempt, deadline, mgroup)
            flying += 1
            if mgroup is not None:
                mgroups[mgroup] = mgroups.get(mgroup, 0) + 1
            if deadline != run_deadline:  # one index entry a deadline (a receive's deliveries share one)
                if run:
                    g.index(run_deadline, run)
                run_deadline, run = deadline, []
            run.append((p, o, f))
            if o >= c.next:
                c.next = o + 1
            if attempt > 1:
                redelivered += 1
        if run:
            g.index(run_deadline, run)
        g.flying, g.redelivered = flying, redelivered
        g.reindex()

    def _apply_finished(self, g, rec):
        """``a`` (acknowledged) and ``x`` (dead-lettered, counted when still in flight): the flights end (one pass,
        ``Cursor.finish`` and ``GroupPop.land`` done in line)."""
        dead = rec["k"] == "x"
        cursors, mgroups = g.cursors, g.mgroups
        landed = 0
        for p, o in rec["e"]:
            c = cursors.get(p)
            if c is None:
                c = cursors[p] = Cursor()
            f = c.flights.pop(o, None)
            if f is not None:
                landed += 1
                if dead:
                    g.dead += 1
                if f.group is not None:
                    _ungroup(mgroups, f.group)
            if o == c.low and o < c.next:
                low = o + 1
                done = c.done
                if done:
                    while low in done:
                        done.discard(low)
                        low += 1
                c.low = low
            elif c.low < o < c.next:
                c.done.add(o)
        g.flying -= landed

    def _apply_changed(self, g, rec):
        """``c``: a new deadline and a new handle; a renewal (of the old handle) ends."""
        for p, o, deadline in rec["e"]:
            f = self._cursor(g, p).flights.get(o)
            if f is not None:
                f.deadline, f.handed = deadline, None
                g.moved(p, o, f)

    def _apply_renewed(self, g, rec):
        """``r``: renewed; the delivery's handle (the deadline it was handed out with) still names it."""
        for p, o, attempt, deadline in rec["e"]:
            f = self._cursor(g, p).flights.get(o)
            if f is not None and f.attempt == attempt:
                if f.handed is None:
                    f.handed = f.deadline
                f.deadline = deadline
                g.moved(p, o, f)

    def _apply_skipped(self, g, rec):
        """``s``: cursors skip past what retention deleted."""
        for p, o in rec["e"]:
            for f in self._cursor(g, p).skip_to(o):
                g.land(f)

    def _apply_partition(self, g, rec):
        """``P``: one partition's cursor from a snapshot, with the pair's counts."""
        c = self._cursor(g, rec["p"])
        c.low, c.next, c.done = rec["low"], rec["next"], set(rec["done"])
        for f in c.flights.values():
            g.land(f)
        c.flights = {}
        for e in rec["f"]:
            g.fly(c, rec["p"], e[0], Flight(*e[1:]))
        g.redelivered, g.dead = rec["r"], rec["x"]

    #: Each journal record kind (``pop/records.py``) and the change it makes; other kinds change nothing.
    _APPLY = {"d": _apply_delivered, "a": _apply_finished, "x": _apply_finished, "c": _apply_changed,
              "r": _apply_renewed, "s": _apply_skipped, "P": _apply_partition}

    def snapshot_records(self):
        """The snapshot's records (``S``, one ``P`` per partition of every pair, ``E``)."""
        out = [{"k": "S"}]
        for (group, topic), g in sorted(self.groups.items()):
            for p, c in sorted(g.cursors.items()):
                rec = {"k": "P", "g": group, "t": topic, "p": p, "r": g.redelivered, "x": g.dead}
                rec.update(c.snapshot())
                out.append(rec)
        out.append({"k": "E", "n": len(out) - 1})
        return out

    def view(self):
        """Everything as plain values (the tests compare a replay with the live state through it)."""
        return {key: {"r": g.redelivered, "x": g.dead,
                      "c": {p: c.snapshot() for p, c in sorted(g.cursors.items())}}
                for key, g in sorted(self.groups.items())}


def _ungroup(mgroups, m):
    """One flight of message group ``m`` (None: none) ended: its count in ``mgroups`` down, gone at 0."""
    if m is None:
        return
    n = mgroups.get(m, 0) - 1
    if n > 0:
        mgroups[m] = n
    else:
        mgroups.pop(m, None)


def _drop_skipped(plan):
    """Leaves out of ``plan`` what its skips pass over (deleted by retention): neither redelivered nor
    dead-lettered."""
    if not plan.skips:
        return
    floor = {}
    for p, o in plan.skips:
        floor[p] = max(floor.get(p, 0), o)
    plan.deliver = [e for e in plan.deliver if e[1] >= floor.get(e[0], 0)]
    plan.dead = [e for e in plan.dead if e[1] >= floor.get(e[0], 0)]
