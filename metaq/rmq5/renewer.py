"""Auto-renew: a push consumer's messages kept invisible while its client is alive (docs/rocketmq5.md "Push
consumers: auto-renew").

The official clients' push consumers receive with ``auto_renew=true`` and no invisible duration, cache what they get
and acknowledge it when their handler is done, which may be long after. As RocketMQ's proxy does, the broker renews
each message such a receive delivered before its invisible deadline comes within ``ahead_ms`` (half the
invisible duration, at most ``RENEW_AHEAD_MS``): it is made invisible for the invisible duration again, by the POP
service (``PopService.renew``: one ``r`` journal record per (group, topic) and round, at most ``RENEW_RECORD_ENTRIES``
entries a record), so the handle the client holds still acks it, on this broker or on a new master after a
failover. Renewal of a message ends when it is acknowledged, changed (a nack), dead-lettered or delivered again (its
flight no longer is the one renewed), ``limits.GRPC_RENEW_MAX_MS`` after its delivery (it then reappears at its
deadline), or when its client ends: NotifyClientTermination, its last open Telemetry stream closed, or nothing heard
from it for ``limits.GRPC_CLIENT_IDLE_MS``; its messages are then visible again ``limits.GRPC_RELEASE_INVISIBLE_MS``
later (``PopService.release``). Bounded: ``limits.GRPC_MAX_RENEWED`` messages at once, ``limits.
GRPC_MAX_RENEWED_PER_CLIENT`` per client, ``limits.GRPC_MAX_RENEWED_PER_USER`` per user (with authentication on:
one user's many clients never take the others' room); past any a message is delivered but not renewed, logged once
until renewal is possible again.

``Renewals`` is the bookkeeping (pure, the time passed in): what is held by whom, what is due. ``Renewer`` runs it: a
round every ``interval_s`` (``RENEW_INTERVAL_S``, or a quarter of the invisible duration) on the event loop, writing
through the POP service, which asks the put path's write decision first (a slave or a deposed master writes nothing;
the round is skipped). A round does no blocking syscall: journal appends go to the mapped log as every POP change's
do, flushed by the flusher. What is held lives in memory: after a restart or a failover the messages' journaled
deadlines and handles hold (the delivery's handle still acks on the new master), and they are delivered again at
their deadlines unless acknowledged; renewal goes on for messages delivered since.
"""

import logging

import gevent

from metaq import errors
from metaq.rmq5 import limits as rmq5_limits
from metaq.pop.records import parse_handles
from metaq.clock import now_ms

log = logging.getLogger(__name__)

__all__ = ["Renewals", "Renewer", "RENEW_INTERVAL_S", "RENEW_AHEAD_MS"]

#: Seconds between two rounds of renewal (a quarter of the invisible duration, when smaller).
RENEW_INTERVAL_S = 1.0
#: A message is renewed once its deadline is this near (or half the invisible duration, when smaller: two rounds
#: at least before its deadline).
RENEW_AHEAD_MS = 10_000
#: Entries of one renewal record (a journal record stays far below ``pop.records.MAX_RECORD_BYTES``).
RENEW_RECORD_ENTRIES = 1000


class Held:
    """One message a client holds: its delivery ``attempt``, the ``deadline`` the broker last gave it, and when it
    was delivered (``since``)."""

    __slots__ = ("client", "attempt", "deadline", "since")

    def __init__(self, client, attempt, deadline, since):
        self.client, self.attempt, self.deadline, self.since = client, attempt, deadline, since


