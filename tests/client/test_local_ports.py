"""``metaq.client.local.free_port``: the ports handed to brokers a test starts. No broker."""

import pytest

from metaq.client import local


def test_side_by_side_workers_take_disjoint_slices_of_the_fixed_range(monkeypatch):
    low, high = 20000, 32000
    slices = []
    for n in range(3):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw%d" % n)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
        slices.append(local._slice(low, high))
    assert slices == [(20000, 24000), (24000, 28000), (28000, 32000)]
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert local._slice(low, high) == (low, high)  # not a worker: the whole range


@pytest.mark.integration  # it binds each port it checks
def test_a_worker_hands_out_ports_only_from_its_slice(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    low, high = local._slice(local.FIXED_PORTS[0], min(local.FIXED_PORTS[1], local._ephemeral_low()))
    ports = [local.free_port() for _ in range(20)]
    assert all(low <= p < high for p in ports) and len(set(ports)) == 20


@pytest.mark.integration  # it binds each port it checks
def test_a_run_of_ports_is_within_the_slice_and_shares_no_port_with_one_handed_out_before_or_after(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    low, high = local._slice(local.FIXED_PORTS[0], min(local.FIXED_PORTS[1], local._ephemeral_low()))
    held = low + 1000  # handed to a server earlier, down for a restart now: free by any check, still not to be given
    monkeypatch.setattr(local, "_handed_out", {held: None})
    fixed = _Fixed([held - 5])  # the first run tried holds it
    monkeypatch.setattr(local.random, "Random", lambda: fixed)
    base = local.free_port_run(40)
    assert not fixed.picks and base != held - 5  # tried and passed over
    assert held not in range(base, base + 40) and low <= base and base + 40 <= high
    after = [local.free_port() for _ in range(50)]
    assert not set(after) & set(range(base, base + 40))


class _Fixed:
    """A Random whose randrange gives ``picks`` in order, then any port of the range."""

    def __init__(self, picks):
        self.picks = list(picks)

    def randrange(self, low, high):
        import random

        return self.picks.pop(0) if self.picks else random.randrange(low, high)


@pytest.mark.integration  # it binds each port it checks
def test_a_slice_fragmented_by_a_long_run_still_gives_its_one_free_run(monkeypatch):
    """Late in a long test run most of a worker's slice is handed out: the one run left is found, wherever the
    search starts."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    low, high = local._slice(local.FIXED_PORTS[0], min(local.FIXED_PORTS[1], local._ephemeral_low()))
    base = next(b for b in range(low + 137, high - 60)
                if all(local._bindable("127.0.0.1", p) for p in range(b, b + 60)))
    free = range(base, base + 60)  # bindable now: a server this process runs (the run's ZooKeeper) holds no port of it
    monkeypatch.setattr(local, "_handed_out", dict.fromkeys(set(range(low, high)) - set(free)))
    monkeypatch.setattr(local.random, "Random", lambda: _Fixed([high - 60]))  # starts past it: wraps round
    assert local.free_port_run(60) == free[0]


@pytest.mark.integration  # it binds each port it checks
def test_a_slice_handed_out_whole_gives_again_from_its_oldest_half_never_its_newest(monkeypatch):
    """A worker that ran long enough to hand out every port of its slice still starts a cluster: from ports handed
    out long ago (their tests ended), never from those of the tests just before."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    low, high = local._slice(local.FIXED_PORTS[0], min(local.FIXED_PORTS[1], local._ephemeral_low()))
    order = list(range(low, high))
    local.random.Random().shuffle(order)
    monkeypatch.setattr(local, "_handed_out", dict.fromkeys(order))
    newest = set(order[len(order) // 2:])
    base = local.free_port_run(3)
    assert not set(range(base, base + 3)) & newest
    assert list(local._handed_out)[-3:] == [base, base + 1, base + 2]  # now the newest
    monkeypatch.setattr(local, "_handed_out", dict.fromkeys(range(low, high)))
    with pytest.raises(RuntimeError, match="no free run of %d ports" % (high - low)):
        local.free_port_run(high - low)  # more than the oldest half can give
