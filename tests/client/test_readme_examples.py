"""The examples of docs/python-client.md run as written against a broker configured like `make run`."""

import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

from metaq.client.local import BrokerProcess, free_port
from tests.harness.docs import read

ROOT = pathlib.Path(__file__).resolve().parents[2]


def client_section():
    return read("python-client.md")


def python_blocks():
    return re.findall(r"```python\n(.*?)```", client_section(), re.S)


def admin_commands():
    return [line[2:] for line in re.findall(r"^\$ metaq-admin [^\n]*", client_section(), re.M)]


@pytest.fixture
def make_run_broker(tmp_path):
    """conf/server.yaml as `make run` uses it, on a free port and a temporary data dir."""
    with open(ROOT / "conf" / "server.yaml") as f:
        cfg = yaml.safe_load(f)
    cfg["broker"]["port"] = 0
    cfg["broker"]["data_dir"] = str(tmp_path / "data")
    if (cfg.get("http") or {}).get("port"):
        cfg["http"]["port"] = free_port()  # conf/server.yaml's 8180 may be taken (make run, another test)
    cfg["mqtt"]["port"] = 0  # and its 1883
    b = BrokerProcess(tmp_path, cfg).start()
    yield b
    b.kill()


@pytest.mark.integration
@pytest.mark.slow
def test_readme_client_examples_run_as_written(make_run_broker, tmp_path):
    url = "127.0.0.1:%d" % make_run_broker.port
    blocks = python_blocks()
    assert len(blocks) >= 4, "the client guide lost its examples"
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=str(ROOT))
    outputs = []
    for code in blocks:
        assert "127.0.0.1:8123" in code
        out = subprocess.run([sys.executable, "-c", code.replace("127.0.0.1:8123", url)], cwd=str(tmp_path),
                             env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, "example failed:\n%s\n%s" % (code, out.stderr)
        outputs.append(out.stdout)
    produce, group, pull, pop, broadcast, local_tx, xa_branch = outputs[:7]
    first = produce.splitlines()[0].split()
    assert first[:3] == ["True", "0-0", "0"]
    assert produce.splitlines()[1] == "True"
    keyed = [line for line in produce.splitlines() if re.fullmatch(r"0-\d", line)]
    assert len(keyed) == 3 and len(set(keyed)) == 1  # one key, one partition
    assert "b'fire and forget'" in group and "0-0 0 new b'order 1'" in group
    assert "{('orders', Partition(broker_id=0, partition=0)): 0}" in group
    assert pull.splitlines()[0].split()[0] == "0" and pull.splitlines()[0].endswith("b'order 1'")
    assert broadcast.strip() == "True"
    assert local_tx == ""
    assert xa_branch.splitlines() == ["[Xid(format_id=1, gtrid=b'order-42', bqual=b'metaq')]", "[]"]
    assert " 1 b'order 1'" in pop  # received once (attempt 1) by the SimpleConsumer
    compressed = outputs[8].splitlines()  # after the replay example
    assert int(compressed[0]) < 1000 and compressed[1] == "True", compressed
    assert outputs[9].strip() == "True"  # sent in batches
    assert outputs[10].splitlines() == ["True 50000", "True"]  # send_many
    assert outputs[11].strip() == "True"  # pulled in batches
    for command in admin_commands():
        if "--zk" in command:
            continue  # needs a broker registered in ZooKeeper: covered by tests/client/test_admin.py
        if "transactions commit" in command:
            continue  # decides a real in-doubt branch: covered by tests/integration/test_transactions.py
        args = command.split("#", 1)[0].split()[1:]  # a shell comment is not an argument
        args = [a.replace("127.0.0.1:8123", url) for a in args]
        out = subprocess.run([sys.executable, "-m", "metaq.admincli"] + args, env=env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, (command, out.stderr)
        if args[-1] == "topics":
            assert re.search(r"^orders\s+0\s+1\s+10[0-9]\s", out.stdout, re.M), out.stdout
        if args[-1] == "groups":
            assert re.search(r"^billing\s+offsets\s+orders\s+0-0\s+-?\s*\d+", out.stdout, re.M), out.stdout
