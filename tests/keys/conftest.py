"""Fixtures of the key index tests (the same as the store tests': ``tests/store/conftest.py``)."""

import os
import shutil
import tempfile

import pytest


@pytest.fixture
def data_dir(tmp_path):
    return tmp_path / "data"


@pytest.fixture
def fast_dir(tmp_path):
    """A directory on tmpfs when available (fsync is free there), for tests that reopen stores many times."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else str(tmp_path)
    path = tempfile.mkdtemp(prefix="metaq-keys-test-", dir=base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
