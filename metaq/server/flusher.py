"""Group commit and background flushing; every blocking fsync runs off the event loop.

``sync`` mode: a put is acknowledged only after ``wait_flushed(pos)`` returns;
all puts that arrive while one msync runs share the next one (group commit).
``async`` mode: puts are acknowledged after the write; the log is flushed every
N messages or T ms, whichever comes first (the store's ``should_flush``).
"""

import errno
import logging
import os
import sys
import time
from collections import deque

import gevent
from gevent import monkey
from gevent.event import Event
from gevent.lock import Semaphore

from metaq import speedups
from metaq.errors import BrokerError, DiskFull, Unavailable
from metaq.store.limits import LOG_FOLLOW_RETRY_S
from metaq.clock import now_ms

log = logging.getLogger(__name__)

#: How many of the last flush rounds ``stats`` summarises (flush_time_p50_ms, _p99_ms, _max_ms).
RECENT_ROUNDS = 1024
#: Longest a sync-mode put waits for its flush before it is answered with an error.
FLUSH_WAIT_TIMEOUT_S = 30.0
#: After a round that could not run for want of file descriptors (EMFILE/ENFILE: no fsync failed), the
#: pause before the next try; waiters keep waiting (up to FLUSH_WAIT_TIMEOUT_S), nothing is refused for good.
TRANSIENT_RETRY_S = 0.05
#: errnos that mean "no descriptor to open", never "the data may be lost".
FD_EXHAUSTED = (errno.EMFILE, errno.ENFILE)
#: How often the waiters of a flush are woken to check their deadline (``FLUSH_WAIT_TIMEOUT_S``, or the caller's):
#: a wait has no timer of its own (a Timeout per wait would cost a timer per waiting put), so it ends this late at
#: most.
DEADLINE_CHECK_S = 1.0


class DedicatedThread:
    """One real OS thread for one kind of blocking call, driven from a greenlet.

    A hand-off to gevent's shared thread pool costs several times what this
    thread costs, which waits on a plain condition variable and reports back
    through a libev async watcher (figures: bench/README.md, "A thread of its
    own for the fsync"). The flusher's fsync round trip (and so a sync-mode
    ack) is that much shorter. Calls are serialised.
    """

    def __init__(self, name):
        self._cond = monkey.get_original("threading", "Condition")(monkey.get_original("threading", "Lock")())
        self._job = None
        self._completed = None  # the finished job's Event, handed from the thread to the loop's watcher
        self._serial = Semaphore()  # held from a job's submission to its outcome: one job in the thread at a time
        self._watcher = gevent.get_hub().loop.async_()
        self._watcher.start(self._finished)
        thread_class = monkey.get_original("threading", "Thread")
        self._thread = thread_class(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self):
        while True:
            with self._cond:
                while self._job is None:
                    self._cond.wait()
                func, args, outcome, done = self._job
                self._job = None
            try:
                outcome.append((True, func(*args)))
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                outcome.append((False, exc))
            self._completed = done
            self._watcher.send()

    def _finished(self):
        done, self._completed = self._completed, None
        if done is not None:
            done.set()
            self._serial.release()

    def apply(self, func, args=()):
        """Run ``func(*args)`` in the thread; this greenlet waits, the loop goes on.

        A caller killed while it waits leaves its job running: the next call starts only once that job is done,
        and reads its own outcome, never the killed caller's."""
        self._serial.acquire()  # released by _finished once this job's outcome is in
        done, outcome = Event(), []
        with self._cond:
            self._job = (func, args, outcome, done)
            self._cond.notify()
        done.wait()
        ok, value = outcome[0]
        if not ok:
            raise value
        return value


