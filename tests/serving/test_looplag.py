"""The loop-lag probe (``serving.looplag``, stat ``loop_lag_ms``): how late the loop runs work queued in it, or any
work at all while something holds it, the worst over a window, bounded in what it keeps."""

import time

import gevent

from metaq.serving.looplag import LoopLag


def _busy(n, seconds_each):
    """``n`` greenlets queued at once, each holding the loop ``seconds_each`` (a connection's turn that does not
    yield): the loop's queue is ``n * seconds_each`` long."""
    return [gevent.spawn(time.sleep, seconds_each) for _ in range(n)]


def test_an_idle_loop_runs_queued_work_at_once():
    probe = LoopLag(probe_s=0.02, window_s=5)
    probe.start()
    try:
        gevent.sleep(0.3)
        assert 0.0 <= probe.worst_ms() < 250  # (a loaded machine may hold the process a little)
    finally:
        probe.stop()


def test_a_queue_of_a_second_shows_and_leaves_the_window_after_it():
    probe = LoopLag(probe_s=0.02, window_s=1.0)
    probe.start()
    try:
        gevent.sleep(0.1)
        gevent.joinall(_busy(1000, 0.001))  # a second of turns queued ahead of the probe's callback
        gevent.sleep(0.1)
        assert probe.worst_ms() >= 800
        gevent.sleep(1.3)  # past the window: only the quiet probes since count
        assert probe.worst_ms() < 250
    finally:
        probe.stop()


def test_one_turn_that_holds_the_loop_half_a_second_shows():
    """A stall of another kind: one piece of work that does not yield (a long turn, a collector's full pass, the
    process without CPU) holds the probe's own timer too; the probe counts from when that timer was due."""
    probe = LoopLag(probe_s=0.02, window_s=5)
    probe.start()
    try:
        gevent.sleep(0.1)
        gevent.spawn(time.sleep, 0.5).join()
        gevent.sleep(0.1)
        assert probe.worst_ms() >= 400
    finally:
        probe.stop()


def test_the_probe_keeps_one_window_of_samples_and_starts_once():
    probe = LoopLag(probe_s=0.01, window_s=0.1)
    probe.start()
    first = probe._greenlet
    probe.start()
    try:
        assert probe._greenlet is first
        gevent.sleep(0.5)
        assert len(probe._samples) == probe._samples.maxlen == 11
    finally:
        probe.stop()
    assert LoopLag().worst_ms() == 0.0  # before any probe
