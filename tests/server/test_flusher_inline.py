"""A lone producer's flush round fdatasyncs on the event loop (``Flusher._may_sync_here``): when, how a failure
reads, and how a slow disk's syncs go to the thread (``limits.INLINE_SYNC_SLOW_MS``)."""

import os

import gevent
import pytest

from metaq import limits
from metaq.errors import BrokerError
from metaq.server import flusher as flusher_module
from metaq.server.flusher import Flusher
from metaq.store.store import MessageStore
from tests.harness.store import NOW, small_config


class _Clock:
    """The flusher module's ``time``, with a ``perf_counter`` that moves only when a sync says so."""

    def __init__(self, real):
        self.now = 1000.0
        self.real = real

    def perf_counter(self):
        return self.now

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.fixture(autouse=True)
def clock(monkeypatch):
    """Rounds take no time unless a test says so: whether a round may sync on the loop never depends on how busy
    this machine's disk is."""
    fake = _Clock(flusher_module.time)
    monkeypatch.setattr(flusher_module, "time", fake)
    return fake


def _flusher(tmp_path, name="data"):
    store = MessageStore.open(small_config(tmp_path / name, segment_size=1 << 20, flush="sync"), NOW)
    failures = []
    flusher = Flusher(store, store.config, on_visible=lambda changed: None, on_failure=lambda: failures.append(1))
    if flusher._native is None:
        store.close(NOW)
        pytest.skip("the C helper's sync thread is not in use (METAQ_PURE_PYTHON or not built)")
    flusher.start()
    return store, flusher, failures


def _put_and_wait(store, flusher, body=b"m"):
    store.put("test", 0, 0, body, NOW)
    end = store.written_position
    flusher.wait_flushed(end)
    return end


def _close(store, flusher, clean=True):
    flusher.stop()
    store.close(NOW, clean=clean)


def test_only_a_round_a_lone_producers_put_leads_syncs_on_the_loop(tmp_path):
    store, flusher, failures = _flusher(tmp_path)
    try:
        _put_and_wait(store, flusher)  # a directory fsync may be due first: that round takes the thread either way
        flusher.alone = lambda: True
        before = flusher.here_rounds
        end = _put_and_wait(store, flusher)
        assert store.flushed_position >= end and flusher.here_rounds == before + 1

        flusher.alone = lambda: False  # another connection is open: the thread
        rounds = flusher.rounds
        end = _put_and_wait(store, flusher)
        assert store.flushed_position >= end and flusher.rounds == rounds + 1 and flusher.here_rounds == before + 1

        flusher.alone = lambda: True  # the flusher greenlet's own rounds never block the loop
        store.put("test", 0, 0, b"background", NOW)
        flusher.wake()
        while store.flushed_position < store.written_position:
            gevent.sleep(0.001)
        assert flusher.here_rounds == before + 1 and failures == []
    finally:
        _close(store, flusher)


def test_a_failed_sync_on_the_loop_reads_exactly_as_a_failed_sync_in_the_thread(tmp_path):
    """The same real failure (fdatasync on a FIFO: EINVAL) through both paths: the same refusal, the same sticky
    failure, one attempt, no retry."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    fifo_fd = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    outcomes = {}
    try:
        for here in (True, False):
            store, flusher, failures = _flusher(tmp_path, "data-%s" % here)
            try:
                _put_and_wait(store, flusher)
                real_plan, attempts = store.flush_plan, []

                def failing_plan(real_plan=real_plan, attempts=attempts, store=store):
                    attempts.append(1)
                    real_plan()
                    return store.written_position, [fifo_fd]

                store.flush_plan = failing_plan
                flusher.alone = lambda here=here: here
                rounds_here = flusher.here_rounds
                with pytest.raises(BrokerError) as raised:
                    _put_and_wait(store, flusher, b"lost")
                with pytest.raises(BrokerError):
                    _put_and_wait(store, flusher, b"refused")
                assert attempts == [1] and failures == [1]
                assert flusher.here_rounds == rounds_here + (1 if here else 0)
                outcomes[here] = (str(raised.value), flusher.failure)
            finally:
                _close(store, flusher, clean=False)
    finally:
        os.close(fifo_fd)
    assert outcomes[True] == outcomes[False]
    assert "flush failed" in outcomes[True][0] and "fdatasync failed: Invalid argument" in outcomes[True][1]


@pytest.mark.parametrize("took_ms, slow", [(limits.INLINE_SYNC_SLOW_MS, False),
                                           (limits.INLINE_SYNC_SLOW_MS + 0.001, True)])
def test_after_a_round_slower_than_the_limit_the_next_one_syncs_in_the_thread(tmp_path, clock, took_ms, slow):
    store, flusher, failures = _flusher(tmp_path)
    try:
        _put_and_wait(store, flusher)  # (a directory fsync may be due first)
        native = flusher._native
        real_here = native.sync_fds_here

        def slow_here(fds):
            real_here(fds)
            clock.now += took_ms / 1000.0

        native.sync_fds_here = slow_here
        flusher.alone = lambda: True
        _put_and_wait(store, flusher)
        assert flusher.here_rounds == 1
        native.sync_fds_here = real_here  # the disk is fast again: the next round takes no time
        _put_and_wait(store, flusher)  # after a slow round: in the thread
        assert flusher.here_rounds == (1 if slow else 2)
        _put_and_wait(store, flusher)  # after a fast one: on the loop again
        assert flusher.here_rounds == (2 if slow else 3) and failures == []
    finally:
        _close(store, flusher)
