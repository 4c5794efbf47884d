"""Fixtures of the store tests (the helpers they use are in ``tests/harness/store.py``)."""

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
    path = tempfile.mkdtemp(prefix="metaq-store-test-", dir=base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(params=["built", "python"])
def writer(request, monkeypatch):
    """put_burst with the C writer (when built) and with its pure-Python twin."""
    from metaq.store import batch

    if request.param == "python":
        monkeypatch.setattr(batch, "write_run", batch.write_run_py)
    return request.param


@pytest.fixture(params=["built", "python"])
def scanner(request, monkeypatch):
    """Recovery's scan with the C helper (when built) and with its pure-Python twins (store/recovery_scan.py)."""
    from metaq.store import recovery_scan

    if request.param == "python":
        monkeypatch.setattr(recovery_scan, "scan_log", recovery_scan.scan_log_py)
        monkeypatch.setattr(recovery_scan, "write_units", recovery_scan.write_units_py)
    return request.param
