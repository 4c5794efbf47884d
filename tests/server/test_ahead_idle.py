"""The work-ahead poll slows down while the log stands still (``AheadWorker.IDLE_AFTER_S``, ``IDLE_POLL_S``): an idle
broker's loop woke 100 times a second for it. The first flush round after the quiet (a put's) brings it back at once,
so a burst after the quiet finds its pages prepared as before."""

import gevent

from metaq.server.flusher import AheadWorker, Flusher
from metaq.storestate import open_store
from tests.harness.store import NOW, small_config


def _setup(tmp_path, monkeypatch, idle_after=0.05, idle_poll=0.25):
    monkeypatch.setattr(AheadWorker, "IDLE_AFTER_S", idle_after)
    monkeypatch.setattr(AheadWorker, "IDLE_POLL_S", idle_poll)
    store = open_store(small_config(tmp_path / "data", flush="sync"), NOW)
    flusher = Flusher(store, store.config, on_visible=lambda changed: None, on_failure=lambda: None)
    ahead = AheadWorker(store, observe_flushes=flusher.observe_flushes)
    flusher.start()
    ahead.start()
    return store, flusher, ahead


def _stop(store, flusher, ahead):
    ahead.stop()
    flusher.stop()
    store.close(NOW)


def _polls_during(ahead, seconds):
    before = ahead.polls
    gevent.sleep(seconds)
    return ahead.polls - before


def test_a_still_log_is_polled_every_idle_poll_and_a_moving_one_every_poll(tmp_path, monkeypatch):
    store, flusher, ahead = _setup(tmp_path, monkeypatch)
    try:
        gevent.sleep(0.2)  # past IDLE_AFTER_S with nothing written
        idle = _polls_during(ahead, 1.0)
        assert 2 <= idle <= 6  # every 0.25 s (10 ms polls would be ~100)

        def producer():
            for i in range(200):
                store.put("test", 0, 0, b"m%d" % i, NOW)
                gevent.sleep(0.005)

        g = gevent.spawn(producer)
        busy = _polls_during(ahead, 0.6)
        g.join()
        assert busy >= 20  # back to POLL_S while the log moves
    finally:
        _stop(store, flusher, ahead)


def test_the_first_flush_round_after_the_quiet_wakes_it_at_once(tmp_path, monkeypatch):
    store, flusher, ahead = _setup(tmp_path, monkeypatch, idle_poll=30.0)
    try:
        gevent.sleep(0.2)
        before = ahead.polls
        gevent.sleep(0.2)
        assert ahead.polls == before  # asleep for IDLE_POLL_S
        store.put("test", 0, 0, b"after the quiet", NOW)
        flusher.wait_flushed(store.written_position)
        gevent.sleep(0.05)
        assert ahead.polls > before  # the round woke it, 30 s early
    finally:
        _stop(store, flusher, ahead)


def test_stop_ends_an_idle_poll_at_once(tmp_path, monkeypatch):
    store, flusher, ahead = _setup(tmp_path, monkeypatch, idle_poll=30.0)
    gevent.sleep(0.2)
    with gevent.Timeout(5):  # not the 30 s of the idle poll
        _stop(store, flusher, ahead)
