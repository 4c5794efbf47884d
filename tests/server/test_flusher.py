"""The flusher's dedicated thread: blocking calls run off the event loop."""

import time

import gevent
import gevent.event
import pytest

from metaq.server.flusher import DedicatedThread


def test_result_and_exception_come_back_to_the_caller():
    t = DedicatedThread("test-thread")
    assert t.apply(lambda a, b: a + b, (2, 3)) == 5
    with pytest.raises(OSError, match="boom"):
        t.apply(lambda: (_ for _ in ()).throw(OSError("boom")))
    assert t.apply(len, ([1, 2],)) == 2  # still usable after an exception


def test_the_event_loop_keeps_running_while_the_thread_blocks():
    t = DedicatedThread("test-thread")
    ticks = []

    def ticker():
        for _ in range(20):
            ticks.append(time.monotonic())
            gevent.sleep(0.01)

    g = gevent.spawn(ticker)
    started = time.monotonic()
    t.apply(time.sleep, (0.3,))  # real blocking sleep in the thread (this process is not monkey-patched)
    assert time.monotonic() - started >= 0.3
    g.join()
    assert sum(1 for x in ticks if started < x < started + 0.3) >= 10  # ~every 10 ms during the block


def test_concurrent_callers_are_serialised():
    t = DedicatedThread("test-thread")
    results = []
    greenlets = [gevent.spawn(lambda i=i: results.append(t.apply(lambda: i * i))) for i in range(10)]
    gevent.joinall(greenlets, timeout=10)
    assert sorted(results) == [i * i for i in range(10)]


def _store_and_flusher(tmp_path):
    from metaq.server.flusher import Flusher
    from metaq.storestate import open_store
    from tests.harness.store import NOW, small_config

    store = open_store(small_config(tmp_path / "data", segment_size=1 << 20, flush="sync"), NOW)
    failures = []
    flusher = Flusher(store, store.config, on_visible=lambda changed: None, on_failure=lambda: failures.append(1))
    flusher.start()
    return store, flusher, failures


def test_group_commit_with_leading_waiters_some_killed_mid_round(tmp_path):
    """Waiters lead rounds themselves; killing some mid-round never leaves a put unflushed or a round stuck."""
    from tests.harness.store import NOW

    store, flusher, failures = _store_and_flusher(tmp_path)
    acked = []

    def producer(i):
        for k in range(20):
            store.put("test", i % 4, 0, b"m-%d-%d" % (i, k), NOW)
            end = store.written_position
            flusher.wait_flushed(end)
            assert store.flushed_position >= end
            acked.append((i, k))
            gevent.sleep(0)

    try:
        workers = [gevent.spawn(producer, i) for i in range(12)]
        gevent.sleep(0.005)
        for g in workers[:3]:  # some die wherever they are: maybe leading a round, maybe waiting
            g.kill(block=True)
        gevent.joinall(workers[3:], timeout=30, raise_error=True)
        assert all(g.successful() for g in workers[3:])
        assert sum(1 for i, _k in acked if i >= 3) == 9 * 20
        assert failures == [] and flusher.failure is None
        assert flusher.rounds < len(acked)  # rounds were shared
        flusher.wait_flushed(store.written_position)  # still usable afterwards
        assert store.flushed_position == store.written_position
    finally:
        flusher.stop()
        store.close(NOW)


def test_a_failed_flush_is_never_retried_by_the_flusher_or_another_waiter(tmp_path):
    """fsyncgate: after one failed fsync no round runs again; every waiter gets the error."""
    import os

    from metaq.errors import BrokerError
    from tests.harness.store import NOW

    store, flusher, failures = _store_and_flusher(tmp_path)
    if flusher._native is None:
        flusher.stop()
        store.close(NOW)
        pytest.skip("the C helper's sync thread is not in use (METAQ_PURE_PYTHON or not built)")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    real_plan, attempts = store.flush_plan, []
    fifo_fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)

    def failing_plan():  # a real fdatasync that fails: on a FIFO it is EINVAL
        attempts.append(1)
        real_plan()  # (None while a directory fsync is due: replaced by the failing file all the same)
        end = store.written_position
        gevent.sleep(0.05)  # the round stays open a while, as a slow disk keeps it
        return end, [fifo_fd]

    store.flush_plan = failing_plan
    errors = []

    def waiter(i):
        store.put("test", i % 4, 0, b"x%d" % i, NOW)
        try:
            flusher.wait_flushed(store.written_position)
        except BrokerError as exc:
            errors.append(str(exc))

    try:
        greenlets = [gevent.spawn(waiter, i) for i in range(6)]
        gevent.sleep(0.01)  # the first waiter leads a round and waits for its sync; the others wait for it
        assert flusher._in_round
        flusher.wake()  # the flusher greenlet now waits for that round too, then must not run one
        gevent.joinall(greenlets, timeout=10, raise_error=True)
        gevent.sleep(0.05)  # let the flusher greenlet run after the failed round
        assert len(errors) == 6 and all("flush failed" in e for e in errors)
        assert attempts == [1] and failures == [1] and flusher.failure is not None
        with pytest.raises(BrokerError):
            flusher.wait_flushed(store.written_position)
        assert attempts == [1]
    finally:
        flusher.stop()
        store.close(NOW, clean=False)
        os.close(fifo_fd)


