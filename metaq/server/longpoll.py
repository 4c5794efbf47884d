"""Long polling: gets parked on a partition until an append makes data visible.

Woken by the store's visibility changes (``notify``), never by a busy loop; every
wait ends at its deadline. Each parked wait has an Event of its own, so a wait
that ends early (its connection closed) leaves in constant time however many
others wait on the same partition. ``admit``/``leave`` count the long polls
parked on the whole broker against ``max_parked`` (``limits.MAX_PARKED_GETS``).
``wake_now`` is the text put paths' wake: the woken gets answer before the put's own ack goes out.
"""

import gevent
from gevent.event import Event

from metaq import limits


class PartitionWaiters:
    """The waits parked per (topic, partition); a wake ends every wait of the partitions it names."""

    def __init__(self, max_parked=limits.MAX_PARKED_GETS):
        self._waits = {}  # key -> set of Events, one per parked wait
        self.max_parked = max_parked
        self.parked = 0  # long polls admitted and not yet left
        self.closed = False  # the broker is stopping: parked waits answer now

    def admit(self):
        """Count one more long poll until its ``leave``; False (not counted) when ``max_parked`` are parked."""
        if self.parked >= self.max_parked:
            return False
        self.parked += 1
        return True

    def leave(self):
        self.parked -= 1

    def close(self):
        """Wake every waiter for good: the broker is stopping."""
        self.closed = True
        self.notify_all()

    def wait(self, key, timeout):
        """Block this greenlet until ``notify`` names ``key`` or ``timeout`` seconds pass."""
        ev = Event()
        waits = self._waits.get(key)
        if waits is None:
            waits = self._waits[key] = set()
        waits.add(ev)
        try:
            return ev.wait(timeout)
        finally:
            waits.discard(ev)  # the set may already be out of the map (a notify took it): harmless
            if not waits and self._waits.get(key) is waits:
                del self._waits[key]

    def wait_any(self, keys, timeout, ev):
        """Block this greenlet until ``notify`` names any of ``keys``, ``ev`` is set by its owner, or ``timeout``
        seconds pass (an MQTT connection's delivery: every partition its subscriptions read, and a new
        subscription or an acknowledgement that makes room). One wait per connection, not counted in ``admit``."""
        held = []
        for key in keys:
            waits = self._waits.get(key)
            if waits is None:
                waits = self._waits[key] = set()
            waits.add(ev)
            held.append((key, waits))
        try:
            return ev.wait(timeout)
        finally:
            for key, waits in held:
                waits.discard(ev)
                if not waits and self._waits.get(key) is waits:
                    del self._waits[key]

    def notify(self, keys):
        """Wake every greenlet waiting on any of ``keys``; True when there was one."""
        waits = self._waits
        if not waits:
            return False
        woke = False
        for key in keys:
            evs = waits.pop(key, None)
            if evs is not None:
                woke = True
                for ev in evs:
                    ev.set()
        return woke

    def wake_now(self, keys):
        """``notify``, then yield to the loop once when a wait was woken, so the woken gets read and send their
        replies before the caller goes on (a put burst's ack, its next frames): a consumer's latency then holds
        no ack send nor the rest of the producer's burst. The caller must be free to yield (no lock held)."""
        if self.notify(keys):
            gevent.sleep(0)

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