class NativeSync:
    """fdatasync in ``metaq.native._bytes.SyncWorker``, a C thread that never takes the GIL.

    A Python thread (``DedicatedThread``) must take the GIL to start the sync
    and again to report it, and a busy event loop holds the GIL, which delays
    the start of every sync; the C thread starts at once. It reports through a pipe
    whose watcher has the loop's highest priority. ``sync_fds`` syncs
    descriptors the caller keeps open (the store's: a round opens nothing);
    ``sync_paths`` opens the files (a path lookup) and keeps them open until the
    result is read. Either way a job's result is read even when the waiting
    greenlet is killed: the next sync, or ``close``, collects it first (so the
    caller's fds stay untouched by the thread once a later sync returned).
    ``create`` gives None when the helper is not built.
    """

    @classmethod
    def create(cls):
        worker_class = speedups.load("SyncWorker", None)
        return None if worker_class is None else cls(worker_class)

    def __init__(self, worker_class):
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        self._worker = worker_class(self._w)
        self._watcher = gevent.get_hub().loop.io(self._r, 1)  # 1 = READ
        self._watcher.priority = 2  # EV_MAXPRI: served first among the watchers ready in a loop turn
        self._serial = Semaphore()
        self._inflight = None  # a job whose result was not read yet: the fds we opened for it (maybe [])

    def sync_paths(self, paths):
        """fdatasync each of ``paths`` (this greenlet waits, the loop goes on); OSError if one failed."""
        self._sync(paths, None)

    def sync_fds(self, fds):
        """fdatasync each of ``fds``, which the caller keeps open (this greenlet waits); OSError if one failed."""
        self._sync(None, fds)

    def _sync(self, paths, fds):
        with self._serial:
            stale = self._collect()  # a killed waiter's sync: its failure counts like any other
            if stale:
                raise OSError(stale, "an earlier fdatasync failed: %s" % os.strerror(stale))
            opened = []
            if fds is None:
                try:
                    for path in paths:
                        opened.append(os.open(path, os.O_RDWR))
                except OSError:
                    _close_all(opened)
                    raise
                fds = opened
            self._worker.submit(fds)
            self._inflight = opened
            err = self._collect()
        if err:
            raise OSError(err, "fdatasync failed: %s" % os.strerror(err))

    def settle(self):
        """Collect a job left in flight by a killed waiter (this greenlet waits); OSError if it failed. A round
        that flushes another way (the Python thread) calls this first, so that job's result is never lost and
        its descriptors are not released while it still uses them."""
        with self._serial:
            stale = self._collect()
        if stale:
            raise OSError(stale, "an earlier fdatasync failed: %s" % os.strerror(stale))

    def _collect(self):
        """Wait for the result of the job in flight (0 if none), then close its files."""
        if self._inflight is None:
            return 0
        while True:
            try:
                data = os.read(self._r, 4)
                break
            except BlockingIOError:
                gevent.get_hub().wait(self._watcher)
        fds, self._inflight = self._inflight, None
        _close_all(fds)
        return int.from_bytes(data, sys.byteorder, signed=True)

    def close(self):
        """Stop the thread (a sync in progress finishes first) and release the pipe and files."""
        self._worker.close()
        if self._inflight is not None:
            _close_all(self._inflight)
            self._inflight = None
        _close_all([self._r, self._w])


