"""docs/deploy.md's ZooKeeper recipe: Debian's zoo.cfg, the three `server.N` lines the page gives and a `myid` per
server make a quorum that keeps serving with one server down. The hosts are 127.0.0.1-3 here (each server bound to
its own address, as on three hosts); ZooKeeper runs as a plain process of Debian's package, as the other tests run
it."""

import os
import re
import signal
import socket
import subprocess
import time

import pytest

from metaq.client.local import free_port
from tests.harness.broker import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.fault]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ZK_JAR = "/usr/share/java/zookeeper.jar"
EXAMPLE = "/etc/zookeeper/conf_example/zoo.cfg"
HOSTS = {"10.0.0.11": "127.0.0.1", "10.0.0.12": "127.0.0.2", "10.0.0.13": "127.0.0.3"}


def _recipe():
    """The page's server lines as (id, host, quorum port, election port); asserts it writes each host's id where
    the dataDir it sets finds it (Debian links /var/lib/zookeeper/myid to /etc/zookeeper/conf/myid)."""
    page = open(os.path.join(ROOT, "docs", "deploy.md"), encoding="utf-8").read()
    assert "s|^dataDir=.*|dataDir=/var/lib/zookeeper|" in page
    assert os.path.realpath("/var/lib/zookeeper/myid") == os.path.realpath("/etc/zookeeper/conf/myid")
    assert re.search(r"echo 1 > /etc/zookeeper/conf/myid\s+# 2 on 10\.0\.0\.12, 3 on 10\.0\.0\.13", page)
    lines = re.findall(r"server\.(\d)=([\d.]+):(\d+):(\d+)", page)
    return [(int(i), host, int(q), int(e)) for i, host, q, e in lines]


def _mode(host, port):
    try:
        with socket.create_connection((host, port), timeout=1) as s:
            s.sendall(b"srvr")
            found = re.search(rb"Mode: (\w+)", s.recv(4096))
    except OSError:
        return None
    return found.group(1).decode() if found else None


def test_the_recipes_three_servers_make_a_quorum_that_survives_one_down(tmp_path):
    if not os.path.exists(ZK_JAR):
        pytest.skip("ZooKeeper's Debian package is not installed")
    servers = _recipe()
    assert [s[0] for s in servers] == [1, 2, 3] and set(s[1] for s in servers) == set(HOSTS), servers
    base = open(EXAMPLE).read()
    # Each server on its own loopback address, on free ports (the machine is shared; the page's are 2181/2888/3888).
    ports = {}
    for i, host, _quorum, _election in servers:
        at = HOSTS[host]
        ports[i] = (at, free_port(at), free_port(at), free_port(at))
    procs = {}
    try:
        for i, _host, _q, _e in servers:
            at, client, quorum, election = ports[i]
            home = tmp_path / ("zk%d" % i)
            (home / "data").mkdir(parents=True)
            (home / "data" / "myid").write_text("%d\n" % i)
            cfg = re.sub(r"(?m)^dataDir=.*$", "dataDir=%s" % (home / "data"), base)
            cfg = re.sub(r"(?m)^clientPort=.*$", "clientPort=%d\nclientPortAddress=%s" % (client, at), cfg)
            cfg += "\nadmin.enableServer=false\n4lw.commands.whitelist=srvr\n" + "".join(
                "server.%d=%s:%d:%d\n" % (j, ports[j][0], ports[j][2], ports[j][3]) for j in sorted(ports))
            (home / "zoo.cfg").write_text(cfg)
            log = open(home / "zookeeper.log", "ab")
            procs[i] = subprocess.Popen(
                ["java", "-Xmx128m", "-Dzookeeper.admin.enableServer=false", "-cp",
                 "/etc/zookeeper/conf:%s" % ZK_JAR, "org.apache.zookeeper.server.quorum.QuorumPeerMain",
                 str(home / "zoo.cfg")], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        modes = lambda: {i: _mode(ports[i][0], ports[i][1]) for i in procs}  # noqa: E731
        wait_for(lambda: sorted(m for m in modes().values() if m) == ["follower", "follower", "leader"], 90,
                 lambda: "a quorum of three: %s" % modes())
        leader = next(i for i, m in modes().items() if m == "leader")
        procs[leader].send_signal(signal.SIGKILL)
        procs[leader].wait(10)
        left = [i for i in procs if i != leader]
        wait_for(lambda: sorted(modes()[i] or "" for i in left) == ["follower", "leader"], 90,
                 lambda: "the two left elect a leader: %s" % modes())
        time.sleep(0.1)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait(10)
