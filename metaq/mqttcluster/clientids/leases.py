"""The leases of a client id's homes (service: its renewals are posted on the link open to each home, else sent by a
renewer greenlet; ``clientids.service`` module doc, "Leases"; docs/architecture.md "MQTT cluster: client ids").

A broker keeps a connection of an id whose home is another broker only while it holds a lease of that home: a call
to it answered, valid for the lease from when the call was sent (``renewed``); a ``lease`` call goes to each home
every quarter of ``mqtt.cluster_id_lease_s`` (``renew``), posted so that no greenlet waits its turn on the way
(``calls`` module doc, "Lease renewals never queue"). A lease counts as out one look (a quarter of it) and
LEASE_MARGIN_S before its end (``lapsed``). As a home, a broker counts a holder's lease as surely run out (``gone``)
a lease and a quarter after the last call heard from it (``heard``), and a margin.
"""

import functools
import time

import gevent

from metaq.mqttcluster.clientids.calls import PeerUnreachable

__all__ = ["LEASE_MARGIN_S", "Leases"]

#: Seconds a home adds to a holder's lease before it takes the holder's ids elsewhere (its loop's turn, a clock's rate).
LEASE_MARGIN_S = 0.25


class Leases:
    """See the module doc. ``broker_id``: this broker's (it holds no lease of itself); ``lease_s``: the lease."""

    def __init__(self, broker_id, lease_s):
        self.broker_id = broker_id
        self.lease_s = lease_s
        #: home broker id -> until when (monotonic) this broker may keep connections of the ids homed there
        self.until = {}
        #: broker id -> when (monotonic) a call from it last came: its lease of this home began by then
        self.heard_at = {}
        self._renewing = {}  # broker id -> the greenlet renewing this broker's lease of it
        self._posted = {}  # broker id -> when the renewal posted to it, unanswered yet, was sent
        self.started = time.monotonic()

    def heard(self, caller):
        """A call from ``caller`` came now."""
        self.heard_at[caller] = time.monotonic()

    def renewed(self, home, sent):
        """A call sent to ``home`` at ``sent`` was answered: this broker's lease of it runs to ``sent`` + the lease."""
        self.until[home] = max(self.until.get(home, 0.0), sent + self.lease_s)

    def gone(self, holder):
        """When (monotonic) ``holder``'s lease of this home surely ran out and it closed its connections of the ids
        homed here: the lease from the last call heard from it (or this broker's start), one of its looks later,
        and a margin."""
        heard = self.heard_at.get(holder, self.started)
        return heard + self.lease_s * 1.25 + LEASE_MARGIN_S

    def renew(self, members, call, post=None):
        """A ``lease`` call to each home of ``members`` ({broker id: address}) none is in flight to: posted
        (``post(address, request, then, timeout_s)``, ``PeerClient.post``) when it can be, else sent by a renewer
        greenlet (``call(home, address, request, timeout_s)``, which opens the link); those of homes gone stop, their
        leases forgotten."""
        now = time.monotonic()
        for home, address in members.items():
            running = self._renewing.get(home)
            if home == self.broker_id or (running is not None and not running.dead):
                continue
            if self._posted.get(home, now - self.lease_s) > now - self.lease_s / 2:
                continue  # the one posted is in flight still
            self._posted[home] = now
            if post is None or not post(address, {"op": "lease"}, functools.partial(self._answered, home, now),
                                        self.lease_s / 2):
                del self._posted[home]
                self._renewing[home] = gevent.spawn(self._renew, call, home, address)
        for home in [h for h in self._renewing if h not in members]:
            self._renewing.pop(home).kill(block=False)
            self.until.pop(home, None)
        for home in [h for h in self._posted if h not in members]:
            del self._posted[home]
            self.until.pop(home, None)

    def _answered(self, home, sent, answer):
        """The renewal posted to ``home`` at ``sent`` answered (``answer``), or failed (None: the next look posts
        another). Nothing when it was forgotten since (the home left the members, or this broker did)."""
        if self._posted.get(home) != sent:
            return
        del self._posted[home]
        if answer is not None:
            self.renewed(home, sent)

    def _renew(self, call, home, address):
        try:
            call(home, address, {"op": "lease"}, self.lease_s / 2)
        except PeerUnreachable:
            pass

    def lapsed(self, members):
        """The homes of ``members`` whose lease counts as out now (a home first seen gets a lease's time from now)."""
        now = time.monotonic()
        early = self.lease_s / 4 + LEASE_MARGIN_S
        return {home for home in members
                if home != self.broker_id and self.until.setdefault(home, now + self.lease_s) - early < now}

    def clear(self):
        """Not a member now: once it is again, each home gets a lease's time."""
        self.until.clear()
        self._posted.clear()

    def stop(self):
        for g in list(self._renewing.values()):
            g.kill(block=False)
