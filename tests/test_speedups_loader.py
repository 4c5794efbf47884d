"""The optional C helper is chosen, or its Python twin, as the environment says (metaq/speedups.py)."""

import os
import subprocess
import sys

import pytest

from metaq import speedups

CODE = "from metaq.protocol import burst; from metaq.store import batch, gather; " \
       "print(burst.scan_puts is burst.scan_puts_py, batch.write_run is batch.write_run_py, " \
       "gather.gather_records is gather.gather_records_py)"


def run(env_value):
    env = {"METAQ_PURE_PYTHON": env_value, "PATH": "/usr/bin:/bin"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True,
                          check=True).stdout.split()


@pytest.mark.integration
def test_pure_python_when_asked():
    assert run("1") == ["True", "True", "True"]


@pytest.mark.integration
@pytest.mark.skipif(not speedups.built(), reason="metaq.native._bytes was not built")
def test_the_c_helper_when_built():
    assert run("0") == ["False", "False", "False"]


ACKS = "from metaq.protocol import burst; print(burst.encode_put_acks is burst.encode_put_acks_py)"


def run_acks(env_value):
    env = {"METAQ_PURE_PYTHON": env_value, "PATH": "/usr/bin:/bin"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return subprocess.run([sys.executable, "-c", ACKS], env=env, capture_output=True, text=True,
                          check=True).stdout.split()


def test_burst_acks_follow_the_same_choice():
    assert run_acks("1") == ["True"]
    if speedups.built():
        assert run_acks("0") == ["False"]


RECOVERY = ("from metaq.store import mapped, recovery_scan as r; "
            "print(r.scan_log is r.scan_log_py, r.write_units is r.write_units_py, "
            "mapped.nonzero_end is mapped.nonzero_end_py)")


def test_recovery_scan_follows_the_same_choice():
    env = {"PATH": "/usr/bin:/bin"}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]

    def chosen(value):
        return subprocess.run([sys.executable, "-c", RECOVERY], env=dict(env, METAQ_PURE_PYTHON=value),
                              capture_output=True, text=True, check=True).stdout.split()

    assert chosen("1") == ["True", "True", "True"]
    if speedups.built():
        assert chosen("0") == ["False", "False", "False"]