class Renewals:
    """What is renewed, for whom (pure; see the module doc). Keys are ``(group, topic, partition, offset)``; a client
    is whatever key the caller names it by (the gRPC port's ``calls.ClientKey``: its user and client id)."""

    def __init__(self, max_total=rmq5_limits.GRPC_MAX_RENEWED, max_per_client=rmq5_limits.GRPC_MAX_RENEWED_PER_CLIENT,
                 max_age_ms=rmq5_limits.GRPC_RENEW_MAX_MS, idle_ms=rmq5_limits.GRPC_CLIENT_IDLE_MS,
                 max_per_user=rmq5_limits.GRPC_MAX_RENEWED_PER_USER):
        self.max_total, self.max_per_client, self.max_per_user = max_total, max_per_client, max_per_user
        self.by_user = {}  # user -> messages its clients hold (clients with a user only: authentication on)
        self.max_age_ms, self.idle_ms = max_age_ms, idle_ms
        self.held = {}  # key -> Held
        self.by_client = {}  # client -> set of keys
        self.heard_ms = {}  # client -> when it was last heard from (clients holding something, or streaming)
        self.streams = {}  # client -> its open Telemetry calls
        self.counts = {"held": 0, "not_renewed": 0, "aged_out": 0, "released": 0}

    def __len__(self):
        return len(self.held)

    def of_client(self, client):
        return len(self.by_client.get(client, ()))

    def hold(self, client, group, topic, delivered, now):
        """``delivered`` ``[(partition, offset, attempt, deadline)]``, just handed to ``client`` by an ``auto_renew``
        receive: held for renewal within the bounds; returns how many were not."""
        refused = 0
        keys = self.by_client.setdefault(client, set())
        self.heard_ms[client] = now
        user = _user_of(client)
        for p, o, attempt, deadline in delivered:
            key = (group, topic, p, o)
            self._drop(key)  # an earlier delivery of the same message (another client's, expired)
            if (len(self.held) >= self.max_total or len(keys) >= self.max_per_client
                    or (user and self.by_user.get(user, 0) >= self.max_per_user)):
                refused += 1
                continue
            self.held[key] = Held(client, attempt, deadline, now)
            keys.add(key)
            self._count(user, 1)
            self.counts["held"] += 1
        self.counts["not_renewed"] += refused
        if not keys:
            self._forget_client(client)
        return refused

    def release(self, group, topic, partition, offset):
        """That message acknowledged, changed or dead-lettered by its client: no longer renewed."""
        self._drop((group, topic, partition, offset))

    def heard(self, client, now):
        """``client`` spoke (a Heartbeat, a receive, an ack ...)."""
        if client in self.by_client or client in self.streams:
            self.heard_ms[client] = now

    def stream_seen(self, client, call, now):
        self.streams.setdefault(client, set()).add(call)
        self.heard_ms[client] = now

    def stream_closed(self, client, call):
        """``call`` ended; True when it was ``client``'s last open Telemetry stream (the client is gone)."""
        calls = self.streams.get(client)
        if not calls or call not in calls:
            return False
        calls.discard(call)
        if calls:
            return False
        del self.streams[client]
        if client not in self.by_client:
            self.heard_ms.pop(client, None)
        return True

    def idle(self, now):
        """The clients holding messages not heard from for ``idle_ms``."""
        return [c for c in self.by_client if now - self.heard_ms.get(c, now) >= self.idle_ms]

    def end(self, client):
        """``client`` ended: ``{(group, topic): [(partition, offset, attempt, deadline)]}`` of what it held, no longer
        renewed (the caller makes them visible soon)."""
        out = {}
        for key in self.by_client.get(client, ()):
            h = self.held.pop(key)
            self._count(_user_of(client), -1)
            out.setdefault(key[:2], []).append((key[2], key[3], h.attempt, h.deadline))
        self.counts["released"] += sum(len(e) for e in out.values())
        self._forget_client(client)
        self.streams.pop(client, None)
        return out

    def due(self, now, ahead_ms):
        """``{(group, topic): [(partition, offset, attempt, deadline)]}`` of the messages whose deadline is within
        ``ahead_ms``, sorted; a message held ``max_age_ms`` since its delivery is dropped instead (it reappears at
        its deadline)."""
        out = {}
        for key, h in list(self.held.items()):
            if h.deadline - now > ahead_ms:
                continue
            if now - h.since >= self.max_age_ms:
                self._drop(key)
                self.counts["aged_out"] += 1
                continue
            out.setdefault(key[:2], []).append((key[2], key[3], h.attempt, h.deadline))
        for entries in out.values():
            entries.sort()
        return out

    def renewed(self, group, topic, asked, kept, deadline):
        """The POP service renewed ``kept`` of ``asked`` until ``deadline``: those held on; the others are no longer
        the delivery that was held (acknowledged, changed, delivered again) and are dropped; an entry held anew since
        (another delivery of the message) is left as it is."""
        kept = {(p, o) for p, o, _a, _d in kept}
        for p, o, attempt, was in asked:
            key = (group, topic, p, o)
            h = self.held.get(key)
            if h is None or (h.attempt, h.deadline) != (attempt, was):  # held anew since it was asked
                continue
            if (p, o) in kept:
                h.deadline = deadline
            else:
                self._drop(key)

    def _drop(self, key):
        h = self.held.pop(key, None)
        if h is None:
            return
        self._count(_user_of(h.client), -1)
        keys = self.by_client.get(h.client)
        if keys is not None:
            keys.discard(key)
            if not keys and h.client not in self.streams:
                self._forget_client(h.client)

    def of_user(self, user):
        return self.by_user.get(user, 0)

    def _count(self, user, delta):
        if user:
            n = self.by_user.get(user, 0) + delta
            if n > 0:
                self.by_user[user] = n
            else:
                self.by_user.pop(user, None)

    def _forget_client(self, client):
        self.by_client.pop(client, None)
        if client not in self.streams:
            self.heard_ms.pop(client, None)


def _user_of(client):
    """The user a client key names (``calls.ClientKey.user``; "" without authentication or for a bare key)."""
    return getattr(client, "user", "") or ""