def test_a_killed_waiters_native_sync_is_settled_before_a_round_flushes_another_way(tmp_path):
    """A job left in flight by a killed waiter is collected (and its failure raised) by ``settle``, which a round
    taking the Python thread path calls first: its result is never lost, its descriptors never released early."""
    import os

    from metaq.server.flusher import NativeSync

    native = NativeSync.create()
    if native is None:
        pytest.skip("the C helper's sync thread is not built")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)  # fdatasync on a FIFO fails with EINVAL: a real failure
    big = None
    try:
        # The job syncs 32 MiB of dirty pages first (tens of ms at least), then the FIFO: it is still in flight
        # when the waiter is killed, however loaded the machine (a job that failed at once could come back
        # before the kill: the result watcher has the loop's highest priority).
        big = os.open(tmp_path / "dirty", os.O_RDWR | os.O_CREAT)
        os.write(big, os.urandom(1 << 20) * 32)
        submitted = []

        def waiter():
            submitted.append(True)  # from here it runs without yielding until it waits for the result
            native.sync_fds([big, fd])

        g = gevent.spawn(waiter)
        while not submitted:  # it submits the job and waits for its result (a loaded hub may take a few turns)
            gevent.sleep(0)
        g.kill(block=True)  # the waiter dies with the job in flight
        assert isinstance(g.value, gevent.GreenletExit), (g.value, g.exception)
        with pytest.raises(OSError, match="an earlier fdatasync failed"):
            native.settle()
        native.settle()  # collected once: nothing is left in flight
        with open(tmp_path / "file", "wb") as f:
            native.sync_fds([f.fileno()])  # and the next sync works
    finally:
        native.close()
        os.close(fd)
        if big is not None:
            os.close(big)


def test_a_waiter_gives_up_at_its_deadline_while_a_round_is_stuck(tmp_path):
    """A flush wait has no timer of its own: the deadline loop wakes the waiters every ``DEADLINE_CHECK_S``,
    so one whose deadline passed while the round in progress hangs (a stuck disk) gets a clear error, and
    the put it waited for is still flushed once the round ends: nothing written is lost."""
    from metaq.errors import BrokerError
    from metaq.server import flusher as flusher_module
    from tests.harness.store import NOW

    store, flusher, failures = _store_and_flusher(tmp_path)
    real_flush_log, release = flusher._flush_log, gevent.event.Event()

    def stuck_flush_log():
        release.wait()  # the disk hangs until the test lets it go
        return real_flush_log()

    flusher._flush_log = stuck_flush_log
    errors = []

    def waiter(timeout):
        store.put("test", 0, 0, b"x", NOW)
        try:
            flusher.wait_flushed(store.written_position, timeout=timeout)
        except BrokerError as exc:
            errors.append(str(exc))

    try:
        leader = gevent.spawn(waiter, 60)  # leads the round, which hangs
        gevent.sleep(0.01)
        assert flusher._in_round
        with gevent.Timeout(flusher_module.DEADLINE_CHECK_S * 10):  # a waiter without the deadline loop hangs here
            waiter(0.1)
        assert errors == ["flush did not complete within 0 s"]
        assert not leader.dead  # the stuck round is not cut short
        release.set()
        leader.join(timeout=10)
        assert errors == ["flush did not complete within 0 s"] and failures == []
        assert store.flushed_position == store.written_position  # the given-up put is durable all the same
    finally:
        release.set()
        flusher.stop()
        store.close(NOW)


def test_a_waiter_left_after_stop_gives_up_at_its_deadline(tmp_path):
    """After ``stop`` no round runs; a put written after the final flush is answered with the timeout error
    (the deadline loop lives on while a waiter does), never left waiting for ever."""
    from metaq.errors import BrokerError
    from metaq.server import flusher as flusher_module
    from tests.harness.store import NOW

    store, flusher, failures = _store_and_flusher(tmp_path)
    try:
        flusher.stop()
        store.put("test", 0, 0, b"late", NOW)
        with gevent.Timeout(flusher_module.DEADLINE_CHECK_S * 10):
            with pytest.raises(BrokerError, match="did not complete within"):
                flusher.wait_flushed(store.written_position, timeout=0.1)
        assert failures == []
    finally:
        store.close(NOW)


