"""Fixtures of the client tests."""

import pytest


@pytest.fixture
def fake():
    """``fake(handler)`` starts a scripted FakeBroker (error paths only); all are closed at the end."""
    from tests.harness.fake_broker import FakeBroker

    made = []

    def make(handler=lambda event: None):
        f = FakeBroker(handler)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()
