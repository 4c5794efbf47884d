"""Fixtures of the security tests: fixtures only."""

import os

import pytest


@pytest.fixture(autouse=True)
def _no_env_credentials(monkeypatch):
    """Clients read METAQ_* credentials by default: every test here starts from an environment without them."""
    for name in list(os.environ):
        if name.startswith("METAQ_"):
            monkeypatch.delenv(name)
