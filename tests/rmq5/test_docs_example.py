"""docs/rocketmq5.md "With the official Python client": its install lines name the version the tests use and its
script runs as written, under the official client's own virtualenv (``METAQ_RMQ5_PYTHON``, as
tests/rmq5/test_official_client.py runs it), against a broker configured like `make run` with the gRPC port on."""

import os
import re
import subprocess

import pytest
import yaml

from metaq.client.local import BrokerProcess, free_port
from tests.harness.broker import consume_all
from tests.harness.docs import ROOT, blocks, section
from tests.rmq5.test_official_client import client_python

NEVER_ENDS_S = 120  # a safety net against a script that never ends, not a speed check


def page_section():
    return section("rocketmq5.md", "With the official Python client")


def test_the_install_lines_name_the_version_the_tests_and_make_use_in_a_virtualenv_of_its_own():
    text = page_section()
    install = [line for line in text.splitlines() if line.startswith(("python3 -m venv", ".venv-rmq5/bin/pip"))]
    pinned = re.search(r"^RMQ5_CLIENT := (\S+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert install == ["python3 -m venv .venv-rmq5", ".venv-rmq5/bin/pip install %s" % pinned], install
    assert "rocketmq==0.4.4" in text and "cannot share a virtualenv" in text
    assert 'rocketmq==0.4.4",' in (ROOT / "setup.py").read_text()  # the RocketMQ 4 client the page says it clashes with


@pytest.mark.integration
def test_the_script_runs_as_written_with_the_official_client(tmp_path):
    python = client_python()
    [script] = blocks("python", page_section())
    with open(ROOT / "conf" / "server.yaml") as f:
        cfg = yaml.safe_load(f)
    cfg["broker"]["port"] = 0
    cfg["broker"]["data_dir"] = str(tmp_path / "data")
    cfg["http"]["port"] = free_port()  # conf/server.yaml's 8180 and 1883 may be taken (a make run of the reader's)
    cfg["mqtt"]["port"] = free_port()
    cfg["grpc"] = dict(cfg.get("grpc") or {}, port=free_port())  # what make run ARGS="--grpc-port 8081" opens
    b = BrokerProcess(tmp_path, cfg).start()
    try:
        assert "127.0.0.1:8081" in script
        path = tmp_path / "rmq5_first.py"
        path.write_text(script.replace("127.0.0.1:8081", "127.0.0.1:%d" % cfg["grpc"]["port"]))
        out = subprocess.run([python, str(path)], cwd=str(tmp_path), capture_output=True, text=True,
                             timeout=NEVER_ENDS_S, env=dict(os.environ, HOME=str(tmp_path), PYTHONPATH=""))
        with b.client() as c:
            stored = [bytes(r.payload) for r in consume_all(c, "orders", 0)]  # what a text get reads
    finally:
        b.kill()
    assert out.returncode == 0, out.stderr[-3000:]
    sent, received = out.stdout.splitlines()
    assert re.fullmatch(r"sent \S+", sent), out.stdout
    assert received == "received orders paid b'order 7 paid' 1", out.stdout
    assert stored == [b"order 7 paid"], stored
