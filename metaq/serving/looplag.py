"""How late the event loop runs the work queued in it (stat ``loop_lag_ms``, gauge ``metaq_loop_lag_seconds``;
docs/operating.md "Metrics").

A greenlet woken by another (a connection's turn, a spawn, an Event set, a reply handed over) waits in the loop's queue
behind all those woken before it: with thousands of connections busy at once (a fleet reconnecting, a load balancer
restarted), seconds, during which every client of the broker waits as long, and timing that rides on such wakes
(a cluster's client-id lease, ``mqtt.cluster_id_lease_s``) is that much later. A probe woken by its own timer queues
a callback every ``LOOP_LAG_PROBE_S`` and records how long it waited; ``worst_ms`` is the longest over the last
``LOOP_LAG_WINDOW_S``. One probe a process: the loop is the process's.
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
        self._samples = deque(maxlen=int(window_s / probe_s) + 1)  # (when queued, how late it ran), oldest first
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
            gevent.sleep(self.probe_s)  # a timer: its own wake waits behind nothing
            loop.run_callback(self._ran, time.monotonic())

    def _ran(self, queued):
        self._samples.append((queued, time.monotonic() - queued))

    def worst_ms(self):
        """The longest a probe's callback waited in the loop's queue over the last ``window_s``, in milliseconds
        (0.0 before the first)."""
        since = time.monotonic() - self.window_s
        return round(max((late for queued, late in self._samples if queued >= since), default=0.0) * 1000.0, 1)


#: The process's probe (the broker starts it).
PROBE = LoopLag()
