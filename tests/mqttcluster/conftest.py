"""Fixtures of the MQTT cluster tests: fixtures only."""

import pytest

from tests.harness.mqtt import close_all
from tests.harness.mqttcluster import Cluster


@pytest.fixture(autouse=True)
def _paho_clients_closed():
    """Every Paho client a test started is closed when it ends (its network thread would reconnect otherwise)."""
    yield
    close_all()


@pytest.fixture
def cluster(broker_factory, tmp_path, zk_connect):
    """Three masters (broker ids 0, 1, 2) under one ZooKeeper root, each with an MQTT and a replication port, each
    following the two others."""
    return Cluster(broker_factory, tmp_path, zk_connect, 3).start()
