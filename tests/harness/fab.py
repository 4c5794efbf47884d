"""``fab`` run as an operator runs it, and the inventories the deploy tests give it."""

import os
import shutil
import subprocess
import sys
import tempfile

import pytest
import yaml

from metaq.client.local import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAB = os.path.join(os.path.dirname(sys.executable), "fab")


class FabResult:
    def __init__(self, proc):
        self.code = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr

    def __repr__(self):
        return "exit %d\n--- stdout\n%s--- stderr\n%s" % (self.code, self.out, self.err)

    def line(self, prefix):
        """The first stdout line that starts with ``prefix``."""
        found = [line for line in self.out.splitlines() if line.startswith(prefix)]
        assert found, "no line starting %r in:\n%r" % (prefix, self)
        return found[0]


_SOURCE = []


def package_source():
    """A snapshot of this checkout's package sources, taken once per test run: every deploy in the run
    ships the same package even while someone edits the working tree."""
    if not _SOURCE:
        from metaq.deploy.bundle import source_files

        snapshot = tempfile.mkdtemp(prefix="metaq-deploy-source-")
        for rel in source_files(REPO):
            os.makedirs(os.path.dirname(os.path.join(snapshot, rel)), exist_ok=True)
            shutil.copy2(os.path.join(REPO, rel), os.path.join(snapshot, rel))
        _SOURCE.append(snapshot)
    return _SOURCE[0]


def remove_package_sources():
    """Remove the snapshots ``package_source`` took (the deploy conftest calls it once, at the end of the run)."""
    for snapshot in _SOURCE:
        shutil.rmtree(snapshot, ignore_errors=True)
    del _SOURCE[:]


def run_fab(inventory, *args, timeout=180):
    """``fab`` with the inventory in $METAQ_INVENTORY, as an operator would set it."""
    if not os.path.exists(FAB):
        pytest.skip("fabric is not installed (pip install -e '.[deploy]')")
    env = dict(os.environ, METAQ_INVENTORY=str(inventory), METAQ_DEPLOY_SOURCE=package_source())
    proc = subprocess.run([FAB, "-r", REPO] + [str(a) for a in args], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)
    return FabResult(proc)


def host_python():
    """A Python on "the hosts" (this machine) of the same minor version as ours: the wheels are built by ours."""
    for candidate in ("/usr/bin/python3", getattr(sys, "_base_executable", None), sys.executable):
        if candidate and os.path.exists(candidate):
            out = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                                 text=True).stdout.strip()
            if out == str(sys.version_info[:2]):
                return candidate
    return sys.executable


def two_broker_inventory(root, sshd, zk_connect=None, **per_broker):
    """An inventory dict: masters b0 on 127.0.0.1 and b1 on 127.0.0.2, each with its own dirs and port under root."""
    brokers = []
    for i, host in enumerate(("127.0.0.1", "127.0.0.2")):
        entry = {"name": "b%d" % i, "host": host, "broker_id": i, "role": "master", "port": free_port(host),
                 "install_dir": "%s/host%d/opt/metaq" % (root, i), "data_dir": "%s/host%d/var/metaq" % (root, i)}
        entry.update(per_broker.get(entry["name"], {}))
        brokers.append(entry)
    return {
        "cluster": "test",
        "defaults": {
            "ssh_user": "root", "ssh_port": sshd.port, "ssh_key": sshd.key, "python": host_python(),
            "zk_connect": zk_connect, "start_timeout_s": 30, "stop_timeout_s": 30,
            "server": {
                "store": {"segment_size": 1 << 20, "index_file_units": 4096, "flush": "sync",
                          "checkpoint_interval_ms": 200},
                "limits": {"max_body_bytes": 256 * 1024},
                "zk": {"session_timeout_ms": 6000, "connection_timeout_ms": 5000},
                "topics": [{"name": "*", "partitions": 2}],
            },
        },
        "brokers": brokers,
    }


def write_inventory(path, inventory):
    with open(path, "w") as f:
        yaml.safe_dump(inventory, f, sort_keys=False)
    return path


def pair_inventory(root, sshd, zk_connect=None, ha="manual"):
    """An inventory dict: master m0 on 127.0.0.1 and its slave s0 on 127.0.0.2 (broker id 0), each with its
    own dirs, a free client port and a free replication port."""
    inventory = two_broker_inventory(root, sshd, zk_connect)
    m0, s0 = inventory["brokers"]
    m0.update(name="m0", replication_port=free_port(m0["host"]))
    s0.update(name="s0", role="slave", master="m0", replication_port=free_port(s0["host"]))
    del s0["broker_id"]
    inventory["defaults"]["ha"] = ha
    return inventory