def _close_all(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Flusher:
    def __init__(self, store, store_config, on_visible, on_failure, lock=None):
        self._store = store
        self._lock = lock if lock is not None else Semaphore()  # held around checkpoints (see SlaveLink._cut)
        self._cfg = store_config
        self._on_visible = on_visible
        self._on_failure = on_failure
        self._wake = Event()
        self._round_done = Event()
        self._pool = gevent.get_hub().threadpool
        self._fsync_thread = DedicatedThread("metaq-flush")  # directory fsyncs, and all when not built
        self._native = NativeSync.create()
        self._greenlet = None
        self._running = False
        self._waiting = 0  # greenlets waiting in wait_flushed for a round to end
        self._deadlines = None
        self._in_round = False  # a flush round is running (on the flusher greenlet or a leading waiter)
        self.failure = None  # set after a failed msync: writes are refused from then on (fsyncgate)
        self.transient = None  # why the last round could not run (out of descriptors), None once one ran
        self.transient_rounds = 0  # rounds that could not run for want of descriptors (stats, tests)
        self.rounds = 0
        self.recent_ms = deque(maxlen=RECENT_ROUNDS)  # how long each of the last rounds' fsync took
        self._flush_observers = []  # callables given each round's fsync time in seconds (observe_flushes)
        self._checkpointer = None
        self._stopping = Event()
        self._indexer = None
        self._index_wanted = Event()  # set after each flush round: the key index follows the flushed log

    def start(self):
        self._running = True
        self._greenlet = gevent.spawn(self._run)
        self._checkpointer = gevent.spawn(self._checkpoint_loop)
        self._indexer = gevent.spawn(self._index_loop)

    def wake(self):
        self._wake.set()

    @property
    def log_cuts(self):
        """The store's truncations so far: read it right after a write whose flush is awaited later (another greenlet,
        a queued burst) and hand it to ``wait_flushed`` as ``since``."""
        return self._store.log_cuts

    def wait_flushed(self, pos, timeout=FLUSH_WAIT_TIMEOUT_S, since=None):
        """Block this greenlet until the log is durable up to ``pos``.

        When no round is running, this greenlet runs the next one itself (it
        leads the group commit: every put written by then shares that fsync), which
        spares the hop to the flusher greenlet. Otherwise it waits for
        the round in progress and, if that did not cover ``pos``, leads or waits
        again. A round once started is not cut short by ``timeout``, which is
        checked each time the waiter wakes: at each round's end, and at least
        every ``DEADLINE_CHECK_S`` (the wait itself has no timer of its own).

        A round is led only when something written is unflushed (never empty ones back to back, which would hold
        the loop). Unavailable when the log was cut back before ``pos`` since ``since`` (``log_cuts`` read right
        after the write; default: read now, which is right only when nothing yielded since the write): that write
        is gone even if the log grows past ``pos`` again. Unavailable at once as well for a ``pos`` past the
        written end: every caller waits for what it wrote, so only a cut can have put it there (a stale end, or a
        wait that began after the cut), and waiting would end only when other records reach it.
        """
        deadline = time.monotonic() + timeout
        store = self._store
        cuts = store.log_cuts if since is None else since
        while True:
            if store.log_cuts != cuts and store.cut_below(cuts, pos):
                raise Unavailable("the log was cut back before position %d while its flush was awaited (this broker "
                                  "was deposed): what was written there is gone" % pos)
            if store.flushed_position >= pos:
                return
            if pos > store.written_position:
                raise Unavailable("the log ends at %d, before position %d whose flush was awaited: it was cut back "
                                  "(this broker was deposed): what was written there is gone"
                                  % (store.written_position, pos))
            if self.failure is not None:
                raise BrokerError("flush failed, the message may not be durable: %s" % self.failure)
            if time.monotonic() >= deadline:
                if self.transient is not None:
                    raise Unavailable("flush could not run within %.0f s: %s" % (timeout, self.transient))
                raise BrokerError("flush did not complete within %.0f s" % timeout)
            if not self._in_round and self._running:
                self._round()
                continue
            self._waiting += 1
            if self._deadlines is None or self._deadlines.dead:  # the first waiter since the loop last ended
                self._deadlines = gevent.spawn(self._deadline_loop)
            try:
                self._round_done.wait()
            finally:
                self._waiting -= 1

    def _run(self):
        interval = self._cfg.flush_interval_ms / 1000.0
        while self._running and self.failure is None:
            self._wake.wait(interval)
            self._wake.clear()
            while self._in_round and self._running:  # a waiter is leading one: then the next is ours
                self._round_done.wait()
            if self._running:
                self._round()

    def _round(self):
        """One flush round on this greenlet (the flusher's or a leading waiter's), never two at once.

        A failed fsync stops all flushing for good (fsyncgate: never retry and carry on). A round that
        could not open a descriptor (EMFILE/ENFILE: nothing was synced, nothing can be lost) is only
        transient: logged, retried after ``TRANSIENT_RETRY_S``; waiters keep waiting.
        """
        if self.failure is not None:  # e.g. the flusher greenlet, woken by the round that failed
            return
        self._in_round = True
        completed = False
        try:
            self.flush_once()
            completed = True
            self.transient = None
        except OSError as exc:
            if exc.errno not in FD_EXHAUSTED:
                self._failed(exc)
            else:
                self._out_of_fds(exc)
        except Exception as exc:  # noqa: BLE001 - any failure means the log may not be durable
            self._failed(exc)
        finally:
            self._in_round = False
            if not completed:  # failed, or its greenlet was killed: the waiters look again,
                self._signal_round()  # and one of them leads the next round

    def _deadline_loop(self):
        """Wake the waiters every ``DEADLINE_CHECK_S`` while any wait, so each checks its own deadline (a round
        stuck in an fsync must not keep them past ``FLUSH_WAIT_TIMEOUT_S``) without a timer per wait. Started by
        a waiter when not running; ends at the first check that finds no waiter."""
        while self._waiting:  # started by the first waiter; ends a check after the last has gone
            gevent.sleep(DEADLINE_CHECK_S)
            if self._waiting:
                self._signal_round()

    def _failed(self, exc):
        self.failure = "%s: %s" % (type(exc).__name__, exc)
        log.critical("flush failed; refusing further writes: %s", self.failure, exc_info=True)
        self._on_failure()

    def _out_of_fds(self, exc):
        if self.transient is None:
            log.warning("flush round could not run (retrying every %.0f ms; nothing was lost): %s",
                        TRANSIENT_RETRY_S * 1000, exc)
        self.transient = "out of file descriptors: %s" % (exc.strerror or exc)
        self.transient_rounds += 1
        gevent.sleep(TRANSIENT_RETRY_S)  # still in the round: waiters do not spin on it

    def _signal_round(self):
        done, self._round_done = self._round_done, Event()
        done.set()

    def flush_once(self):
        store = self._store
        if store.written_position > store.flushed_position:
            started = time.perf_counter()
            pos = self._flush_log()
            seconds = time.perf_counter() - started
            self.recent_ms.append(seconds * 1000.0)
            for observe in self._flush_observers:
                observe(seconds)
            changed = store.mark_flushed(pos)
            self.rounds += 1
            if changed:
                self._on_visible(changed)
            self._index_wanted.set()
            if self._waiting and store.written_position > pos:
                # Puts written during this fsync wait for the next: the flusher greenlet, woken before the waiters
                # (who answer their clients first), starts it at once (bench/README.md, "The next fsync at once").
                self._wake.set()
        self._signal_round()

    def _index_loop(self):
        """The store's log follower steps its subscribers (the key index: docs/messaging.md "Key index") behind the
        log: after a round's waiters are answered, in steps of ``limits.KEY_INDEX_STEP_BYTES``, other greenlets running
        between two steps, until they are there. A failed step (a full disk) is tried again after the next round and
        every ``limits.LOG_FOLLOW_RETRY_S``, logged once until it succeeds (a full disk as one line)."""
        failed = None  # the last failure's text while steps fail
        while self._running:
            self._index_wanted.wait(None if failed is None else LOG_FOLLOW_RETRY_S)
            self._index_wanted.clear()
            try:
                while self._running and self._store.follow_log():
                    gevent.sleep(0)
            except Exception as exc:  # noqa: BLE001 - derived data: logged, tried again
                if str(exc) != failed:
                    if isinstance(exc, DiskFull):
                        log.warning("log follower: a step failed: %s; trying again", exc)
                    else:
                        log.exception("log follower: a step failed; trying again")
                failed = str(exc)
                continue
            if failed is not None:
                log.info("log follower: steps succeed again")
                failed = None

    def wake_index(self):
        """Step the store's log follower now, not only after the next flush round (a subscriber that had no room
        made some: the timer index applied its batch)."""
        self._index_wanted.set()

    def observe_flushes(self, observe):
        """Call ``observe(seconds)`` with the fsync time of every flush round from now on (the HTTP port's
        ``metaq_flush_duration_seconds`` histogram); it must not block nor raise."""
        self._flush_observers.append(observe)

    def recent_times(self):
        """``(p50, p99, max)`` in ms of the fsync time of the last ``RECENT_ROUNDS`` rounds (zeros before any)."""
        times = sorted(self.recent_ms)
        if not times:
            return 0.0, 0.0, 0.0
        return times[len(times) // 2], times[min(len(times) - 1, int(len(times) * 0.99))], times[-1]

    def _flush_log(self):
        """Make the log durable up to its written end (this greenlet waits); returns that position."""
        store = self._store
        plan = store.flush_plan()  # on the loop, always: it also marks what this round covers (async policy)
        if plan is None or self._native is None:
            if self._native is not None:
                self._native.settle()
            return self._fsync_thread.apply(store.flush_log)
        end, fds = plan
        if fds:
            self._native.sync_fds(fds)
        return end

    def _checkpoint_loop(self):
        """Checkpoints run beside the flushes (another pool thread), so they never delay an ack. A failure (a full
        disk) is logged once until a checkpoint succeeds again, not at every interval."""
        interval = self._cfg.checkpoint_interval_ms / 1000.0
        failed = None  # the last failure's text while checkpoints fail
        while self._running:
            self._stopping.wait(interval)
            if not self._running or self.failure is not None:
                return
            try:
                with self._lock:
                    self._store.prepare_checkpoint()  # on the loop: what the worker must read consistently
                    self._pool.apply(self._store.checkpoint, (now_ms(), True))  # an idle broker writes nothing
            except OSError as exc:  # only recovery time suffers; the log itself is durable
                if str(exc) != failed:
                    log.warning("checkpoint failed (recovery will scan further): %s; trying again", exc)
                failed = str(exc)
                continue
            if failed is not None:
                log.info("checkpoints succeed again")
                failed = None

    def stop(self):
        """Stop the background loop and flush what is left (on the calling greenlet)."""
        self._running = False
        self._wake.set()
        self._stopping.set()
        self._index_wanted.set()
        for g in (self._greenlet, self._checkpointer, self._indexer):
            if g is not None:
                g.join(timeout=FLUSH_WAIT_TIMEOUT_S)
        if self.failure is None:
            self.flush_once()
        if self._native is not None:
            native, self._native = self._native, None  # any later flush goes through the Python thread
            native.close()


class AheadWorker:
    """Keeps the store working ahead of the writer from gevent's thread pool.

    Every ``POLL_S`` it asks the store (cheaply, on the loop) whether the next
    segment or index file should be built or pages prefaulted, and if so runs
    ``store.prepare_ahead`` in a pool thread: ``posix_fallocate`` and page
    faults then never stall the event loop in the normal case. Once the log has
    stood still for ``IDLE_AFTER_S`` it asks every ``IDLE_POLL_S`` instead (an idle
    broker costs next to nothing), until the next
    flush round (``observe_flushes``: a put's) or a poll finds the log moved.
    """

    POLL_S = 0.01
    IDLE_AFTER_S = 1.0
    IDLE_POLL_S = 0.1

    def __init__(self, store, lock=None, observe_flushes=None):
        self._store = store
        self._lock = lock if lock is not None else Semaphore()  # held around the work (see SlaveLink._cut)
        self._pool = gevent.get_hub().threadpool
        self._greenlet = None
        self._running = False
        self._idle = False
        self._nudge = Event()  # set by the first flush round while idle
        self.polls = 0  # how many times it asked (tests)
        if observe_flushes is not None:
            observe_flushes(self._flushed)

    def _flushed(self, seconds):
        if self._idle:
            self._nudge.set()

    def start(self):
        self._running = True
        self._greenlet = gevent.spawn(self._run)

    def _run(self):
        store = self._store
        last, still_since = store.written_position, time.monotonic()
        while self._running:
            self.polls += 1
            if store.wants_preparation():
                try:
                    with self._lock:
                        self._pool.apply(store.prepare_ahead)
                except Exception:  # noqa: BLE001 - working ahead is an optimisation; the put path falls back
                    log.exception("working ahead of the writer failed; puts will allocate on their own")
                    gevent.sleep(1.0)
                continue
            now, pos = time.monotonic(), store.written_position
            if pos != last:
                last, still_since = pos, now
            if now - still_since < self.IDLE_AFTER_S:
                gevent.sleep(self.POLL_S)
                continue
            self._nudge.clear()
            self._idle = True
            try:
                self._nudge.wait(self.IDLE_POLL_S)
            finally:
                self._idle = False

    def stop(self):
        self._running = False
        self._nudge.set()  # an idle poll ends now
        if self._greenlet is not None:
            self._greenlet.join(timeout=FLUSH_WAIT_TIMEOUT_S)
