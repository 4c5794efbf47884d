"""README "First run": "Ctrl-C stops the broker (its data stays in ./data)". Ctrl-C sends SIGINT to the
terminal's foreground process group, make and the broker it runs: the broker stops cleanly, make ends, and the
data is there for the next start. (tests/integration/test_fresh_clone.py checks `make run` in a fresh clone.)"""

import os
import pathlib
import re
import signal
import socket
import subprocess
import time

from tests.integration.test_fresh_clone import stats, version_answers

ROOT = pathlib.Path(__file__).resolve().parents[2]


def start_make_run(data, log):
    # -o: the virtualenv this checkout's tests run in is taken as it is (never rebuilt under them)
    with open(log, "ab") as out:
        return subprocess.Popen(["make", "-o", ".venv/.core", "run",
                                 "ARGS=--port 0 --http-port 0 --mqtt-port 0 --data-dir %s" % data], cwd=str(ROOT),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def wait_port(make, log, since=0):
    deadline = time.monotonic() + 120  # a safety net only
    while True:
        text = log.read_text()[since:]
        found = re.search(r"ready on 127\.0\.0\.1:(\d+)", text)
        if found and version_answers(int(found.group(1))):
            return int(found.group(1))
        assert make.poll() is None and time.monotonic() < deadline, text[-3000:]
        time.sleep(0.2)


def test_ctrl_c_to_make_runs_process_group_stops_the_broker_cleanly_and_keeps_its_data(tmp_path):
    data, log = tmp_path / "data", tmp_path / "make-run.log"
    make = start_make_run(data, log)
    try:
        port = wait_port(make, log)
        broker_pid = int(re.search(r"^pid (\d+)", stats(port), re.M).group(1))
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"put ctrlc 0 4 0 1\r\nkept")
            assert s.recv(100).startswith(b"result 200")
        os.killpg(make.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        make.wait(60)
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGTERM)
            make.wait(60)
    text = log.read_text()
    assert "broker stopped cleanly" in text, text[-3000:]
    assert not os.path.exists("/proc/%d" % broker_pid) or \
        open("/proc/%d/stat" % broker_pid).read().split()[2] == "Z", "the broker still runs"
    # its data stays: a second start serves the message
    size = len(log.read_text())
    make = start_make_run(data, log)
    try:
        port = wait_port(make, log, since=size)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"get ctrlc g 0 0 65536 1\r\n")
            assert b"kept" in s.recv(1000)
    finally:
        os.killpg(make.pid, signal.SIGINT)
        make.wait(60)
