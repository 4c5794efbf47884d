"""The flusher's dedicated thread: blocking calls run off the event loop."""

import time

import gevent
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
