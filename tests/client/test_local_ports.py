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
