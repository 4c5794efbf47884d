"""The mistakes a newcomer makes on a first `metaq-server`, each answered by one clear line (README "First run").

Each is run as a real ``metaq-server`` process: the line it prints and its exit code (2: the user's to fix).
"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from metaq.client.local import free_port
from metaq.errors import ConfigError
from metaq.server.config import load_config


def run_cli(*args, cwd=None, timeout=30):
    return subprocess.run([sys.executable, "-m", "metaq.server", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def one_line(r):
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr
    return lines[0]


# -- unit: the messages as load_config builds them ----------------------------------------------------------

def test_a_bad_flag_value_is_blamed_on_the_flag_not_on_the_defaults():
    with pytest.raises(ConfigError) as info:
        load_config(None, {"broker.port": 70000}, {"broker.port": "--port 70000"})
    assert str(info.value) == "invalid --port 70000: Input should be less than or equal to 65535"


def test_a_scalar_where_a_section_belongs_names_the_section_and_what_it_holds(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("broker: 8141\nzk: localhost\ntopics: 5\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(f))
    text = str(info.value)
    assert "broker: expected a mapping of settings (id, host, port, ...), got 8141" in text
    assert "zk: expected a mapping of settings (connect, root, session_timeout_ms, ...), got 'localhost'" in text
    assert "topics: expected a list, got 5" in text
    assert "BrokerSection" not in text and "dictionary" not in text


def test_log_level_in_any_case(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("broker:\n  log_level: warning\n")
    assert load_config(str(f)).broker.log_level == "WARNING"
    assert load_config(None, {"broker.log_level": "Debug"}).broker.log_level == "DEBUG"
    with pytest.raises(ConfigError, match="broker.log_level"):
        load_config(None, {"broker.log_level": "verbose"})


# -- real metaq-server processes ----------------------------------------------------------------------------

@pytest.mark.integration
def test_port_out_of_range_names_the_flag(tmp_path):
    line = one_line(run_cli("--port", "70000", cwd=str(tmp_path)))
    assert line == "metaq-server: invalid --port 70000: Input should be less than or equal to 65535"
    assert os.listdir(tmp_path) == []  # nothing started, no ./data


@pytest.mark.integration
def test_a_misspelt_key_names_the_nearest_setting(tmp_path):
    f = tmp_path / "server.yaml"
    f.write_text("brokr:\n  port: 0\nstore:\n  flsuh: async\n")
    line = one_line(run_cli("-c", str(f), cwd=str(tmp_path)))
    assert line == ("metaq-server: invalid configuration in %s: store.flsuh: unknown setting; did you mean `flush`?; "
                    "brokr: unknown section; did you mean `broker`?" % f)
    assert os.listdir(tmp_path) == ["server.yaml"]  # nothing started, no ./data


@pytest.mark.integration
def test_a_data_dir_that_is_a_file(tmp_path):
    (tmp_path / "data").write_text("my notes\n")
    line = one_line(run_cli("--port", "0", "--data-dir", "data", cwd=str(tmp_path)))
    assert line == ("metaq-server: data_dir data is a file, not a directory: give broker.data_dir (--data-dir) "
                    "a directory")
    assert (tmp_path / "data").read_text() == "my notes\n"  # left as it was
    line = one_line(run_cli("--port", "0", "--data-dir", "data/broker", cwd=str(tmp_path)))
    assert "data_dir data/broker: %s is a file, not a directory" % (tmp_path / "data") in line


@pytest.mark.integration
def test_a_scalar_for_the_broker_section(tmp_path):
    f = tmp_path / "server.yaml"
    f.write_text("broker: 8141\n")
    line = one_line(run_cli("-c", str(f), cwd=str(tmp_path)))
    assert line == ("metaq-server: invalid configuration in %s: broker: expected a mapping of settings "
                    "(id, host, port, ...), got 8141" % f)


@pytest.mark.integration
def test_a_config_file_that_is_not_a_mapping_or_missing(tmp_path):
    f = tmp_path / "server.yaml"
    f.write_text("port 8123\n")
    assert one_line(run_cli("-c", str(f))) == \
        "metaq-server: configuration file %s must contain a mapping at the top level" % f
    assert one_line(run_cli("-c", str(tmp_path / "nope.yaml"))) == \
        "metaq-server: cannot read configuration file %s: No such file or directory" % (tmp_path / "nope.yaml")


@pytest.mark.integration
def test_log_level_flag_in_lower_case_is_accepted(tmp_path):
    r = run_cli("--log-level", "debug", "--check-config", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "log_level: DEBUG" in r.stdout


@pytest.mark.integration
def test_a_port_in_use(tmp_path):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        r = run_cli("--port", str(port), "--data-dir", str(tmp_path / "data"), cwd=str(tmp_path))
    finally:
        holder.close()
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    errors = [line for line in r.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and errors[0].endswith(
        "cannot start: 127.0.0.1:%d is already in use (another metaq-server, or another program: `ss -ltnp` "
        "shows which); choose another broker.port (--port), or 0 for any free port" % port), r.stderr


@pytest.mark.integration
def test_zookeeper_down_is_one_clear_line_and_the_broker_serves(tmp_path):
    """kazoo's retry lines stay at DEBUG; the broker says once that ZooKeeper does not answer, then serves."""
    nobody = free_port()  # nothing listens there
    conf = tmp_path / "server.yaml"
    conf.write_text("broker: {port: 0, data_dir: %s}\nzk: {connect: '127.0.0.1:%d', connection_timeout_ms: 1500}\n"
                    % (tmp_path / "data", nobody))
    err = tmp_path / "stderr"
    with open(err, "wb") as f:
        proc = subprocess.Popen([sys.executable, "-m", "metaq.server", "-c", str(conf)], stderr=f)
    try:
        deadline = time.monotonic() + 60  # a safety net: the wait is for the "ready" line
        while " ready on " not in err.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, err.read_text()
            time.sleep(0.1)
        text = err.read_text()
        assert " ready on " in text, text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    before_ready = text[:text.index(" ready on ")]
    assert "kazoo" not in before_ready, before_ready
    zk_lines = [line for line in before_ready.splitlines() if "ZooKeeper" in line]
    assert len(zk_lines) == 1, zk_lines
    assert zk_lines[0].endswith("WARNING metaq.server.registry: ZooKeeper at 127.0.0.1:%d not reachable after 1.5 s "
                                "(Connection dropped: socket connection error: Connection refused); serving "
                                "without it, registering as soon as it answers" % nobody)
