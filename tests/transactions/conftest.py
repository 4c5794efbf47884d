"""Fixtures of the transaction tests (the helpers they use are in ``tests/harness/tx.py``)."""

import os
import shutil
import tempfile

import pytest

from tests.harness.tx import TxBroker


@pytest.fixture
def fast_root(tmp_path):
    """A directory on tmpfs when available (fsync is free there), else under tmp_path."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else str(tmp_path)
    path = tempfile.mkdtemp(prefix="metaq-tx-test-", dir=base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def tx_broker(tmp_path):
    """An in-process TxBroker over ``tmp_path/data`` (not a broker process: that is the top conftest's ``broker``)."""
    b = TxBroker(tmp_path / "data")
    yield b
    if b.store is not None and not b.store._closed:
        b.crash()


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
