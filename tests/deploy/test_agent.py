"""The deploy agent's process handling on this machine: pid files, zombies, SIGTERM and --force; its status of a
real broker."""

import json
import os
import resource
import subprocess
import sys
import time

import pytest
import yaml

from metaq import errors, limits
from metaq.deploy import agent
from metaq.deploy.layout import Layout
from metaq.server.config import check_fd_limit, read_config
from tests.harness.mqttcluster import cluster_config

SLEEPER = "import signal, sys, time\nif sys.argv[2] == 'stubborn': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" \
          "print('ready', flush=True)\ntime.sleep(float(sys.argv[1]))"


@pytest.fixture
def layout(tmp_path):
    layout = Layout(str(tmp_path))
    os.makedirs(os.path.dirname(layout.config))
    with open(layout.config, "w") as f:
        f.write("broker: {host: 127.0.0.1, port: 1}\n")
    return layout


def fake_broker(layout, seconds=30, mode="plain"):
    """A process whose command line names the install's server.yaml, as the broker's does; pid file written."""
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER, str(seconds), mode, "-c", layout.config],
                            stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    os.makedirs(os.path.dirname(layout.pidfile), exist_ok=True)
    with open(layout.pidfile, "w") as f:
        f.write("%d\n" % proc.pid)
    return proc


def test_a_pid_file_counts_only_for_a_live_process_running_this_install(layout):
    assert agent.running_pid(layout) is None  # no pid file
    proc = fake_broker(layout)
    try:
        assert agent.running_pid(layout) == proc.pid
        with open(layout.pidfile, "w") as f:
            f.write("%d\n" % os.getpid())  # a live process, but not this install's broker (a reused pid)
        assert agent.running_pid(layout) is None
        with open(layout.pidfile, "w") as f:
            f.write("garbage\n")
        assert agent.running_pid(layout) is None
    finally:
        proc.kill()
        proc.wait()


def test_a_zombie_counts_as_exited(layout):
    proc = fake_broker(layout, seconds=0.1)
    deadline = time.monotonic() + 10
    while agent._proc_state(proc.pid) != "Z":  # exited, and nobody reaped it yet (we are its parent)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert agent.running_pid(layout) is None
    proc.wait()


def test_stop_sends_sigterm_and_does_not_wait_for_the_reaper(layout):
    proc = fake_broker(layout)
    started = time.monotonic()
    ok, report = agent.stop(layout, timeout=30)
    assert ok and report["state"] == "down" and report["message"].startswith("stopped (pid %d, SIGTERM)" % proc.pid)
    assert time.monotonic() - started < 30  # a zombie (this test has not reaped it) counts as stopped: no timeout
    assert agent._proc_state(proc.pid) == "Z" and not os.path.exists(layout.pidfile)
    assert proc.wait() == -15
    assert agent.stop(layout, timeout=10) == (True, {"state": "down", "message": "not running"})


def test_stop_reports_a_process_that_ignores_sigterm_and_force_kills_it(layout):
    proc = fake_broker(layout, mode="stubborn")
    ok, report = agent.stop(layout, timeout=0.3)
    assert not ok and report["message"] == ("still running 0.3 s after SIGTERM (pid %d); fab stop --force sends SIGKILL"
                                            % proc.pid)
    ok, report = agent.stop(layout, timeout=0.3, force=True)
    assert ok and report["message"].startswith("stopped (pid %d, SIGTERM+SIGKILL)" % proc.pid)
    assert proc.wait() == -9


def test_start_without_a_deployed_release_says_so(layout):
    ok, report = agent.start(layout, timeout=1)
    assert not ok and report["message"] == "not deployed (no %s): run fab deploy" % layout.current


def _agent_status(layout, nofile):
    """``python -m metaq.deploy.agent status`` run under a soft open-files limit of ``nofile``: its report."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    out = subprocess.run([sys.executable, "-m", "metaq.deploy.agent", "status", "--home", layout.home],
                         capture_output=True, text=True, timeout=60,
                         preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, hard)))
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_agent_under_a_low_open_files_limit_finds_nothing_pending_for_a_cluster_broker_running_its_file(
        broker_factory, tmp_path, zk_connect):
    """The agent's own ``ulimit -n`` is not the broker's: under a limit that could not hold an MQTT cluster's
    broker, its status of one (started under its own, higher limit) still finds server.yaml the config it runs
    with, and a changed file still pending."""
    layout = Layout(str(tmp_path / "install"))
    b = broker_factory(cluster_config(tmp_path / "b", 0, zk_connect), workdir=os.path.dirname(layout.config))
    assert b.config_path == layout.config
    agent._write_pidfile(layout, b.proc.pid, ("127.0.0.1", b.port), "r1")
    low = limits.FD_RESERVE
    with pytest.raises(errors.ConfigError, match="too low for this broker"):  # what the broker would say under it
        check_fd_limit(read_config(layout.config), layout.config, nofile=low)
    report = _agent_status(layout, low)
    assert report["ok"] and report["state"] == "up" and report["pid"] == b.proc.pid, report
    assert report["pending"] == [], report
    changed = dict(b.config, limits={"max_connections": 100})
    with open(layout.config, "w") as f:
        yaml.safe_dump(changed, f)
    assert _agent_status(layout, low)["pending"] == ["config"]