class Renewer:
    """Runs ``Renewals`` against the POP service ``pop`` (its ``renew`` and ``release``), each message made invisible
    for ``invisible_ms`` (the gRPC port's ``renew_invisible_ms``) a renewal. What the RPCs tell it: ``delivered``,
    ``settled``, ``heard``, ``terminated``, ``stream_seen`` and ``stream_closed``, each naming its client by
    ``calls.client_of`` (a ``ClientKey``: its user and its client id; one with an empty id is nobody's and ignored),
    so one user's NotifyClientTermination or closed stream never ends another user's client of the same id."""

    def __init__(self, pop, invisible_ms, renewals=None):
        self.pop, self.invisible_ms = pop, invisible_ms
        self.renewals = renewals if renewals is not None else Renewals()
        self.ahead_ms = min(RENEW_AHEAD_MS, invisible_ms // 2)
        self.interval_s = min(RENEW_INTERVAL_S, invisible_ms / 4000.0)
        self.ended = {}  # clients that ended (as keys, in order), released at the next round
        self.counts = {"renewed": 0, "rounds_refused": 0}
        self.full = False  # a receive's messages were not all held for the bounds, and none held whole since
        self._refused = None  # why the last round wrote nothing (logged once)
        self._task = None

    def start(self):
        if self._task is None:
            self._task = gevent.spawn(self._loop)

    def stop(self):
        if self._task is not None:
            self._task.kill(block=False)
            self._task = None

    # -- what the RPCs tell --------------------------------------------------------------------------------------

    def delivered(self, client, group, topic, received):
        """``received`` (``PopService``'s ``Received``) handed to ``client`` by an ``auto_renew`` receive."""
        if not client.id:
            return
        refused = self.renewals.hold(client, group, topic,
                                     [(r.partition, r.offset, r.attempt, r.deadline_ms) for r in received], now_ms())
        if not refused:
            self.full = False
        elif not self.full:  # one line until a receive is held whole again, not one a message
            self.full = True
            log.warning("grpc: auto-renew holds %d messages (%d of client %s; limits.GRPC_MAX_RENEWED %d, "
                        "GRPC_MAX_RENEWED_PER_CLIENT %d, GRPC_MAX_RENEWED_PER_USER %d): messages delivered now are "
                        "not renewed (delivered again after %d ms unless acknowledged) until it holds fewer",
                        len(self.renewals), self.renewals.of_client(client), str(client)[:128], self.renewals.max_total,
                        self.renewals.max_per_client, self.renewals.max_per_user, self.invisible_ms)

    def settled(self, group, topic, handles):
        """The client acknowledged, changed or dead-lettered the messages of ``handles``: renewal ends (nothing to
        look up while nothing is renewed)."""
        if not self.renewals:
            return
        for parsed in parse_handles(list(handles)):
            if parsed is not None:  # not a handle: nothing it could name is renewed
                self.renewals.release(group, topic, parsed[0], parsed[1])

    def heard(self, client):
        if client.id:
            self.renewals.heard(client, now_ms())

    def terminated(self, client):
        """NotifyClientTermination: its messages are released at the next round."""
        if client.id and self.renewals.of_client(client):
            self.ended[client] = None

    def stream_seen(self, client, call):
        if client.id:
            self.renewals.stream_seen(client, call, now_ms())

    def stream_closed(self, client, call):
        if client.id and self.renewals.stream_closed(client, call) and self.renewals.of_client(client):
            self.ended[client] = None

    # -- a round -------------------------------------------------------------------------------------------------

    def _loop(self):
        while True:
            gevent.sleep(self.interval_s)
            try:
                self.round(now_ms())
            except Exception:  # noqa: BLE001 - a round's bug must not end renewal for good
                log.exception("grpc: an auto-renew round failed; the next round tries again")

    def round(self, now):
        """Release what ended clients held, then renew what is due. A write refused (not the master, deposed, a full
        disk) ends the round: it is logged once, and the next round tries again."""
        r = self.renewals
        ended, self.ended = [(c, r.end(c)) for c in dict.fromkeys(list(self.ended) + r.idle(now))], {}
        try:  # what an ended client held is no longer renewed, whether or not it can be released now
            for client, held in ended:
                for (group, topic), entries in held.items():
                    for chunk in _chunks(entries):
                        self.pop.release(group, topic, chunk, now + rmq5_limits.GRPC_RELEASE_INVISIBLE_MS)
                log.info("grpc: client %s ended: the messages it held are visible again in %d ms", str(client)[:128],
                         rmq5_limits.GRPC_RELEASE_INVISIBLE_MS)
            deadline = now + self.invisible_ms
            for (group, topic), entries in r.due(now, self.ahead_ms).items():
                for chunk in _chunks(entries):
                    kept = self.pop.renew(group, topic, chunk, deadline)
                    r.renewed(group, topic, chunk, kept, deadline)
                    self.counts["renewed"] += len(kept)
                    gevent.sleep(0)  # other greenlets served between two records
        except errors.MetaqError as exc:
            self.counts["rounds_refused"] += 1
            if self._refused is not type(exc):
                log.warning("grpc: auto-renew writes nothing now: %s", exc)
            self._refused = type(exc)
            return
        self._refused = None


def _chunks(entries):
    for i in range(0, len(entries), RENEW_RECORD_ENTRIES):
        yield entries[i:i + RENEW_RECORD_ENTRIES]
