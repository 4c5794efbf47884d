"""A Jepsen-style history of a run under faults, and the checker that judges it (issue 17 point 5).

Pure logic: no socket, no process, no clock of its own (every event carries its time ``t``, seconds
on one clock: the harness uses ``time.monotonic()``). The workload (tests/harness/workload.py) and
the fault injectors (tests/harness/faults.py) record into a ``History``:

    ack(producer, topic, partition, offset, msg_id, t)      a put acknowledged (``result 200`` at that position)
    fail(producer, msg_id, t, reason)                       a put that failed after the producer's retries
    deliver(consumer, topic, partition, offset, msg_id, t)  a message handed to the consumer group
    fault(kind, t, lag_messages=None, lag_t=None, target=None, **detail)
                                                            a fault, with the replication lag read just
                                                            before it (at ``lag_t``, default ``t``)
    heal(t)                                                 everything restarted / reconnected

``check(history, logs, mode, master=None)`` judges it against the brokers' logs read once healed,
``logs = {broker_name: {(topic, partition, offset): msg_id}}``, and returns a ``Verdict``: a list of
violations (strings naming the msg_id, positions, brokers and times), plus the duplicates, which are
reported apart and are not violations (delivery is at least once). The checks:

(a) ``sync``: every acknowledged msg_id is in the final master's log, and at the position it was
    acknowledged at (LOST, OVERWRITTEN);
(b) no position holds two different msg_ids on any two brokers (DIVERGENT);
(c) every acknowledged msg_id the final master holds was delivered to the group at least once
    (UNDELIVERED); no delivery and no logged message of the history's topics that no producer sent (PHANTOM);
(d) ``async``: an acknowledged msg_id the final master lacks is lost; it is attributed to the fault
    whose window it was last acknowledged in (after the previous fault's window, up to ``ack_slack`` s
    after this fault: a reply read just after a kill still came from the killed broker; but never past
    the next fault's lag reading); per fault the lost count must not exceed ``lag_messages`` + the
    msg_ids acknowledged after the lag was read, up to the window's end (OVER BOUND; a loss after the
    last window: LOST WITHOUT FAULT);
(e) a msg_id acknowledged at two positions, or held at two positions of the final master's log, is a
    duplicate (``Verdict.duplicates``), marked "after a failed attempt" when a ``fail`` preceded it;
(f) order per partition: of two msg_ids one producer had acknowledged one after the other in one partition, the
    final master never holds the later one at its acknowledged position before the earlier one at its
    (REORDERED; a producer sends one message at a time).

A fault whose effect outlasts its injection records ``window_s`` in its detail (an isolated ``async``
master acknowledges for up to ``replication.max_isolation_ms`` after its cut): its window then ends that long
after it instead of ``ack_slack``. ``check_offsets(tables, master, ends)`` judges the committed consumer offsets
read from every member once healed (each member's table the master's; none past the partition's end).

``History.dump(path)`` / ``History.load(path)`` round-trip a history through JSON; ``logs_to_json`` /
``logs_from_json`` do the same for logs, so a failing run can be judged again offline.
"""

import json
import math
import threading
from typing import NamedTuple, Optional

__all__ = ["History", "Ack", "Fail", "Delivery", "Fault", "Heal", "Verdict", "check", "check_offsets", "MODES",
           "logs_to_json", "logs_from_json", "position_text"]

MODES = ("sync", "async")
#: A history refuses events past this many (a runaway workload fails loudly instead of eating memory).
MAX_EVENTS = 2_000_000
#: Acknowledgements recorded up to this long after a fault's time still belong to its window.
ACK_SLACK_S = 0.2
#: Per violation, at most this many messages are spelled out (then "... and N more").
MAX_LISTED = 20
JSON_VERSION = 1


class Ack(NamedTuple):
    producer: str
    topic: str
    partition: int
    offset: int
    msg_id: str
    t: float


class Fail(NamedTuple):
    producer: str
    msg_id: str
    t: float
    reason: str


class Delivery(NamedTuple):
    consumer: str
    topic: str
    partition: int
    offset: int
    msg_id: str
    t: float


