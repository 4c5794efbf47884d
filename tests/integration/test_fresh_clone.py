"""A fresh clone's `make run` reaches `version` with the broker's own packages only (README "First run")."""

import os
import pathlib
import re
import signal
import socket
import subprocess
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NEVER_ANSWERS_S = 600  # a safety net (pip's cache is reused); the README gives the measured time


def version_answers(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(b"version 1\r\n")
            return s.recv(64).startswith(b"result 200")
    except OSError:
        return False


@pytest.mark.slow
def test_make_run_in_a_fresh_clone_answers_version_with_only_the_core_packages(tmp_path):
    clone = tmp_path / "metaq"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)  # HEAD: commit first
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the broker writes none itself: what is there, make run compiled
    log = tmp_path / "make-run.log"
    with open(log, "wb") as out:
        make = subprocess.Popen(["make", "run", "ARGS=--port 0 --http-port 0 --mqtt-port 0 --data-dir %s"
                                 % (tmp_path / "data")],
                                cwd=str(clone), env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    broker_pid = port = None
    try:
        deadline = time.monotonic() + NEVER_ANSWERS_S
        while not (port and version_answers(port)):
            assert make.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            found = re.search(r"ready on 127\.0\.0\.1:(\d+)", log.read_text())
            port = int(found.group(1)) if found else None
            time.sleep(0.2)
        broker_pid = int(re.search(r"^pid (\d+)", stats(port), re.M).group(1))
    finally:
        if broker_pid:
            os.kill(broker_pid, signal.SIGTERM)  # the broker by its own PID; make then ends with it
        else:
            os.killpg(make.pid, signal.SIGTERM)
        make.wait(60)
    assert broker_pid and "broker stopped cleanly" in log.read_text()
    assert (clone / ".venv" / ".core").exists() and not (clone / ".venv" / ".installed").exists()
    pip = subprocess.run([str(clone / ".venv" / "bin" / "python"), "-m", "pip", "list", "--format=freeze"],
                         capture_output=True, text=True, check=True).stdout.lower()
    names = {line.split("==")[0] for line in pip.splitlines()}
    assert {"metaq", "gevent", "kazoo", "pydantic"} <= names, names
    assert not names & {"pyspark", "pytest", "pandas", "pyarrow", "fabric", "psycopg", "rocketmq"}, names
    assert "C helper loaded" in log.read_text()  # built by the core install
    assert list((clone / "metaq" / "server" / "__pycache__").glob("broker.*.pyc"))  # docs/development.md


def stats(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"stats\r\nquit\r\n")
        return s.makefile("rb").read().decode("utf-8", "replace")
