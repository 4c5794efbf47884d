"""Fixtures for the deploy tests: a real sshd on 127.0.0.1 and 127.0.0.2 (``fab`` itself: ``tests/harness/fab.py``)."""

import pytest

from tests.harness.fab import remove_package_sources
from tests.harness.sshd import SshServer, sshd_missing_reason


@pytest.fixture(scope="session", autouse=True)
def _remove_package_source():
    yield
    remove_package_sources()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory):
    """Debian's sshd listening on 127.0.0.1 and 127.0.0.2 (one port), root's login by a generated key."""
    reason = sshd_missing_reason()
    if reason:
        pytest.skip(reason)
    server = SshServer(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()
