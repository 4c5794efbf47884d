"""A CONNECT's registration with its client id's home broker, batched per home (service: the server layer;
docs/architecture.md "MQTT cluster: client ids").

A reconnect storm asks one home for thousands of registrations a second: one call each would cost a round trip and
a frame each way per CONNECT. The registrations to one home go instead as ``registers`` calls of up to
``MQTT_CLUSTER_ID_BATCH`` of them, as a producer's records go (Kafka's ``linger`` of zero): a CONNECT's registration
goes at once when fewer than ``MQTT_CLUSTER_REGISTER_BATCHES`` batches to its home are in flight, and otherwise
joins what queued while they were, which goes as one call when one of them is answered. A lone CONNECT so waits no
longer than before; a storm's wait for a round trip is shared by a whole batch. Each CONNECT gets its own answer (or
its own error) out of the batch's, within its own bound; a batch the home does not answer makes each of its CONNECTs
unreachable (``PeerUnreachable``), as one call would, and a CONNECT whose bound runs out first is told so at its
bound while its batch waits on. How a batch goes is ``send``'s (``ClientIds._send_registers``: a lone registration
as a plain ``register`` call, more as one ``registers`` call, a call each to a home of the version before).

**One registration of a client id in flight at a time.** A second CONNECT of an id whose registration is queued or in
flight waits for that one's answer before it joins a batch: the home decides a broker's registrations of one id in
the order they came, each answered before the next is asked, so the broker never holds two answers of one id at
once (two CONNECTs each believing it won), nor one answer held back in a batch behind a later registration of its own
id (that one waits at the home for the answer this broker has not got yet).
"""

import time
from collections import deque

import gevent
from gevent.event import AsyncResult

from metaq.mqttcluster import limits as mqttcluster_limits
from metaq.mqttcluster.clientids.calls import PeerUnreachable

__all__ = ["Registrations"]


class Registrations:
    """See the module doc. ``send(home, requests, timeout_s) -> [answer, or the PeerUnreachable of it, per request]``
    makes one call of ``requests`` (raises PeerUnreachable)."""

    def __init__(self, send, most=None):
        self._send = send
        self.most = mqttcluster_limits.MQTT_CLUSTER_REGISTER_BATCHES if most is None else most
        self._queues = {}  # home -> deque of (request, AsyncResult, deadline): ready to go in its next batch
        self._going = {}  # home -> batches in flight to it
        #: (home, client id) -> deque of its registrations waiting for the one queued or in flight (empty: none); one
        #: a CONNECT under way, so bounded by the port's connections
        self._ids = {}
        self.batches = 0  # calls made
        self.batched = 0  # registrations they carried

    def register(self, home, request, timeout_s):
        """``request`` (a ``register`` call's) answered by ``home`` within ``timeout_s``: its answer (a dict). Raises
        PeerUnreachable."""
        deadline = time.monotonic() + timeout_s
        entry = (request, AsyncResult(), deadline)
        waiting = self._ids.get((home, request["c"]))
        if waiting is not None:
            waiting.append(entry)  # goes once the one of its id before it is answered
        else:
            self._ids[(home, request["c"])] = deque()
            self._queue(home, entry)
        try:
            return entry[1].get(timeout=max(0.0, deadline - time.monotonic()))
        except gevent.Timeout:  # its batch waits on for the others' answers
            raise PeerUnreachable("the home broker %s: no answer in time" % home) from None

    def _queue(self, home, entry):
        """``entry`` in ``home``'s next batch; a batch goes now while fewer than ``most`` are in flight."""
        self._queues.setdefault(home, deque()).append(entry)
        if self._going.get(home, 0) < self.most:
            self._going[home] = self._going.get(home, 0) + 1
            gevent.spawn(self._flush, home)

    def _flush(self, home):
        """Send what queued for ``home`` as batches, one at a time, until nothing is left."""
        try:
            while self._queues.get(home):
                queue = self._queues[home]
                batch = [queue.popleft() for _ in range(min(len(queue), mqttcluster_limits.MQTT_CLUSTER_ID_BATCH))]
                try:
                    self._send_batch(home, batch)
                finally:
                    self._answered(home, batch)
        finally:
            left = self._going.pop(home, 1) - 1
            if left:
                self._going[home] = left
            if not self._queues.get(home):
                self._queues.pop(home, None)

    def _answered(self, home, batch):
        """Each id of ``batch`` (answered, or failed): its next registration waiting goes to the queue."""
        for request, _result, _deadline in batch:
            key = (home, request["c"])
            waiting = self._ids.get(key)
            if waiting:
                self._queue(home, waiting.popleft())
            else:
                self._ids.pop(key, None)

    def _send_batch(self, home, batch):
        """One call of ``batch``, each entry's answer (or error) set."""
        now = time.monotonic()
        live = [entry for entry in batch if entry[2] > now]
        for _request, result, _deadline in batch:
            if not result.ready() and _deadline <= now:
                result.set_exception(PeerUnreachable("the home broker %s: no answer in time" % home))
        if not live:
            return
        self.batches += 1
        self.batched += len(live)
        timeout_s = max(deadline for _r, _a, deadline in live) - now  # each entry's wait is bounded by its own
        try:
            answers = self._send(home, [request for request, _a, _d in live], timeout_s)
        except PeerUnreachable as exc:
            for _request, result, _deadline in live:
                result.set_exception(PeerUnreachable(str(exc)))
            return
        for (_request, result, _deadline), answer in zip(live, answers, strict=True):
            if isinstance(answer, Exception):
                result.set_exception(answer)
            else:
                result.set(answer)
