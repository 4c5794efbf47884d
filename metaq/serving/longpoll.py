"""Long polling: gets parked on a partition until an append makes data visible.

Woken by the store's visibility changes (``notify``), never by a busy loop; every
wait ends at its deadline. Each parked wait has an Event of its own, so a wait
that ends early (its connection closed) leaves in constant time however many
others wait on the same partition. ``admit``/``leave`` count the long polls
parked on the whole broker against ``max_parked`` (``limits.MAX_PARKED_GETS``) and, for a caller that names its
user, the user's own against its ``parked_gets`` quota (``quota``). A wait given ``cancel`` (an Event its caller's
request sets when it is gone: a gRPC call reset, its connection ended) returns as soon as it is set.
``notify(..., settle=True)`` is the put path's one wake (``BrokerWrites.visible``): the woken gets answer before the
write's own ack goes out.

A wake reaches only the waits registered when ``notify`` runs. A reader that read, then yielded before its wait
began (a reply budget's reservation, a cold page brought in off the loop, a greenlet spawned to wait that starts a
turn later) would miss the wake of an append made visible meanwhile and wait its whole timeout with the data there.
So every long poll keeps what it saw: ``ends(end, keys)`` of the partitions its read reads, taken with the read (no
yield between), passed to ``wait``/``wait_any`` as ``seen`` with ``end`` (the store's ``max_offset``); when one
moved since, the wait returns at once and the caller reads again. No busy loop: each early return needs an append
after the last read.

A reader of partitions that may not exist yet (the MQTT cluster's follow of a peer's filters, which may match a
topic written for the first time) waits on ``NEW_PARTITION`` too: the first wake after the store made a partition
or dropped a topic's (``MessageStore.partitions_made``, which tells ``partitions_made`` here as it moves) names it, so
such a reader learns of a new topic at its first write, and of a topic an admin created or deleted at once
(``partitions_changed``, the topic admin's callback).
"""

import gevent
from gevent.event import Event

from metaq import errors, limits

#: ``visible_end`` of a partition whose end cannot be told (an unknown topic: the caller's read says why).
UNTOLD = -1
#: The key a wait names to be woken at the first wake after a partition appeared in the store (no topic has an
#: empty name).
NEW_PARTITION = ("", -1)


