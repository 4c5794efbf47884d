"""Fixtures of the MQTT tests: fixtures only."""

import pytest

from tests.harness.mqtt import close_all


@pytest.fixture(autouse=True)
def _paho_clients_closed():
    """Every Paho client a test started is closed when it ends (its network thread would reconnect otherwise)."""
    yield
    close_all()
