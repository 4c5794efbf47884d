"""metaq-cluster (``make cluster``): a local cluster of N brokers and its ZooKeeper, started and stopped by PID."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from metaq import limits
from metaq.client import devcluster
from metaq.client.local import free_port
from metaq.client.raw import TextClient
from tests.harness.broker import wait_for
from tests.harness.devcluster import free_base, listening

STARTED = "Ctrl-C stops it"


def _command(*args):
    return [sys.executable, "-m", "metaq.client.devcluster"] + [str(a) for a in args]


def _state(root):
    with open(os.path.join(str(root), devcluster.STATE_FILE)) as f:
        return json.load(f)


def _recorded_pids(state):
    pids = [b["pid"] for b in state["brokers"]]
    return pids + ([state["zookeeper"]["pid"]] if state.get("zookeeper") else [])


def _gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] == "Z"  # a zombie has exited
    except OSError:
        return True


def _put_get(port, topic, payload):
    with TextClient("127.0.0.1", port) as c:
        _id, part, offset = c.put_ok(topic, payload, partition=0)
        return [r.payload for r in c.get_records(topic, part, offset)]


def test_plan_gives_each_member_its_ports_and_directory(tmp_path):
    members = devcluster.plan(3, 1, 8123, str(tmp_path))
    assert [(m.name, m.broker_id, m.slave_id) for m in members] == [
        ("0", 0, None), ("0-s1", 0, 1), ("1", 1, None), ("1-s1", 1, 1), ("2", 2, None), ("2-s1", 2, 1)]
    ports = [p for m in members for p in m.ports.values()]
    assert len(set(ports)) == len(ports) == 6 * len(devcluster.PORT_OFFSETS)
    assert members[2].ports == {"text": 8143, "remoting": 8144, "replication": 8145, "http": 8146, "mqtt": 8147,
                                "grpc": 8148}
    assert members[3].home == os.path.join(str(tmp_path), "1-s1")
    slave = devcluster.broker_config(members[1], members[0], "127.0.0.1:2181")
    assert slave["replication"] == {"port": 8135, "mode": "async", "role": "slave", "slave_of": "127.0.0.1:8125",
                                    "slave_id": 1}
    assert slave["broker"]["data_dir"] == os.path.join(members[1].home, "data")


def test_with_ha_auto_each_member_is_elected_sync_only_where_the_group_keeps_writing_with_one_down(tmp_path):
    pair = devcluster.plan(1, 1, 8123, str(tmp_path))
    first = devcluster.broker_config(pair[0], pair[0], "127.0.0.1:2181", "auto", 1)
    assert first["replication"] == {"port": 8125, "ha": "auto", "slave_id": 0, "mode": "async"}
    assert first["zk"] == {"connect": "127.0.0.1:2181", "session_timeout_ms": devcluster.ZK_SESSION_MS}
    three = devcluster.plan(1, 2, 8123, str(tmp_path))
    assert [devcluster.broker_config(m, three[0], "z:1", "auto", 2)["replication"]["slave_id"] for m in three] == [
        0, 1, 2]
    assert {devcluster.broker_config(m, three[0], "z:1", "auto", 2)["replication"]["mode"] for m in three} == {"sync"}
    assert devcluster.replication_mode(0) == "async"
    with pytest.raises(devcluster.ClusterError, match="auto or manual"):
        devcluster.start(str(tmp_path), 1, 0, ha="maybe")


def test_plan_refuses_what_the_ids_or_ports_cannot_hold(tmp_path):
    assert len(devcluster.plan(limits.MAX_BROKER_ID + 1, 0, 1, str(tmp_path))) == limits.MAX_BROKER_ID + 1
    with pytest.raises(devcluster.ClusterError, match="broker ids end at"):
        devcluster.plan(limits.MAX_BROKER_ID + 2, 0, 1, str(tmp_path))
    last_base = 65535 - devcluster.PORT_STRIDE * 2 - max(devcluster.PORT_OFFSETS.values())
    assert devcluster.plan(3, 0, last_base, str(tmp_path))[-1].ports["grpc"] == 65535
    with pytest.raises(devcluster.ClusterError, match="give a --base-port from 1 to %d" % last_base):
        devcluster.plan(3, 0, last_base + 1, str(tmp_path))
    with pytest.raises(devcluster.ClusterError, match="at least one broker"):
        devcluster.plan(0, 0, 8123, str(tmp_path))


@pytest.mark.slow
@pytest.mark.integration
def test_three_brokers_and_zookeeper_serve_then_ctrl_c_stops_every_process(tmp_path):
    root, base, zk_port = tmp_path / "cluster", free_base(3), free_port()
    proc = subprocess.Popen(_command("start", "-n", 3, "--dir", root, "--base-port", base, "--zk-port", zk_port),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = []
    try:
        for line in proc.stdout:
            out.append(line)
            if STARTED in line:
                break
        assert any(STARTED in line for line in out), "".join(out)
        text = "".join(out)
        for b in range(3):  # each broker's addresses printed
            for name, off in devcluster.PORT_OFFSETS.items():
                assert ":%d" % (base + 10 * b + off) in text, (name, text)
        assert re.search(r"ZooKeeper 127\.0\.0\.1:%d; 3 brokers" % zk_port, text)
        state = _state(root)
        assert [b["broker_id"] for b in state["brokers"]] == [0, 1, 2]
        for b in range(3):
            assert os.path.isdir(root / str(b) / "data")
            assert _put_get(base + 10 * b, "dev", b"through %d" % b) == [b"through %d" % b]
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends to the foreground command
        rest = proc.communicate(timeout=120)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            devcluster.stop(str(root), say=lambda text: None)  # what it left, by the PIDs it recorded
    assert proc.returncode == 0, rest
    assert "stopped zookeeper" in rest
    assert all(_gone(pid) for pid in _recorded_pids(state))
    assert not any(listening(base + p) for p in range(30)) and not listening(zk_port)


@pytest.mark.slow
@pytest.mark.integration
def test_background_cluster_with_slaves_replicates_and_stop_ends_it(tmp_path, zk_connect):
    root, base = tmp_path / "cluster", free_base(4)
    r = subprocess.run(_command("start", "-n", 2, "--slaves", 1, "--background", "--dir", root, "--base-port", base,
                                "--zk", zk_connect), capture_output=True, text=True, timeout=180)
    state = _state(root) if os.path.exists(root / devcluster.STATE_FILE) else None
    try:
        assert r.returncode == 0, r
        assert state["zookeeper"] is None  # --zk: none of its own
        assert [(b["name"], b["slave_id"]) for b in state["brokers"]] == [("0", None), ("1", None), ("0-s1", 1),
                                                                         ("1-s1", 1)]
        for b in range(2):
            master, slave = base + 20 * b, base + 20 * b + 10
            assert _put_get(master, "dev", b"m%d" % b) == [b"m%d" % b]

            def copied(port=slave, payload=b"m%d" % b):
                with TextClient("127.0.0.1", port) as c:
                    got = c.get_records("dev", 0, 0)
                    return isinstance(got, list) and payload in [x.payload for x in got]
            wait_for(copied, 30, "the slave's copy")
        status = subprocess.run(_command("status", "--dir", root), capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status
        roles = {line.split()[0]: line.split()[1] for line in status.stdout.splitlines()[2:]}
        assert roles == {"0": "master", "1": "master", "0-s1": "slave", "1-s1": "slave"}, status.stdout  # as now
    finally:
        stopped = subprocess.run(_command("stop", "--dir", root), capture_output=True, text=True, timeout=180)
    assert stopped.returncode == 0, stopped
    lines = [line for line in stopped.stdout.splitlines() if line.startswith("stopped broker")]
    assert [line.split()[2] for line in lines] == ["0-s1", "1-s1", "0", "1"]  # slaves first
    assert all(_gone(pid) for pid in _recorded_pids(state))
    again = subprocess.run(_command("status", "--dir", root), capture_output=True, text=True, timeout=60)
    assert again.returncode == 3 and "down" in again.stdout


@pytest.mark.slow
@pytest.mark.integration
def test_stop_from_another_terminal_ends_the_foreground_command_and_its_processes(tmp_path, zk_connect):
    root = tmp_path / "cluster"
    proc = subprocess.Popen(_command("start", "-n", 1, "--dir", root, "--base-port", free_base(1), "--zk", zk_connect),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out = []
        for line in proc.stdout:
            out.append(line)
            if STARTED in line:
                break
        state = _state(root)
        assert state["supervisor"]["pid"] == proc.pid, "".join(out)
        stopped = subprocess.run(_command("stop", "--dir", root), capture_output=True, text=True, timeout=180)
        assert stopped.returncode == 0 and "stopped metaq-cluster (PID %d)" % proc.pid in stopped.stdout, stopped
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            devcluster.stop(str(root), say=lambda text: None)  # what it left, by the PIDs it recorded
    assert all(_gone(pid) for pid in _recorded_pids(state))
