"""metaq-server's command line and configuration."""

import subprocess
import sys

import pytest
import yaml

import metaq
from metaq.errors import ConfigError
from metaq.server.config import load_config
from tests.server.test_config import SHIPPED_ON_PURPOSE


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "metaq.server", *args], capture_output=True, text=True,
                          timeout=30, cwd=cwd)


@pytest.mark.integration
def test_help_and_version():
    r = run_cli("--help")
    assert r.returncode == 0 and "--data-dir" in r.stdout and "--flush {sync,async}" in r.stdout
    r = run_cli("--version")
    assert r.returncode == 0 and r.stdout.strip() == "metaq-server %s" % metaq.__version__


def test_defaults_match_the_documented_ones():
    c = load_config(None)
    assert (c.broker.host, c.broker.port, c.broker.data_dir, c.store.flush) == ("127.0.0.1", 8123, "./data", "sync")


def test_shipped_config_is_valid_and_equals_the_defaults_it_documents():
    shipped = load_config("conf/server.yaml")
    laptop = {key: value for (section, key), value in SHIPPED_ON_PURPOSE.items() if section == "store"}
    assert shipped.store == load_config(None).store.model_copy(update=laptop)  # sizes for a laptop (test_config.py)
    assert shipped.limits == load_config(None).limits
    assert shipped.delay == load_config(None).delay
    assert shipped.remoting == load_config(None).remoting


@pytest.mark.integration
def test_remoting_port_flag_and_section(tmp_path):
    r = run_cli("--remoting-port", "9876", "--check-config")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["remoting"]["port"] == 9876
    f = tmp_path / "r.yaml"
    f.write_text(yaml.safe_dump({"remoting": {"port": 9876, "send_back_delay_level": 99}}))
    r = run_cli("-c", str(f), "--check-config")
    assert r.returncode == 2 and "remoting.send_back_delay_level" in r.stderr


@pytest.mark.integration
def test_the_grpc_port_flag_sets_grpc_port():
    r = run_cli("--grpc-port", "8081", "--check-config")
    assert r.returncode == 0, r.stderr
    assert yaml.safe_load(r.stdout)["grpc"]["port"] == 8081
    assert yaml.safe_load(run_cli("--check-config").stdout)["grpc"]["port"] is None  # off unless asked for


@pytest.mark.integration
def test_flags_override_the_file(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"broker": {"port": 9000, "id": 3}, "store": {"flush": "sync"}}))
    r = run_cli("-c", str(f), "--port", "9100", "--flush", "async", "--broker-id", "5",
                "--data-dir", "/tmp/x", "--host", "127.0.0.2", "--check-config")
    assert r.returncode == 0, r.stderr
    out = yaml.safe_load(r.stdout)
    assert out["broker"] == {"id": 5, "host": "127.0.0.2", "port": 9100, "data_dir": "/tmp/x",
                             "log_level": "INFO", "burst_puts": True, "zero_copy_reads": False}
    assert out["store"]["flush"] == "async"


@pytest.mark.integration
@pytest.mark.parametrize("content, words", [
    ({"broker": {"id": 1024}}, "broker.id"),
    ({"broker": {"prot": 1}}, "broker.prot"),
    ({"store": {"flush": "sometimes"}}, "store.flush"),
    ({"topics": [{"name": "../etc", "partitions": 1}]}, "topics.0.name"),
    ({"topics": [{"name": "a", "partitions": 0}]}, "topics.0.partitions"),
    ({"store": {"disk_warn_ratio": 0.95, "disk_danger_ratio": 0.9}}, "disk_warn_ratio"),
    ({"store": {"segment_size": 1 << 20}, "limits": {"max_body_bytes": 2 << 20}}, "max_body_bytes"),
    ({"delay": {"levels": "1s 5x"}}, "delay.levels"),
    ({"remoting": {"port": 70000}}, "remoting.port"),
    ({"remoting": {"retry_queues": 0}}, "remoting.retry_queues"),
    ({"topics": [{"name": "SCHEDULE_TOPIC_XXXX", "partitions": 1}]}, "internal topic for delayed delivery"),
])
def test_invalid_config_is_refused_naming_the_setting(tmp_path, content, words):
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(content))
    with pytest.raises(ConfigError) as info:
        load_config(str(f))
    assert words in str(info.value)
    r = run_cli("-c", str(f), "--check-config")
    assert r.returncode == 2 and words in r.stderr


@pytest.mark.integration
def test_unreadable_and_malformed_files(tmp_path):
    r = run_cli("-c", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "cannot read configuration file" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("broker: [unclosed")
    r = run_cli("-c", str(bad))
    assert r.returncode == 2 and "not valid YAML" in r.stderr


BAD_FILES = {
    "duplicate key": ("broker:\n  port: 0\n  data_dir: {data}\n  port: 0\n", "line 4: key 'port'"),
    "duplicate topic": ("broker: {{port: 0, data_dir: {data}}}\ntopics:\n- {{name: a, partitions: 2}}\n"
                        "- {{name: a, partitions: 3}}\n", "topic 'a' is listed twice"),
    "empty data dir": ("broker: {{port: 0, data_dir: ''}}\n", "broker.data_dir: must not be empty"),
    "max_connections past the fd limit": ("broker: {{port: 0, data_dir: {data}}}\n"
                                          "limits: {{max_connections: 1000000000}}\n", "ulimit -n"),
    "two problems": ("broker: {{port: 0, data_dir: {data}, id: 5000, prot: 1}}\n", "broker.prot"),
}


@pytest.mark.integration
@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_metaq_server_with_a_bad_file_prints_one_line_and_exits_2(tmp_path, case):
    text, words = BAD_FILES[case]
    data = tmp_path / "data"
    f = tmp_path / "bad.yaml"
    f.write_text(text.format(data=data))
    r = run_cli("-c", str(f), cwd=str(tmp_path))  # a real start, not --check-config
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("metaq-server: ") and str(f) in lines[0] and words in lines[0]
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # no broker ran: no data dir, not even ./data
