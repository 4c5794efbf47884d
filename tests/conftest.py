import os

import pytest

from tests.broker_harness import BrokerProcess


@pytest.fixture
def broker_factory(tmp_path):
    """Start real brokers; every one still running is stopped (by its own PID) at the end."""
    started = []

    def make(config=None, workdir=None, extra_args=(), start=True):
        wd = workdir or tmp_path / ("b%d" % len(started))
        os.makedirs(wd, exist_ok=True)
        b = BrokerProcess(wd, config, extra_args)
        started.append(b)
        return b.start() if start else b

    yield make
    for b in started:
        b.kill()


@pytest.fixture
def broker(broker_factory):
    return broker_factory()