def test_a_wait_for_a_position_past_the_written_end_is_refused_at_once_and_never_holds_the_loop(tmp_path):
    """A journal's end left past a cut log waits for a position nothing has written: only a cut puts a waited-for
    position there, so the wait is refused at once (it led empty rounds back to back before: a promoted broker's
    loop held for good, no request answered, its ZooKeeper session lost; then it waited out its 30 s, or until
    other records reached the position). A wait up to the written end is answered as before."""
    from metaq.errors import Unavailable
    from tests.harness.store import NOW

    store, flusher, failures = _store_and_flusher(tmp_path)
    try:
        store.put("test", 0, 0, b"first", NOW)
        flusher.wait_flushed(store.written_position)
        rounds, end = flusher.rounds, store.written_position
        started = time.monotonic()
        with pytest.raises(Unavailable, match="the log ends at %d, before position %d" % (end, end + 1)):
            flusher.wait_flushed(end + 1, 10)
        assert time.monotonic() - started < 1.0 and flusher.rounds == rounds  # no round led, no deadline waited out
        store.put("test", 0, 0, b"second", NOW)
        flusher.wait_flushed(store.written_position)  # at the end: answered once flushed
        assert store.flushed_position == store.written_position and failures == []
    finally:
        flusher.stop()
        store.close(NOW)


def test_a_wait_that_begins_after_its_write_was_cut_is_refused_given_the_cuts_read_at_the_write(tmp_path):
    """A wait begun later than its write (a text connection's queued burst, an MQTT acknowledgement writer, a spawned
    sync-replication wait) reads the log's truncations too late: a cut between the write and the wait, then the log
    grown past the position again, would let it be answered as durable. Given ``since`` (``log_cuts`` read right
    after the write) it is refused; a write below the cut is answered with the same ``since``."""
    from metaq.errors import Unavailable
    from tests.harness.store import NOW

    store, flusher, failures = _store_and_flusher(tmp_path)
    try:
        store.put("test", 0, 0, b"kept", NOW)
        kept, kept_cuts = store.written_position, flusher.log_cuts
        store.put("test", 0, 0, b"deposed master's", NOW)
        gone, gone_cuts = store.written_position, flusher.log_cuts
        store.truncate_log(kept, NOW)
        while store.written_position <= gone:
            store.put("test", 0, 0, b"new master's", NOW)
        with pytest.raises(Unavailable, match="cut back before position %d" % gone):
            flusher.wait_flushed(gone, 10, since=gone_cuts)
        flusher.wait_flushed(kept, 10, since=kept_cuts)
        flusher.wait_flushed(gone, 10)  # without it the wait cannot tell (what the callers above must not do)
        assert failures == []
    finally:
        flusher.stop()
        store.close(NOW)


def test_a_wait_for_a_write_the_log_was_cut_below_is_refused_even_when_the_log_grows_past_it(tmp_path):
    """A deposed master's put waits for its flush; the log is cut back before it (its tail was never the new
    master's), then grows past the same position again with the master's records: that put is gone, so the wait
    says so (Unavailable) instead of returning as if it were durable. A wait below the cut is not refused."""
    from metaq.errors import Unavailable
    from tests.harness.store import NOW

    store, flusher, failures = _store_and_flusher(tmp_path)
    try:
        store.put("test", 0, 0, b"kept", NOW)
        kept = store.written_position
        flusher.wait_flushed(kept)
        flusher.stop()  # the puts below stay unflushed while the waiters wait
        store.put("test", 0, 0, b"cut-1", NOW)
        store.put("test", 0, 0, b"cut-2", NOW)
        gone = store.written_position
        below = gevent.spawn(flusher.wait_flushed, kept, 10)
        above = gevent.spawn(flusher.wait_flushed, gone, 10)
        gevent.sleep(0.05)
        store.truncate_log(kept, NOW)
        for _ in range(3):
            store.put("test", 0, 0, b"master's", NOW)
        assert store.written_position > gone
        flusher.start()
        flusher.wake()
        gevent.joinall([below, above], timeout=5)
        assert below.successful()
        assert isinstance(above.exception, Unavailable) and "cut back before position %d" % gone in str(
            above.exception)
        cuts = store.log_cuts
        flusher.wait_flushed(store.written_position)  # a wait that began after the cut is not refused
        assert store.log_cuts == cuts == 1 and failures == []
    finally:
        flusher.stop()
        store.close(NOW)


def test_a_dedicated_thread_answers_each_caller_its_own_outcome_when_one_is_killed_waiting():
    """A caller killed while its job runs (a connection leading a flush round, closed mid-round) must not hand
    its outcome to the next caller, nor leave it none: the next job starts once the killed one is done."""
    worker = DedicatedThread("test-dedicated")
    started = []

    def slow():
        started.append(1)
        time.sleep(0.2)
        return "slow"

    first = gevent.spawn(worker.apply, slow)
    while not started:
        gevent.sleep(0.01)
    first.kill(block=True)  # killed while its job runs in the thread

    def second():
        time.sleep(0.1)  # still running when the killed caller's job has finished and been reported
        return "second"

    assert worker.apply(second) == "second"
    assert worker.apply(lambda x: x * 2, (21,)) == 42
    with pytest.raises(ZeroDivisionError):
        worker.apply(lambda: 1 // 0)
    assert worker.apply(lambda: "after") == "after"
