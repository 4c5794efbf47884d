"""Group commit and background flushing; every blocking msync runs in gevent's thread pool.

``sync`` mode: a put is acknowledged only after ``wait_flushed(pos)`` returns;
all puts that arrive while one msync runs share the next one (group commit).
``async`` mode: puts are acknowledged after the write; the log is flushed every
N messages or T ms, whichever comes first (the store's ``should_flush``).
"""

import logging
import time

import gevent
from gevent.event import Event

from metaq.errors import BrokerError

log = logging.getLogger(__name__)

#: Longest a sync-mode put waits for its flush before it is answered with an error.
FLUSH_WAIT_TIMEOUT_S = 30.0


def now_ms():
    return int(time.time() * 1000)


class Flusher:
    def __init__(self, store, store_config, on_visible, on_failure):
        self._store = store
        self._cfg = store_config
        self._on_visible = on_visible
        self._on_failure = on_failure
        self._wake = Event()
        self._round_done = Event()
        self._pool = gevent.get_hub().threadpool
        self._greenlet = None
        self._running = False
        self.failure = None  # set after a failed msync: writes are refused from then on (fsyncgate)
        self.rounds = 0
        self._checkpointer = None
        self._stopping = Event()

    def start(self):
        self._running = True
        self._greenlet = gevent.spawn(self._run)
        self._checkpointer = gevent.spawn(self._checkpoint_loop)

    def wake(self):
        self._wake.set()

    def wait_flushed(self, pos, timeout=FLUSH_WAIT_TIMEOUT_S):
        """Block this greenlet until the log is durable up to ``pos``."""
        deadline = time.monotonic() + timeout
        store = self._store
        while store.flushed_position < pos:
            if self.failure is not None:
                raise BrokerError("flush failed, the message may not be durable: %s" % self.failure)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError("flush did not complete within %.0f s" % timeout)
            done = self._round_done
            self._wake.set()
            done.wait(remaining)

    def _run(self):
        interval = self._cfg.flush_interval_ms / 1000.0
        while self._running:
            self._wake.wait(interval)
            self._wake.clear()
            try:
                self.flush_once()
            except Exception as exc:  # an msync failure: never retry and carry on (fsyncgate)
                self.failure = "%s: %s" % (type(exc).__name__, exc)
                log.critical("flush failed; refusing further writes: %s", self.failure, exc_info=True)
                self._on_failure()
                self._signal_round()
                return

    def _signal_round(self):
        done, self._round_done = self._round_done, Event()
        done.set()

    def flush_once(self):
        store = self._store
        if store.written_position > store.flushed_position:
            pos = self._pool.apply(store.flush_log)
            changed = store.mark_flushed(pos)
            self.rounds += 1
            if changed:
                self._on_visible(changed)
        self._signal_round()

    def _checkpoint_loop(self):
        """Checkpoints run beside the flushes (another pool thread), so they never delay an ack."""
        interval = self._cfg.checkpoint_interval_ms / 1000.0
        while self._running:
            self._stopping.wait(interval)
            if not self._running or self.failure is not None:
                return
            try:
                self._pool.apply(self._store.checkpoint, (now_ms(),))
            except OSError as exc:  # only recovery time suffers; the log itself is durable
                log.warning("checkpoint failed (recovery will scan further): %s", exc)

    def stop(self):
        """Stop the background loop and flush what is left (on the calling greenlet)."""
        self._running = False
        self._wake.set()
        self._stopping.set()
        for g in (self._greenlet, self._checkpointer):
            if g is not None:
                g.join(timeout=FLUSH_WAIT_TIMEOUT_S)
        if self.failure is None:
            self.flush_once()


class AheadWorker:
    """Keeps the store working ahead of the writer from gevent's thread pool.

    Every ``POLL_S`` it asks the store (cheaply, on the loop) whether the next
    segment or index file should be built or pages prefaulted, and if so runs
    ``store.prepare_ahead`` in a pool thread: ``posix_fallocate`` and page
    faults then never stall the event loop in the normal case.
    """

    POLL_S = 0.01

    def __init__(self, store):
        self._store = store
        self._pool = gevent.get_hub().threadpool
        self._greenlet = None
        self._running = False

    def start(self):
        self._running = True
        self._greenlet = gevent.spawn(self._run)

    def _run(self):
        store = self._store
        while self._running:
            if store.wants_preparation():
                try:
                    self._pool.apply(store.prepare_ahead)
                except Exception:  # noqa: BLE001 - working ahead is an optimisation; the put path falls back
                    log.exception("working ahead of the writer failed; puts will allocate on their own")
                    gevent.sleep(1.0)
            else:
                gevent.sleep(self.POLL_S)

    def stop(self):
        self._running = False
        if self._greenlet is not None:
            self._greenlet.join(timeout=FLUSH_WAIT_TIMEOUT_S)
