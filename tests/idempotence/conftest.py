"""Fixtures of the idempotent producers' tests (the store's helpers are in ``tests/harness/store.py``)."""

import pytest


@pytest.fixture(params=["built", "python"])
def writer(request, monkeypatch):
    """put_burst with the C writer (when built) and with its pure-Python twin."""
    from metaq.store import batch

    if request.param == "python":
        monkeypatch.setattr(batch, "write_run", batch.write_run_py)
    return request.param
