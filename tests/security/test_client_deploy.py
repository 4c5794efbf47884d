"""The deploy agent against a real broker with authentication on: the inventory's ``credentials:`` (a path on
the host) reaches the agent's command line as a path, the agent's probe authenticates with the file, and
without credentials (or with wrong ones) the agent says so at once instead of waiting out its timeout.

The agent runs exactly as fab runs it over SSH (``hostops.agent``), through a local shell (invoke's Context)
instead of an SSH session."""

import json
import os
import sys
import time

import pytest
import yaml
from invoke import Context

from metaq.client.local import free_port
from metaq.deploy import agent, hostops
from metaq.deploy.inventory import parse_inventory
from metaq.deploy.layout import Layout
from tests.harness.acl import SECRETS, write_acl
from tests.harness.pki import Pki

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def private_yaml(path, doc, mode=0o600):
    path.write_text(yaml.safe_dump(doc))
    path.chmod(mode)
    return str(path)


def script(path, command):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write("#!/bin/sh\nPYTHONPATH=%s exec %s %s \"$@\"\n" % (ROOT, sys.executable, command))
    os.chmod(path, 0o755)


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A broker as `fab deploy` leaves it: install dir, server.yaml rendered from the inventory (authentication
    on, TLS on), a release whose python and metaq-server run this checkout; and the inventory's broker. The
    agent's credentials file names the CA: its probe connects over TLS."""
    for name in list(os.environ):
        if name.startswith("METAQ_"):
            monkeypatch.delenv(name)
    home, data = tmp_path / "inst" / "metaq", tmp_path / "data" / "metaq"
    pki = Pki(tmp_path / "pki")
    tls = {"ca": pki.ca}
    creds = private_yaml(tmp_path / "agent.yaml", {"user": "admin", "secret": SECRETS["admin"], "tls": tls})
    inventory = {"defaults": {"install_dir": str(home), "data_dir": str(data), "credentials": creds,
                              "server": {"security": {"acl_file": write_acl(tmp_path / "acl.yaml"),
                                                      "tls": pki.tls_config("on")},
                                         "store": {"segment_size": 1 << 20, "index_file_units": 4096},
                                         "limits": {"max_body_bytes": 256 * 1024}}},
                 "brokers": [{"name": "b0", "host": "127.0.0.1", "broker_id": 0, "port": free_port()}]}
    broker = parse_inventory(yaml.safe_dump(inventory)).brokers[0]
    assert broker.credentials == creds
    layout = Layout(str(home))
    os.makedirs(os.path.dirname(layout.config))
    with open(layout.config, "w") as f:
        f.write(broker.config_text)
    script(os.path.join(layout.release("r1"), "venv", "bin", "python"), "")
    script(os.path.join(layout.release("r1"), "venv", "bin", "metaq-server"), "-m metaq.server")
    os.symlink(layout.release("r1"), layout.current)
    yield broker, creds
    agent.stop(layout, 10, force=True)


def broker_ca(tmp_path):
    return Pki(tmp_path / "pki").ca  # the fixture's (made once; Pki reuses the files)


def broker_ca_of(creds):
    with open(creds) as f:
        return yaml.safe_load(f)["tls"]["ca"]


def run_agent(broker, command, *options):
    return hostops.agent(Context(), broker, command, *options)


def test_the_agent_probe_authenticates_with_the_inventory_s_credentials(installed, tmp_path):
    broker, creds = installed
    without = broker.__class__(**{**broker.__dict__, "credentials": None})
    started = time.monotonic()
    report = run_agent(without, "start", "--timeout", 120)
    assert not report["ok"] and report["state"] == "unauthenticated", report
    # no credentials file: no TLS either, and this broker speaks TLS only; said at once
    assert "requires TLS" in report["message"] and "`credentials:` in the" in report["message"], report
    assert time.monotonic() - started < 60  # said at once, not after the 120 s timeout

    report = run_agent(broker, "status")
    assert report["ok"] and report["state"] == "up" and report["stats"]["broker_id"] == "0", report

    wrong = private_yaml(tmp_path / "wrong.yaml", {"user": "admin", "secret": "not-the-admin-secret",
                                                   "tls": {"ca": broker_ca(tmp_path)}})
    report = run_agent(broker.__class__(**{**broker.__dict__, "credentials": wrong}), "status")
    assert report["state"] == "unauthenticated" and "refused the credentials of user admin" in report["message"]

    loose = private_yaml(tmp_path / "loose.yaml", {"user": "admin", "secret": SECRETS["admin"],
                                                   "tls": {"ca": broker_ca(tmp_path)}}, mode=0o644)
    report = run_agent(broker.__class__(**{**broker.__dict__, "credentials": loose}), "status")
    assert report["state"] == "error" and "group or others (mode 0644)" in report["message"]

    report = run_agent(broker, "stop", "--timeout", 20)
    assert report["ok"] and report["state"] == "down", report
    report = run_agent(broker, "start", "--timeout", 30)
    assert report["ok"] and report["state"] == "up", report
    for text in (json.dumps(report), broker.__repr__()):
        assert SECRETS["admin"] not in text


def test_the_agent_takes_credentials_from_the_host_environment(installed, monkeypatch, capsys):
    broker, creds = installed
    layout = Layout(broker.install_dir)
    monkeypatch.setenv("METAQ_CREDENTIALS", creds)
    assert agent.main(["start", "--home", layout.home, "--timeout", "30"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["state"] == "up"
    assert agent.main(["status", "--home", layout.home]) == 0
    monkeypatch.delenv("METAQ_CREDENTIALS")
    monkeypatch.setenv("METAQ_TLS_CA", broker_ca_of(creds))  # TLS, but no user: the broker wants one
    assert agent.main(["status", "--home", layout.home]) == 1
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["state"] == "unauthenticated"
