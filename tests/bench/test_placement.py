"""bench/run.py's placement of the latency rows: the client on one CPU, the server on the others, then undone."""

import os
import subprocess
import sys
import time

import pytest

from bench.run import placed

CPUS = sorted(os.sched_getaffinity(0))


@pytest.mark.skipif(len(CPUS) < 2, reason="placement needs two CPUs")
def test_the_server_and_the_client_are_placed_apart_and_put_back():
    child = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                              "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
                              "time.sleep(30)"])
    try:
        tids = lambda: [int(t) for t in os.listdir("/proc/%d/task" % child.pid)]  # noqa: E731
        for _ in range(500):  # its second thread started (a broker has several)
            if len(tids()) == 2:
                break
            time.sleep(0.01)
        assert len(tids()) == 2
        with placed(child.pid):
            assert os.sched_getaffinity(0) == {CPUS[0]}
            assert all(os.sched_getaffinity(t) == set(CPUS[1:]) for t in tids())  # every thread, not the first
        assert os.sched_getaffinity(0) == set(CPUS)
        assert all(os.sched_getaffinity(t) == set(CPUS) for t in tids())
    finally:
        child.kill()
        child.wait()


def _sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])


@pytest.mark.skipif(len(CPUS) < 2, reason="placement needs two CPUs")
def test_placements_nest_every_server_on_the_other_cpus():
    """bench_latency places all its targets at once: the second must not find the client's one CPU and stay
    unplaced (it did: that target shared the client's CPU and its round trips looked 4x faster)."""
    children = [_sleeper(), _sleeper()]
    try:
        with placed(children[0].pid):
            with placed(children[1].pid):
                assert os.sched_getaffinity(0) == {CPUS[0]}
                assert [os.sched_getaffinity(c.pid) for c in children] == [set(CPUS[1:])] * 2
            assert os.sched_getaffinity(0) == {CPUS[0]}  # the outer placement still holds
        assert os.sched_getaffinity(0) == set(CPUS)
        assert [os.sched_getaffinity(c.pid) for c in children] == [set(CPUS)] * 2
    finally:
        for c in children:
            c.kill()
            c.wait()


def test_with_one_cpu_nothing_is_placed(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    calls = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: calls.append((pid, cpus)))
    with placed(12345):
        pass
    assert calls == []
