"""Long polling: gets parked on a partition until an append makes data visible.

Woken by the store's visibility changes (``notify``), never by a busy loop; every
wait ends at its deadline.
"""

from gevent.event import Event


class PartitionWaiters:
    """One gevent Event per (topic, partition) that has waiters; replaced after each wake."""

    def __init__(self):
        self._events = {}
        self.closed = False  # the broker is stopping: parked waits answer now

    def close(self):
        """Wake every waiter for good: the broker is stopping."""
        self.closed = True
        self.notify_all()

    def wait(self, key, timeout):
        """Block this greenlet until ``notify`` names ``key`` or ``timeout`` seconds pass."""
        ev = self._events.get(key)
        if ev is None:
            ev = self._events[key] = Event()
        return ev.wait(timeout)

    def notify(self, keys):
        """Wake every greenlet waiting on any of ``keys``."""
        events = self._events
        if not events:
            return
        for key in keys:
            ev = events.pop(key, None)
            if ev is not None:
                ev.set()

    def notify_all(self):
        events, self._events = self._events, {}
        for ev in events.values():
            ev.set()

    def __len__(self):
        return len(self._events)

    def keys(self):
        """The (topic, partition) keys that have waiters now."""
        return list(self._events)
