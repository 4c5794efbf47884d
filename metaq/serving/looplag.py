"""How late the event loop runs the work queued in it (stat ``loop_lag_ms``, gauge ``metaq_loop_lag_seconds``;
docs/operating.md "Metrics").

A greenlet woken by another (a connection's turn, a spawn, an Event set, a reply handed over) waits in the loop's queue
behind all those woken before it: with thousands of connections busy at once (a fleet reconnecting, a load balancer
restarted), seconds, during which every client of the broker waits as long. And nothing runs at all while one piece
of work holds the loop, a full pass of the cyclic collector runs, or the process gets no CPU. A probe sleeps
``LOOP_LAG_PROBE_S`` on a timer, then queues a callback: how much later than the timer was due that callback ran is
the lag of that probe (the timer's own lateness, a stall of either kind, and the queue). ``worst_ms`` is the longest
of the probes that ran in the last ``LOOP_LAG_WINDOW_S``. One probe a process: the loop is the process's.
"""

import time
from collections import deque

import gevent

from metaq import limits

__all__ = ["LoopLag", "PROBE"]


class LoopLag:
    """The probe (see the module doc): ``start`` it once; ``worst_ms()`` at any time."""

    def __init__(self, probe_s=limits.LOOP_LAG_PROBE_S, window_s=limits.LOOP_LAG_WINDOW_S):
        self.probe_s = probe_s
        self.window_s = window_s
        self._samples = deque(maxlen=round(window_s / probe_s) + 1)  # (when it ran, how late), oldest first
        self._greenlet = None

    def start(self):
        """Probe from now on (nothing when it already does)."""
        if self._greenlet is None or self._greenlet.dead:
            self._greenlet = gevent.spawn(self._probe)

    def stop(self):
        if self._greenlet is not None:
            self._greenlet.kill(block=False)
            self._greenlet = None

    def _probe(self):
        loop = gevent.get_hub().loop
        while True:
            due = time.monotonic() + self.probe_s
            gevent.sleep(self.probe_s)
            loop.run_callback(self._ran, due)

    def _ran(self, due):
        now = time.monotonic()
        self._samples.append((now, max(0.0, now - due)))

    def worst_ms(self):
        """The longest a probe ran late (see the module doc) of those that ran in the last ``window_s``, in
        milliseconds (0.0 before the first)."""
        since = time.monotonic() - self.window_s
        return round(max((late for ran, late in self._samples if ran >= since), default=0.0) * 1000.0, 1)


#: The process's probe (the broker starts it).
PROBE = LoopLag()
