"""docs/operating.md "JSON API and HTTP put/get": every curl example runs as written against make run's broker
(conf/server.yaml, its HTTP port moved to a free one) and ends."""

import pathlib
import re
import shutil
import subprocess

import yaml

from metaq.client.local import BrokerProcess, free_port
from tests.harness.docs import section as doc_section

ROOT = pathlib.Path(__file__).resolve().parents[2]


def curl_examples():
    section = doc_section("operating.md", "JSON API and HTTP put/get")
    return [line[2:] for line in re.findall(r"^\$ curl [^\n]*", section, re.M)]


def test_the_readmes_curl_examples_run_against_make_runs_broker(tmp_path):
    curl = shutil.which("curl")
    assert curl, "curl is not installed"
    with open(ROOT / "conf" / "server.yaml") as f:
        cfg = yaml.safe_load(f)
    assert cfg["http"]["port"] == 8180 and cfg["broker"]["host"] == "127.0.0.1"
    port = free_port()
    cfg["broker"].update(port=0, data_dir=str(tmp_path / "data"))
    cfg["http"]["port"] = port
    cfg["mqtt"]["port"] = 0  # conf/server.yaml's 1883 may be taken
    b = BrokerProcess(tmp_path, cfg).start()
    try:
        examples = curl_examples()
        assert len(examples) >= 8
        out = []
        for line in examples:
            assert "127.0.0.1:8180" in line
            r = subprocess.run(line.replace("127.0.0.1:8180", "127.0.0.1:%d" % port), shell=True,
                               capture_output=True, timeout=60)
            assert r.returncode == 0, (line, r.stderr)
            out.append(r.stdout)
    finally:
        b.kill()
    assert b'"partition": 0, "offset": 0' in out[0]
    assert b'"attribute": "greeting"' in out[1]
    assert out[2] == b"hello over http"
    assert b'"topic": "demo"' in out[3]
    said = dict(zip(examples, out, strict=True))
    assert said["curl -s http://127.0.0.1:8180/readyz"] == b"ready\n"
    admin = [(line, said[line]) for line in examples if "-X PUT" in line or "offsets" in line or "-X DELETE" in line]
    assert [line.split("'")[0].split()[-1] for line, _ in admin] == ["PUT", "POST", "DELETE"]
    assert b'"name": "http-demo"' in admin[0][1] and b'"partitions": 2' in admin[0][1]
    assert b'"executed": false' in admin[1][1] and b'"new": 0' in admin[1][1]  # a dry run
    assert b'"deleted": true' in admin[2][1]