class PartitionWaiters:
    """The waits parked per (topic, partition); a wake ends every wait of the partitions it names."""

    def __init__(self, max_parked=limits.MAX_PARKED_GETS, quota=None):
        """``quota(user, parked)``: raises QuotaExceeded when ``user``, with ``parked`` long polls parked, may not
        park one more (the guard's ``parked_gets`` quota); None: no user is counted. ``NEW_PARTITION`` is woken once
        the store has told ``partitions_made`` (``MessageStore.on_partitions_made``)."""
        self._waits = {}  # key -> set of Events, one per parked wait
        self.max_parked = max_parked
        self.quota = quota
        self.parked = 0  # long polls admitted and not yet left
        self.by_user = {}  # user -> its long polls admitted and not yet left (those admitted with a user)
        self.closed = False  # the broker is stopping: parked waits answer now
        self._made = False  # the store made a partition or dropped a topic's since the last wake (``partitions_made``)

    def partitions_made(self):
        """The store made a partition or dropped a topic's (its ``partitions_made`` moved): the next wake names
        ``NEW_PARTITION`` too. Told by the store as it happens, so a wake asks nothing."""
        self._made = True

    def admit(self, user=None):
        """Count one more long poll (of ``user``, when named) until its ``leave(user)``; False (not counted) when
        ``max_parked`` are parked; QuotaExceeded (not counted) when ``user`` holds its ``parked_gets`` quota."""
        if self.parked >= self.max_parked:
            return False
        if user:
            held = self.by_user.get(user, 0)
            if self.quota is not None:
                self.quota(user, held)
            self.by_user[user] = held + 1
        self.parked += 1
        return True

    def leave(self, user=None):
        self.parked -= 1
        if user:
            left = self.by_user.get(user, 0) - 1
            if left > 0:
                self.by_user[user] = left
            else:
                self.by_user.pop(user, None)

    def close(self):
        """Wake every waiter for good: the broker is stopping."""
        self.closed = True
        self.notify_all()

    @staticmethod
    def visible_end(end, key):
        """``end(*key)``: where the partition's next visible record goes (``end`` is the store's ``max_offset``);
        ``UNTOLD`` when it cannot be told. A long poll takes it with the read that decides it waits (see the module
        doc)."""
        try:
            return end(*key)
        except errors.MetaqError:
            return UNTOLD

    @classmethod
    def ends(cls, end, keys):
        """``{key: visible_end(end, key)}`` of ``keys``: a long poll's ``seen``, taken with its read."""
        visible_end = cls.visible_end
        return {key: visible_end(end, key) for key in keys}

    @classmethod
    def moved(cls, seen, end):
        """True when a partition of ``seen`` (``{key: visible_end as of the caller's read}``) has another visible end
        now: an append since that read, whose wake came before the caller's wait began."""
        visible_end = cls.visible_end
        return any(visible_end(end, key) != at for key, at in seen.items())

    def wait(self, key, timeout, seen=None, end=None, cancel=None):
        """Block this greenlet until ``notify`` names ``key``, ``cancel`` (an Event) is set or ``timeout`` seconds
        pass. With ``end`` (the store's ``max_offset``): ``seen`` is ``ends(end, ...)`` of the partitions the
        caller's read reads (``key``'s, or a priority topic's levels), as of that read; when one moved since, returns
        True at once (the append's wake came before this wait)."""
        if end is not None and self.moved(seen, end):
            return True
        ev = Event()
        waits = self._waits.get(key)
        if waits is None:
            waits = self._waits[key] = set()
        waits.add(ev)
        try:
            return ev.wait(timeout) if cancel is None else _wait_or_cancel(ev, timeout, cancel)
        finally:
            waits.discard(ev)  # the set may already be out of the map (a notify took it): harmless
            if not waits and self._waits.get(key) is waits:
                del self._waits[key]

    def wait_any(self, keys, timeout, ev, seen=None, end=None, cancel=None):
        """Block this greenlet until ``notify`` names any of ``keys``, ``ev`` is set by its owner, or ``timeout``
        seconds pass (an MQTT connection's delivery: every partition its subscriptions read, and a new
        subscription or an acknowledgement that makes room; a POP receive). Not counted in ``admit``. With ``end``
        (the store's ``max_offset``): ``seen`` is ``{key: visible_end(end, key)}`` as of the caller's reads (of
        some of ``keys``), and when one moved since (``moved``), returns True at once. ``cancel``: as ``wait``'s."""
        if end is not None and self.moved(seen, end):
            return True
        held = []
        for key in keys:
            waits = self._waits.get(key)
            if waits is None:
                waits = self._waits[key] = set()
            waits.add(ev)
            held.append((key, waits))
        try:
            return _wait_or_cancel(ev, timeout, cancel)
        finally:
            for key, waits in held:
                waits.discard(ev)
                if not waits and self._waits.get(key) is waits:
                    del self._waits[key]

    def notify(self, keys, quiet=None, settle=False):
        """Wake every greenlet waiting on any of ``keys``; True when there was one. ``quiet``: ``{key: events}`` of
        waits that already have what was appended to ``key`` (an MQTT delivery that sent it from the publisher's
        turn): they go on waiting for the next append there, unwoken. ``settle``: the put path's one wake
        (``BrokerWrites.visible``): when a wait was woken, yield to the loop once, so the woken gets read and send
        their replies before the caller goes on (a put burst's ack, its next frames): a consumer's latency then
        holds no ack send nor the rest of the producer's burst. The caller must be free to yield (no lock held)."""
        waits = self._waits
        if not waits:
            return False
        if self._made:
            self._made = False
            keys = (*keys, NEW_PARTITION)
        woke = False
        for key in keys:
            evs = waits.get(key)
            if evs is None:
                continue
            stay = quiet.get(key) if quiet else None
            if not stay:
                del waits[key]
            elif evs <= stay:
                continue  # every wait there has it already: the map stays as it is
            else:
                kept = evs & stay
                if kept:
                    wake = evs - kept
                    evs.intersection_update(kept)  # the same set, kept in the map: a waiter's cleanup finds it there
                    evs = wake
                else:
                    del waits[key]
            for ev in evs:
                woke = True
                ev.set()
        if woke and settle:
            gevent.sleep(0)
        return woke

    def partitions_changed(self):
        """Wake the waits on ``NEW_PARTITION`` when the store's ``partitions_made`` moved since the last wake (a topic
        an admin created, altered or deleted: no append may follow to wake them); True when one was woken."""
        return self.notify(())

    def notify_all(self):
        waits, self._waits = self._waits, {}
        for evs in waits.values():
            for ev in evs:
                ev.set()

    def __len__(self):
        return len(self._waits)

    def keys(self):
        """The (topic, partition) keys that have waiters now."""
        return list(self._waits)


def _wait_or_cancel(ev, timeout, cancel):
    """``ev.wait(timeout)``, ended early when ``cancel`` (an Event, or None) is set; True when either was set."""
    if cancel is None:
        return ev.wait(timeout)
    if cancel.is_set():
        return True

    def wake(_cancel):
        ev.set()

    cancel.rawlink(wake)
    try:
        return ev.wait(timeout)
    finally:
        cancel.unlink(wake)
