"""fab over real SSH: a two-broker cluster deployed to 127.0.0.1 and 127.0.0.2, operated as an operator would.

Both "hosts" are this machine (Debian's sshd on both addresses); each broker has its own
install dir, data dir and port under a temporary directory, and registers in a real ZooKeeper.
"""

import os
import re
import signal
import socket
import subprocess
import threading
import time

import pytest
import yaml

from metaq.client import Message, Producer
from metaq.deploy import agent, units
from metaq.deploy.layout import Layout
from metaq.server.config import ServerConfig
from metaq.protocol import stats as stats_codec
from metaq.client.raw import TextClient
from tests.harness.broker import consume_all, wait_for
from tests.harness.fab import run_fab, two_broker_inventory, write_inventory

pytestmark = pytest.mark.slow
pytest.importorskip("fabric")

TOPIC = "deploy-test"


class Cluster:
    """The test cluster's inventory and what a test checks on the "hosts"."""

    def __init__(self, root, sshd, zk_connect):
        self.root = root
        self.sshd = sshd
        self.inventory = two_broker_inventory(root, sshd, zk_connect)
        self.path = write_inventory(root / "cluster.yaml", self.inventory)
        self.brokers = {b["name"]: b for b in self.inventory["brokers"]}

    def fab(self, *args, inventory=None):
        return run_fab(inventory or self.path, *args)

    def deploy(self):
        r = self.fab("deploy")
        assert r.code == 0, r
        return r

    def urls(self):
        return ["meta://%s:%d" % (b["host"], b["port"]) for b in self.brokers.values()]

    def pid(self, name):
        try:
            with open(os.path.join(self.brokers[name]["install_dir"], "run", "metaq.pid")) as f:
                return int(f.read())
        except FileNotFoundError:
            return None

    def status(self, *args, inventory=None, expect_code=0):
        """{broker name: {column: value}} from `fab status`'s table."""
        r = self.fab("status", *args, inventory=inventory)
        assert r.code == expect_code, r
        return status_table(r)

    def held(self, name):
        """{(partition, offset): payload} of everything broker ``name`` stores for TOPIC."""
        b = self.brokers[name]
        out = {}
        with TextClient(b["host"], b["port"]) as c:
            for row in stats_codec.parse_offsets(c.stats("offsets").encode()):
                if row.topic == TOPIC:
                    p = row.partition
                    for offset, rec in enumerate(consume_all(c, TOPIC, p)):
                        out[p, offset] = rec.payload
        return out

    def files(self):
        """{path: mtime_ns} of everything under both install dirs (symlinks not followed)."""
        found = {}
        for b in self.brokers.values():
            for top, dirs, names in os.walk(b["install_dir"]):
                for name in dirs + names:
                    path = os.path.join(top, name)
                    found[path] = os.lstat(path).st_mtime_ns
        return found

    def kill_leftovers(self):
        """SIGKILL any broker `fab stop` left running (by its own pid, checked to be this install's broker)."""
        for name, b in self.brokers.items():
            pid = self.pid(name)
            if pid and agent.is_ours(pid, Layout(b["install_dir"])):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def deployed_cluster(sshd, zk_server, tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"), sshd, zk_server.chroot())
    yield c
    c.fab("stop")
    c.kill_leftovers()


def status_table(r):
    """{broker name: {column: value}} from the status table in a fab run's output."""
    lines = r.out.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith("BROKER ")), None)
    assert at is not None, r
    header = lines[at].split()
    assert header == ["BROKER", "HOST", "PORT", "ROLE", "STATE", "PID", "VERSION", "UPTIME", "TOPICS",
                      "MESSAGES", "ZOOKEEPER", "LINK", "REPL_LAG", "PENDING"], r
    rows = {}
    for line in lines[at + 2:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != len(header):
            break
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def listening(host, port):
    try:
        socket.create_connection((host, port), timeout=0.5).close()
        return True
    except OSError:
        return False


def test_deploy_start_write_rolling_restart_stop(deployed_cluster):
    cluster = deployed_cluster
    r = cluster.deploy()
    assert re.search(r"^package: metaq 0\.1\.0, id [0-9a-f]{12} \(\d+ wheels", r.out, re.M), r
    for name in ("b0", "b1"):
        assert re.match(r"\[%s\] (installed metaq 0\.1\.0 .*server\.yaml updated|unchanged)" % name,
                        r.line("[%s]" % name)), r

    r = cluster.fab("start", "status")
    assert r.code == 0, r
    assert re.match(r"\[b0\] started \(pid \d+\) in [\d.]+ s", r.line("[b0]")), r
    assert re.match(r"\[b1\] started \(pid \d+\) in [\d.]+ s", r.line("[b1]")), r
    before = {name: cluster.pid(name) for name in cluster.brokers}
    rows = status_table(r)
    for name, row in rows.items():
        assert row["STATE"] == "up" and row["PID"] == str(before[name]), rows
        assert row["VERSION"] == "0.1.0" and row["ZOOKEEPER"] == "connected", rows
        assert row["ROLE"] == "master" and row["LINK"] == "-" and row["REPL_LAG"] == "-", rows
        assert row["PENDING"] == "-", rows

    # A producer keeps sending to both brokers (failing over) while they restart one at a time.
    results, stop = [], threading.Event()

    def produce():
        with Producer(brokers=cluster.urls(), retry_deadline=15.0) as producer:
            i = 0
            while not stop.is_set():
                body = b"m-%06d" % i
                results.append((body, producer.send(Message(TOPIC, body))))
                i += 1

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    wait_for(lambda: len(results) >= 100, timeout=30, what="100 sends before the restart")
    sent_before = len(results)
    r = cluster.fab("rolling-restart")
    sent_during = len(results) - sent_before
    assert r.code == 0, r
    for name in ("b0", "b1"):
        assert re.match(r"\[%s\] stopped \(pid %d, SIGTERM\) in [\d.]+ s, then started \(pid \d+\)"
                        % (name, before[name]), r.line("[%s]" % name)), r
    count = len(results)
    wait_for(lambda: len(results) >= count + 100, timeout=30, what="100 sends after the restart")
    stop.set()
    thread.join(30)
    assert sent_during > 0, "the producer was not sending during the rolling restart"

    failed = [(body, res) for body, res in results if not res.success]
    assert failed == []
    held = {int(name[1:]): cluster.held(name) for name in cluster.brokers}
    lost = [(body, res) for body, res in results
            if held[res.partition.broker_id].get((res.partition.partition, res.offset)) != body]
    assert lost == [], "%d of %d acknowledged messages are not where their ack said" % (len(lost), len(results))
    assert all(held.values()), "both brokers took messages"

    after = {name: cluster.pid(name) for name in cluster.brokers}
    assert all(after[n] != before[n] for n in before), (before, after)
    r = cluster.fab("status", "logs", "--lines", "5", "--only", "b1")
    assert r.code == 0, r
    rows = status_table(r)
    assert sum(int(row["MESSAGES"]) for row in rows.values()) == sum(len(h) for h in held.values())
    for name, row in rows.items():
        assert row["STATE"] == "up" and row["PID"] == str(after[name]) and int(row["TOPICS"]) >= 1, rows
    assert "[b1] ==> %s/log/metaq.log <==" % cluster.brokers["b1"]["install_dir"] in r.out, r
    assert "metaq broker 1 ready on 127.0.0.2:%d" % cluster.brokers["b1"]["port"] in r.out, r

    r = cluster.fab("stop", "stop", "status")
    assert r.code == 1 and r.err.strip().splitlines()[-1] == "not up: b0, b1", r
    for name, b in cluster.brokers.items():
        assert re.match(r"\[%s\] stopped \(pid %d, SIGTERM\) in [\d.]+ s" % (name, after[name]),
                        r.line("[%s]" % name)), r
        assert "[%s] not running" % name in r.out, r  # the second stop
        assert cluster.pid(name) is None and not listening(b["host"], b["port"])
        log = open(os.path.join(b["install_dir"], "log", "metaq.log")).read()
        assert log.rstrip().endswith("broker stopped cleanly"), log[-2000:]
    assert {row["STATE"] for row in status_table(r).values()} == {"down"}, r


def test_second_deploy_changes_nothing(deployed_cluster):
    cluster = deployed_cluster
    cluster.deploy()
    files = cluster.files()
    time.sleep(0.01)
    r = cluster.deploy()
    for name in ("b0", "b1"):
        assert re.match(r"\[%s\] unchanged \(package [0-9a-f]{12}, config [0-9a-f]{12}\)$" % name,
                        r.line("[%s]" % name)), r
    assert cluster.files() == files


def test_failing_hosts_are_reported_and_the_others_stay_consistent(deployed_cluster, tmp_path):
    cluster = deployed_cluster
    r = cluster.fab("deploy", "start")
    assert r.code == 0, r
    pids = {name: cluster.pid(name) for name in cluster.brokers}
    inventory = yaml.safe_load(open(cluster.path))
    # b0 gets a listen address this machine does not have (a valid config, but it cannot bind);
    # b2 has no sshd on its SSH port; b3's Python does not exist.
    inventory["brokers"][0]["listen"] = "192.0.2.1"
    inventory["brokers"][0]["server"] = {"security": {"insecure": True}}  # a public address: protected mode
    dead_port = cluster.sshd.port + 1 if cluster.sshd.port < 65535 else cluster.sshd.port - 1
    inventory["brokers"].append({"name": "b2", "host": "127.0.0.1", "broker_id": 2, "port": 1,
                                 "ssh_port": dead_port, "install_dir": str(tmp_path / "b2"),
                                 "data_dir": str(tmp_path / "b2data")})
    inventory["brokers"].append({"name": "b3", "host": "127.0.0.2", "broker_id": 3, "port": 2,
                                 "python": "/nonexistent/python3", "install_dir": str(tmp_path / "b3" / "m"),
                                 "data_dir": str(tmp_path / "b3" / "d")})
    bad = write_inventory(tmp_path / "cluster.yaml", inventory)
    r = cluster.fab("deploy", inventory=bad)
    assert r.code == 1, r
    assert re.match(r"\[b0\] server\.yaml updated \(config [0-9a-f]{12}\); the running broker \(pid %d\) still "
                    r"has the previous config: restart to apply \(fab rolling-restart\)$" % pids["b0"],
                    r.line("[b0]")), r
    assert r.line("[b1]").startswith("[b1] unchanged"), r
    assert r.line("[b2]").startswith("[b2] FAILED on b2 (root@127.0.0.1:%d): cannot connect by SSH to "
                                     "root@127.0.0.1:%d" % (dead_port, dead_port)), r
    assert r.line("[b3]").startswith("[b3] FAILED on b3 (root@127.0.0.2:%d): no usable Python at "
                                     "`/nonexistent/python3` on the host" % cluster.sshd.port), r
    assert r.err.strip().splitlines()[-1] == "deploy failed on 2 of 4 brokers: b2, b3", r
    assert not os.path.exists(tmp_path / "b3"), "nothing was created on the failing host"
    b0_config = os.path.join(cluster.brokers["b0"]["install_dir"], "conf", "server.yaml")
    assert yaml.safe_load(open(b0_config))["broker"]["host"] == "192.0.2.1", "b0's deploy completed"

    # A rolling restart checks every host first: with one unreachable, nothing restarts.
    r = cluster.fab("rolling-restart", inventory=bad)
    assert r.code == 1 and "rolling restart (nothing was restarted) failed on 2 of 4 brokers: b2, b3" in r.err, r
    assert {name: cluster.pid(name) for name in cluster.brokers} == pids
    rows = cluster.status("--only", "b0,b1", inventory=bad)
    assert rows["b0"]["PENDING"] == "restart (config)" and rows["b1"]["PENDING"] == "-", rows

    # Among reachable hosts it restarts one at a time and stops at the first that fails to come back.
    r = cluster.fab("rolling-restart", "--only", "b0,b1", inventory=bad)
    assert r.code == 1, r
    # exit 2: a configuration error (an address not on the machine)
    assert r.line("[b0]").startswith("[b0] FAILED on b0 (root@127.0.0.1:%d): the broker exited with code 2 while "
                                     "starting; its log:" % cluster.sshd.port), r
    assert "192.0.2.1" in r.out and "[b1]" not in r.out, r
    assert r.err.strip().splitlines()[-1] == "rolling restart stopped at b0; not restarted: b1", r
    assert cluster.pid("b1") == pids["b1"] and listening("127.0.0.2", cluster.brokers["b1"]["port"])

    # The good inventory again: b0 gets its config back and starts, b1 never stopped.
    r = cluster.fab("deploy", "start", "status", "stop")
    assert r.code == 0, r
    assert r.line("[b0]").startswith("[b0] server.yaml updated") and r.line("[b1]").startswith("[b1] unchanged"), r
    assert "[b1] already running (pid %d)" % pids["b1"] in r.out, r
    assert {row["STATE"] for row in status_table(r).values()} == {"up"}, r


def test_uninstall_removes_the_install_and_keeps_the_data(deployed_cluster):
    cluster = deployed_cluster
    cluster.deploy()
    b1 = cluster.brokers["b1"]
    r = cluster.fab("uninstall", "--only", "b1", "uninstall", "--only", "b1", "status", "--only", "b1")
    assert r.code == 1, r
    assert "[b1] removed %s; data kept in %s (uninstall --purge-data removes it)" % (
        b1["install_dir"], b1["data_dir"]) in r.out, r
    assert "[b1] not installed (no %s)" % b1["install_dir"] in r.out, r
    assert status_table(r)["b1"]["STATE"] == "not deployed", r
    assert not os.path.exists(b1["install_dir"]) and os.path.isdir(b1["data_dir"])


def test_each_broker_gets_a_systemd_unit_that_systemd_accepts(deployed_cluster):
    """Where systemd is not the host's init (this test's hosts) the unit is written beside server.yaml, not
    installed; `systemd-analyze verify` reads it as systemd would: the deployed release's server, restart on
    failure, start at boot, LimitNOFILE from the broker's connection limits."""
    cluster = deployed_cluster
    cluster.deploy()
    for name, b in cluster.brokers.items():
        path = Layout(b["install_dir"]).unit(name)
        text = open(path).read()
        assert "Restart=on-failure" in text and "WantedBy=multi-user.target" in text, text
        config = ServerConfig.model_validate(yaml.safe_load(open(Layout(b["install_dir"]).config)))
        assert "LimitNOFILE=%d" % units.nofile(config) in text.splitlines(), text
        verified = subprocess.run(["systemd-analyze", "verify", path], capture_output=True, text=True, timeout=60)
        assert verified.returncode == 0 and verified.stderr.strip() == "", verified
        assert not os.path.exists(units.installed_path(name))