class Fault(NamedTuple):
    kind: str
    t: float
    lag_messages: Optional[int]
    lag_t: float
    target: Optional[str]
    detail: dict


class Heal(NamedTuple):
    t: float


_TYPES = {"ack": Ack, "fail": Fail, "deliver": Delivery, "fault": Fault, "heal": Heal}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def position_text(pos):
    """``topic-partition@offset``."""
    return "%s-%d@%d" % pos


def _text(value, what):
    if not isinstance(value, str) or not value:
        raise ValueError("%s must be a non-empty string, got %r" % (what, value))
    return value


def _count(value, what):
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError("%s must be an int >= 0, got %r" % (what, value))
    return value


def _time(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError("%s must be a finite number of seconds, got %r" % (what, value))
    return float(value)


def _position(event, topic, partition, offset):
    return (_text(topic, event + ": topic"), _count(partition, event + ": partition"),
            _count(offset, event + ": offset"))


class History:
    """Events of one run, in the order recorded; thread-safe (producers and consumers record concurrently)."""

    def __init__(self, max_events=MAX_EVENTS):
        self.max_events = _count(max_events, "max_events")
        self._events = []
        self._lock = threading.Lock()

    def _add(self, event):
        with self._lock:
            if len(self._events) >= self.max_events:
                raise OverflowError("history full: %d events (max_events)" % self.max_events)
            self._events.append(event)
        return event

    def ack(self, producer, topic, partition, offset, msg_id, t):
        topic, partition, offset = _position("ack", topic, partition, offset)
        return self._add(Ack(_text(producer, "ack: producer"), topic, partition, offset,
                             _text(msg_id, "ack: msg_id"), _time(t, "ack: t")))

    def fail(self, producer, msg_id, t, reason):
        return self._add(Fail(_text(producer, "fail: producer"), _text(msg_id, "fail: msg_id"), _time(t, "fail: t"),
                              _text(reason, "fail: reason")))

    def deliver(self, consumer, topic, partition, offset, msg_id, t):
        topic, partition, offset = _position("deliver", topic, partition, offset)
        return self._add(Delivery(_text(consumer, "deliver: consumer"), topic, partition, offset,
                                  _text(msg_id, "deliver: msg_id"), _time(t, "deliver: t")))

    def fault(self, kind, t, lag_messages=None, lag_t=None, target=None, **detail):
        """A fault at ``t``; ``lag_messages``: the lag read just before it (at ``lag_t``, default ``t``),
        None when not read (then it bounds nothing: only messages acknowledged after ``lag_t`` may be lost)."""
        t = _time(t, "fault: t")
        lag_t = t if lag_t is None else _time(lag_t, "fault: lag_t")
        if lag_t > t:
            raise ValueError("fault: lag_t %r is after the fault's time %r: the lag is read before" % (lag_t, t))
        if lag_messages is not None:
            _count(lag_messages, "fault: lag_messages")
        if target is not None:
            _text(target, "fault: target")
        try:
            detail = json.loads(json.dumps(detail))
        except (TypeError, ValueError) as exc:
            raise ValueError("fault: detail must be JSON values: %s" % exc) from None
        return self._add(Fault(_text(kind, "fault: kind"), t, lag_messages, lag_t, target, detail))

    def heal(self, t):
        return self._add(Heal(_time(t, "heal: t")))

    # -- reading ------------------------------------------------------------------------------

    def events(self, kind=None):
        """A snapshot of the events, all or of one class (``Ack``, ``Fail``, ``Delivery``, ``Fault``, ``Heal``)."""
        with self._lock:
            events = list(self._events)
        return events if kind is None else [e for e in events if isinstance(e, kind)]

    def __len__(self):
        with self._lock:
            return len(self._events)

    def acked_ids(self):
        return {e.msg_id for e in self.events(Ack)}

    def delivered_ids(self):
        return {e.msg_id for e in self.events(Delivery)}

    # -- JSON ---------------------------------------------------------------------------------

    def to_json(self):
        rows = []
        for e in self.events():
            row = {"event": _NAMES[type(e)]}
            row.update(e._asdict())
            rows.append(row)
        return json.dumps({"version": JSON_VERSION, "events": rows}, indent=None, separators=(",", ":"))

    @classmethod
    def from_json(cls, text, max_events=MAX_EVENTS):
        """The history ``to_json`` wrote; ValueError naming the event that is malformed."""
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ValueError("history JSON: %s" % exc) from None
        if not isinstance(doc, dict) or doc.get("version") != JSON_VERSION or not isinstance(doc.get("events"), list):
            raise ValueError("history JSON: expected {\"version\": %d, \"events\": [...]}" % JSON_VERSION)
        h = cls(max_events)
        for i, row in enumerate(doc["events"]):
            if not isinstance(row, dict) or row.get("event") not in _TYPES:
                raise ValueError("history JSON: event #%d has no known \"event\" (%s): %r"
                                 % (i, "/".join(_TYPES), row))
            fields = dict(row)
            name = fields.pop("event")
            expected = set(_TYPES[name]._fields)
            if set(fields) != expected:
                raise ValueError("history JSON: event #%d (%s) has fields %s, expected %s"
                                 % (i, name, sorted(fields), sorted(expected)))
            detail = fields.pop("detail", {})
            if not isinstance(detail, dict) or set(detail) & set(fields):
                raise ValueError("history JSON: event #%d (fault): detail must be an object whose keys are not "
                                 "the fault's fields, got %r" % (i, detail))
            try:
                getattr(h, name)(**fields, **detail)
            except ValueError as exc:
                raise ValueError("history JSON: event #%d: %s" % (i, exc)) from None
        return h

    def dump(self, path):
        with open(path, "w") as f:
            f.write(self.to_json())
        return path

    @classmethod
    def load(cls, path):
        with open(path) as f:
            return cls.from_json(f.read())


def logs_to_json(logs):
    """``{broker: [[topic, partition, offset, msg_id], ...]}`` as JSON text (sorted by position)."""
    logs = _check_logs(logs)
    return json.dumps({b: [list(pos) + [m] for pos, m in sorted(log.items())] for b, log in logs.items()})


def logs_from_json(text):
    try:
        doc = json.loads(text)
        logs = {b: {(row[0], row[1], row[2]): row[3] for row in rows} for b, rows in doc.items()}
    except (ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise ValueError("logs JSON: expected {broker: [[topic, partition, offset, msg_id], ...]}: %s" % exc) from None
    return _check_logs(logs)


def _check_logs(logs):
    if not isinstance(logs, dict) or not logs:
        raise ValueError("logs must be a non-empty {broker_name: {(topic, partition, offset): msg_id}}, got %r"
                         % (type(logs).__name__,))
    for broker, log in logs.items():
        _text(broker, "logs: broker name")
        if not isinstance(log, dict):
            raise ValueError("logs[%r] must be a dict {(topic, partition, offset): msg_id}" % broker)
        for pos, msg_id in log.items():
            if not isinstance(pos, tuple) or len(pos) != 3:
                raise ValueError("logs[%r]: key %r is not (topic, partition, offset)" % (broker, pos))
            _position("logs[%r]" % broker, *pos)
            _text(msg_id, "logs[%r][%s]: msg_id" % (broker, position_text(pos)))
    return logs


class Verdict(list):
    """The violations (strings; empty: the run passed), with ``duplicates`` (strings), ``lost`` ({msg_id: ack})
    and ``faults`` (one line per fault: its window, losses and bound); ``summary()`` tells all of it."""

    def __init__(self, violations, duplicates, lost, faults, counts, header):
        super().__init__(violations)
        self.duplicates = duplicates
        self.lost = lost
        self.faults = faults
        self.counts = counts
        self.header = header

    def summary(self, limit=MAX_LISTED):
        lines = [self.header, "counts: " + ", ".join("%s %d" % kv for kv in self.counts.items())]
        lines += ["fault " + f for f in self.faults]
        lines.append("%d duplicate(s) (allowed)%s" % (len(self.duplicates), ":" if self.duplicates else ""))
        lines += ["  " + d for d in self.duplicates[:limit]]
        lines.append("%d violation(s)%s" % (len(self), ":" if self else ""))
        lines += ["  " + v for v in self[:limit]]
        if len(self) > limit:
            lines.append("  ... and %d more" % (len(self) - limit))
        return "\n".join(lines)


class _Run:
    """The indexes ``check`` works from, and the wording of its messages."""

    def __init__(self, history, logs, master):
        self.events = history.events()
        self.logs, self.master = logs, master
        self.final = logs[master]
        self.t0 = min((e.t for e in self.events), default=0.0)
        self.acks, self.fails = {}, {}
        for e in self.events:
            if isinstance(e, Ack):
                self.acks.setdefault(e.msg_id, []).append(e)
            elif isinstance(e, Fail):
                self.fails.setdefault(e.msg_id, []).append(e)
        self.deliveries = [e for e in self.events if isinstance(e, Delivery)]
        self.delivered = {e.msg_id for e in self.deliveries}
        self.faults = sorted((e for e in self.events if isinstance(e, Fault)), key=lambda f: f.t)
        self.where = {}  # msg_id -> positions in the final master's log
        for pos, msg_id in self.final.items():
            self.where.setdefault(msg_id, []).append(pos)
        self.ends = {}  # (topic, partition) -> the final master's next offset
        for topic, part, offset in self.final:
            self.ends[(topic, part)] = max(self.ends.get((topic, part), 0), offset + 1)

    def when(self, t):
        return "t+%.3fs" % (t - self.t0)

    def ack_text(self, a):
        return "acknowledged to %s at %s %s" % (a.producer, position_text(a[1:4]), self.when(a.t))

    def on_brokers(self, msg_id):
        """Where each broker holds ``msg_id``: 'm at t-0@5; s: nowhere'."""
        parts = []
        for broker in sorted(self.logs):
            found = sorted(pos for pos, m in self.logs[broker].items() if m == msg_id)
            parts.append("%s %s" % (broker, "at " + ", ".join(map(position_text, found)) if found else "nowhere"))
        return "; ".join(parts)

    def at_position(self, pos):
        """What the final master holds at ``pos``, in words."""
        held = self.final.get(pos)
        if held is not None:
            return "%s holds %s there" % (self.master, held)
        return "%s's log of %s-%d ends at offset %d" % (self.master, pos[0], pos[1], self.ends.get(pos[:2], 0))

    def listed(self, items, fmt):
        text = "; ".join(fmt(x) for x in items[:MAX_LISTED])
        return text + ("; ... and %d more" % (len(items) - MAX_LISTED) if len(items) > MAX_LISTED else "")


def check(history, logs, mode, master=None, ack_slack=ACK_SLACK_S):
    """Judge ``history`` against the brokers' ``logs`` read once healed; ``master``: the final master's name in
    ``logs`` (may be omitted when ``logs`` has one broker). Returns a ``Verdict`` (empty: no violation)."""
    if mode not in MODES:
        raise ValueError("mode must be one of %s, got %r" % ("/".join(MODES), mode))
    logs = _check_logs(logs)
    if master is None:
        if len(logs) != 1:
            raise ValueError("give master= (the final master): logs hold %s" % ", ".join(sorted(logs)))
        master = next(iter(logs))
    elif master not in logs:
        raise ValueError("master %r is not in logs (%s)" % (master, ", ".join(sorted(logs))))
    ack_slack = _time(ack_slack, "ack_slack")
    run = _Run(history, logs, master)
    violations = _divergent(run)
    lost = {m: acks[-1] for m, acks in run.acks.items() if m not in run.where}
    if mode == "sync":
        violations += _sync_losses(run, lost)
    violations += _undelivered(run) + _phantoms(run) + _reordered(run)
    fault_lines = []
    if mode == "async":
        violations += _async_losses(run, lost, ack_slack, fault_lines)
    else:
        fault_lines = ["#%d %s%s %s" % (i + 1, f.kind, " of " + f.target if f.target else "", run.when(f.t))
                       for i, f in enumerate(run.faults)]
    counts = {"acks": sum(map(len, run.acks.values())), "acked msg_ids": len(run.acks),
              "fails": sum(map(len, run.fails.values())), "deliveries": len(run.deliveries),
              "delivered msg_ids": len(run.delivered), "faults": len(run.faults),
              "heals": len([e for e in run.events if isinstance(e, Heal)]), "lost": len(lost)}
    header = "history check: mode %s, final master %s, brokers %s" % (mode, master, ", ".join(sorted(logs)))
    return Verdict(violations, _duplicates(run), lost, fault_lines, counts, header)


def _divergent(run):
    """(b) one position, two different msg_ids on two brokers."""
    out = []
    for pos in sorted(set().union(*run.logs.values())):
        held = {}
        for broker in sorted(run.logs):
            msg_id = run.logs[broker].get(pos)
            if msg_id is not None:
                held.setdefault(msg_id, []).append(broker)
        if len(held) > 1:
            words = []
            for msg_id, brokers in sorted(held.items(), key=lambda kv: kv[1]):
                acks = run.acks.get(msg_id, [])
                acked = run.listed(acks, run.ack_text) if acks else "never acknowledged"
                verb = "holds" if len(brokers) == 1 else "hold"
                words.append("%s %s %s (%s)" % (" and ".join(brokers), verb, msg_id, acked))
            out.append("DIVERGENT at %s: %s" % (position_text(pos), "; ".join(words)))
    return out


def _sync_losses(run, lost):
    """(a) in sync mode every acknowledged msg_id is on the final master, where it was acknowledged."""
    out = []
    for msg_id, ack in sorted(lost.items()):
        out.append("LOST (sync) %s: %s; %s; on the brokers: %s" % (
            msg_id, run.listed(run.acks[msg_id], run.ack_text), run.at_position(ack[1:4]), run.on_brokers(msg_id)))
    for msg_id, acks in sorted(run.acks.items()):
        if msg_id in lost:
            continue
        for a in acks:
            if run.final.get(a[1:4]) != msg_id:
                others = [b for b in run.acks.get(run.final.get(a[1:4]), []) if b[1:4] == a[1:4]]
                out.append("OVERWRITTEN (sync) %s: %s, but %s%s; %s holds it at %s" % (
                    msg_id, run.ack_text(a), run.at_position(a[1:4]),
                    " (" + run.listed(others, run.ack_text) + ")" if others else "",
                    run.master, ", ".join(map(position_text, sorted(run.where[msg_id])))))
    return out


def _undelivered(run):
    """(c) every acknowledged msg_id the final master holds reached the group at least once."""
    missing = sorted(m for m in run.acks if m in run.where and m not in run.delivered)
    last = max((d.t for d in run.deliveries), default=None)
    tail = "the group got %d deliveries of %d msg_ids%s" % (
        len(run.deliveries), len(run.delivered), ", the last at " + run.when(last) if last is not None else "")
    return ["UNDELIVERED %s: %s; %s holds it at %s; %s" % (
        m, run.listed(run.acks[m], run.ack_text), run.master, ", ".join(map(position_text, sorted(run.where[m]))),
        tail) for m in missing]


def _phantoms(run):
    """(c) nothing delivered or logged (in the history's topics) that no producer sent."""
    sent = set(run.acks) | set(run.fails)
    out = []
    for d in run.deliveries:
        if d.msg_id not in sent:
            out.append("PHANTOM delivery %s to %s from %s %s: no producer sent it" % (
                d.msg_id, d.consumer, position_text(d[1:4]), run.when(d.t)))
    topics = {a.topic for acks in run.acks.values() for a in acks} | {d.topic for d in run.deliveries}
    for broker in sorted(run.logs):
        for pos, msg_id in sorted(run.logs[broker].items()):
            if pos[0] in topics and msg_id not in sent:
                out.append("PHANTOM in %s's log: %s at %s: no producer sent it" % (broker, msg_id, position_text(pos)))
    return out


def _async_losses(run, lost, slack, lines):
    """(d) losses per fault window, each within the lag read before its fault."""
    out = []
    faults = run.faults
    # Window i ends ``slack`` after fault i, but never past the next fault's lag reading: acknowledgements after
    # that reading belong to the next fault (and are counted in its bound).
    spans = [max(slack, f.detail.get("window_s", 0.0)) for f in faults]
    ends = [max(f.t, min(f.t + spans[i], faults[i + 1].lag_t)) if i + 1 < len(faults) else f.t + spans[i]
            for i, f in enumerate(faults)]
    by_fault = [[] for _ in faults]
    orphans = []
    for ack in sorted(lost.values(), key=lambda a: a.t):
        i = next((i for i, end in enumerate(ends) if ack.t <= end), None)
        (orphans if i is None else by_fault[i]).append(ack)
    last_acks = [acks[-1] for acks in run.acks.values()]
    for i, f in enumerate(faults):
        after = sum(1 for a in last_acks if f.lag_t < a.t <= ends[i])
        bound = (f.lag_messages or 0) + after
        start = ends[i - 1] if i else None
        lag = "lag %s read at %s" % ("not" if f.lag_messages is None else f.lag_messages, run.when(f.lag_t))
        name = "#%d %s%s at %s" % (i + 1, f.kind, " of " + f.target if f.target else "", run.when(f.t))
        lines.append("%s: window %s..%s, %d lost, bound %d (%s + %d acknowledged after it)" % (
            name, run.when(start) if start is not None else "start", run.when(ends[i]), len(by_fault[i]), bound,
            lag, after))
        if len(by_fault[i]) > bound:
            out.append("OVER BOUND (async) fault %s: %d acknowledged msg_ids lost > bound %d (%s + %d acknowledged "
                       "after the reading); lost: %s" % (
                           name, len(by_fault[i]), bound, lag, after, run.listed(
                               by_fault[i], lambda a: "%s %s, %s; %s" % (a.msg_id, run.ack_text(a),
                                                                       run.at_position(a[1:4]),
                                                                       run.on_brokers(a.msg_id)))))
    for a in orphans:
        out.append("LOST WITHOUT FAULT (async) %s: %s, after the last fault; %s; on the brokers: %s" % (
            a.msg_id, run.ack_text(a), run.at_position(a[1:4]), run.on_brokers(a.msg_id)))
    return out


def _reordered(run):
    """(f) per producer and partition, two acknowledgements' positions, where the final master holds them, are in
    the order the producer was answered (a retry's other copies are duplicates, not this check's)."""
    out = []
    by_producer = {}
    for msg_id, acks in run.acks.items():
        for a in acks:
            if run.final.get(a[1:4]) == msg_id:
                by_producer.setdefault(a.producer, []).append(a)
    for _producer, acks in sorted(by_producer.items()):
        acks.sort(key=lambda a: a.t)
        latest = {}  # (topic, partition) -> the ack held at the highest position so far
        for a in acks:
            before = latest.get(a[1:3])
            if before is not None and a.offset < before.offset:
                out.append("REORDERED %s-%d: %s %s is held at %s, before %s (%s) held at %s" % (
                    a.topic, a.partition, a.msg_id, run.ack_text(a), position_text(a[1:4]), before.msg_id,
                    run.ack_text(before), position_text(before[1:4])))
            if before is None or a.offset > before.offset:
                latest[a[1:3]] = a
    return out


def check_branches(prepared, committed, recovered, stored, mode):
    """XA branches across a run's faults (issue 41 point 1), judged on the final master: ``prepared``: the keys
    answered XA_OK; ``committed``: those whose commit was answered OK; ``recovered``: the final master's RECOVER;
    ``stored``: ``{key: copies of the branch's message in its log}``. Returns the violations (empty: none):

    * BRANCH LOST: prepared, never committed, and not listed by RECOVER (its message not stored either);
    * COMMIT LOST (``sync``): committed, but its message is not stored; in ``async`` a commit lost within the lag
      leaves the branch prepared again (listed by RECOVER), which is allowed, its message not stored then;
    * BRANCH RESURFACED: listed by RECOVER while its message is stored (decided, yet offered again);
    * STORED TWICE: a branch's message stored more than once;
    * STORED UNCOMMITTED: a message of a branch never committed is stored;
    * UNKNOWN BRANCH: RECOVER lists a key that was never prepared."""
    if mode not in MODES:
        raise ValueError("mode must be one of %s, got %r" % ("/".join(MODES), mode))
    prepared, committed, recovered = set(prepared), set(committed), set(recovered)
    out = []
    if committed - prepared:
        raise ValueError("committed but never prepared: %s" % ", ".join(sorted(committed - prepared)))
    for key in sorted(prepared):
        copies = stored.get(key, 0)
        listed = key in recovered
        if copies > 1:
            out.append("STORED TWICE %s: its message is stored %d times" % (key, copies))
        if listed and copies:
            out.append("BRANCH RESURFACED %s: RECOVER lists it while its message is stored" % key)
        if key in committed:
            if not copies and not (mode == "async" and listed):
                out.append("COMMIT LOST (%s) %s: the commit was answered OK; its message is not stored%s"
                           % (mode, key, "" if not listed else " (RECOVER lists it prepared again)"))
        else:
            if copies:
                out.append("STORED UNCOMMITTED %s: never committed, its message is stored" % key)
            elif not listed:
                out.append("BRANCH LOST %s: answered XA_OK, never decided, not listed by RECOVER" % key)
    for key in sorted(recovered - prepared):
        out.append("UNKNOWN BRANCH %s: RECOVER lists a branch never prepared" % key)
    return out


def check_offsets(tables, master, ends=None):
    """Committed consumer offsets read from every member once healed: ``tables = {member: {(group, topic,
    partition): offset}}``, ``master``: the final master's name, ``ends``: ``{(topic, partition): next offset}``
    of its log (optional). Returns the violations (empty: they converged): a member whose table differs from the
    master's (OFFSETS DIFFER, each differing key named) and a committed offset past its partition's end on the
    master (OFFSET PAST END)."""
    if master not in tables:
        raise ValueError("master %r is not in tables (%s)" % (master, ", ".join(sorted(tables))))
    out = []
    truth = tables[master]
    for member in sorted(tables):
        if member == master:
            continue
        table = tables[member]
        keys = sorted(set(truth) | set(table))
        differ = [k for k in keys if truth.get(k) != table.get(k)]
        if differ:
            out.append("OFFSETS DIFFER on %s from the master %s: %s" % (member, master, "; ".join(
                "%s %s-%d: %s has %s, %s has %s" % (k[0], k[1], k[2], master, truth.get(k, "none"), member,
                                                    table.get(k, "none")) for k in differ[:MAX_LISTED])
                + ("; ... and %d more" % (len(differ) - MAX_LISTED) if len(differ) > MAX_LISTED else "")))
    for (group, topic, partition), offset in sorted(truth.items()):
        end = (ends or {}).get((topic, partition))
        if end is not None and offset > end:
            out.append("OFFSET PAST END on %s: group %s committed %s-%d at %d, the log ends at %d" % (
                master, group, topic, partition, offset, end))
    return out


def _duplicates(run):
    """(e) one msg_id at two positions: acknowledged twice, or held twice by the final master."""
    out = []
    for msg_id, acks in sorted(run.acks.items()):
        positions = sorted({a[1:4] for a in acks})
        if len(positions) > 1:
            fails = [f for f in run.fails.get(msg_id, []) if f.t <= acks[-1].t]
            why = ("after a failed attempt at %s (%s)" % (run.when(fails[0].t), fails[0].reason) if fails
                   else "no failed attempt recorded before it")
            out.append("DUPLICATE ack %s: %s; %s" % (msg_id, run.listed(acks, run.ack_text), why))
    for msg_id, positions in sorted(run.where.items()):
        if len(positions) > 1:
            acked = {a[1:4] for a in run.acks.get(msg_id, [])}
            out.append("DUPLICATE in %s's log %s: at %s (acknowledged at %s)" % (
                run.master, msg_id, ", ".join(map(position_text, sorted(positions))),
                ", ".join(map(position_text, sorted(acked))) or "no position"))
    return out
