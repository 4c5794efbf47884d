"""The official client's subprocess harness: a run fails unless it exited 0, except for the C++ library's own abort
in a producer's shutdown after every send was reported."""

import subprocess
import sys

import pytest

from bench.rocketmq_peer import finish_peer

pytestmark = pytest.mark.integration  # it runs child processes

ABORT = "terminate called after throwing an instance of 'boost::thread_interrupted'\n"


def child(out, err, code):
    script = "import os, sys; sys.stdout.write(%r); sys.stderr.write(%r); sys.stdout.flush(); sys.stderr.flush(); " \
             "os.kill(os.getpid(), 6) if %d == -6 else os._exit(%d)" % (out, err, code, max(code, 0))
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_an_abort_in_shutdown_after_done_is_the_librarys_and_the_lines_are_returned():
    lines = finish_peer(child('{"i": 0, "status": 0}\n{"done": true}\n', ABORT, -6), timeout=30)
    assert lines == [{"i": 0, "status": 0}, {"done": True}]


@pytest.mark.parametrize("out, err, code", [
    ('{"i": 0, "status": 0}\n', ABORT, -6),  # aborted before it said done: its sends are not all reported
    ('{"done": true}\n', "Segmentation fault\n", -6),  # another abort
    ('{"done": true}\n', ABORT, 1),  # not the abort
    ('{"done": true}\n', "", 3),
])
def test_any_other_failure_fails_the_run(out, err, code):
    with pytest.raises(AssertionError, match="RocketMQ peer failed"):
        finish_peer(child(out, err, code), timeout=30)


def test_a_failed_runs_report_quotes_the_client_logs_warnings_and_errors(tmp_path):
    """The C++ client tells its caller only "No route info of this topic"; its reason is in its log, so the report
    of a failed run quotes that log's last warning and error lines."""
    logs = tmp_path / "logs" / "rocketmq-cpp"
    logs.mkdir(parents=True)
    (logs / "1_rocketmq-cpp.log.0").write_text(
        "[t](info):connect[connect:172]\n"
        "[t](warning):can not connect to server:127.0.0.1:9[CreateTransport:343]\n"
        "[t](error):send message to broker timeout[invokeSync:9]\n")
    proc = child("", "No route info of this topic: tC\n", 1)
    proc.peer_home = str(tmp_path)
    with pytest.raises(AssertionError) as failed:
        finish_peer(proc, timeout=30)
    report = str(failed.value)
    assert "can not connect to server:127.0.0.1:9" in report and "send message to broker timeout" in report
    assert "(info)" not in report
