"""A real ZooKeeper server (Debian's package) as a plain process on 127.0.0.1 (or an address of a test's network
namespace), for tests.

``ZooKeeperProcess(workdir).start()`` picks a free port, writes a zoo.cfg in
``workdir`` and runs ``ZooKeeperServerMain`` until ``srvr`` answers ``Mode:``.
``stop()`` / ``kill()`` act on its own PID; ``start()`` again reuses the port
and the data directory, which is how tests restart ZooKeeper.
"""

import os
import socket
import subprocess
import time
import uuid
from metaq.client.local import free_port

ZK_JAR = "/usr/share/java/zookeeper.jar"
ZK_CONF_DIR = "/etc/zookeeper/conf"


def four_letter(host, port, word, timeout=1.0):
    """Send a ZooKeeper four-letter command; the reply text, or '' when nobody answers."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(word.encode())
            chunks = []
            while True:
                data = s.recv(4096)
                if not data:
                    break
                chunks.append(data)
            return b"".join(chunks).decode("utf-8", "replace")
    except OSError:
        return ""


class ZooKeeperProcess:
    def __init__(self, workdir, port=None, tick_ms=2000, host="127.0.0.1", prefix=()):
        """``host``: the address it binds (one in a network namespace, with ``prefix`` = the command prefix that
        runs it there, e.g. ``["ip", "netns", "exec", NS]``; the prefix must exec it in place: its PID is ours)."""
        self.workdir = str(workdir)
        self.host, self.prefix = host, list(prefix)
        self.data_dir = os.path.join(self.workdir, "data")
        self.port = port or free_port()
        self.tick_ms = tick_ms
        self.proc = None
        self.log_path = os.path.join(self.workdir, "zookeeper.log")

    @property
    def connect(self):
        return "%s:%d" % (self.host, self.port)

    def _write_config(self):
        os.makedirs(self.data_dir, exist_ok=True)
        cfg = os.path.join(self.workdir, "zoo.cfg")
        with open(cfg, "w") as f:
            f.write("tickTime=%d\n" % self.tick_ms)
            f.write("dataDir=%s\n" % self.data_dir)
            f.write("clientPort=%d\nclientPortAddress=%s\n" % (self.port, self.host))
            f.write("admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,stat,mntr,cons\n")
            f.write("forceSync=no\nmaxClientCnxns=0\n")
            # sessions as short as 2 ticks, so tests can use a 4 s session timeout
            f.write("minSessionTimeout=%d\n" % (2 * self.tick_ms))
        return cfg

    def start(self, timeout=30.0):
        if not os.path.exists(ZK_JAR):
            raise RuntimeError("ZooKeeper is not installed (%s missing): run `make test`, "
                               "which installs Debian's zookeeper package" % ZK_JAR)
        cfg = self._write_config()
        log = open(self.log_path, "ab")
        cmd = self.prefix + ["java", "-Xmx256m", "-Dzookeeper.admin.enableServer=false",
               "-cp", "%s:%s" % (ZK_CONF_DIR, ZK_JAR),
               "org.apache.zookeeper.server.quorum.QuorumPeerMain", cfg]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("ZooKeeper exited with %s; see %s" % (self.proc.returncode, self.log_path))
            if "Mode:" in four_letter(self.host, self.port, "srvr"):
                return self
            time.sleep(0.1)
        self.kill()
        raise RuntimeError("ZooKeeper did not serve within %.0f s on port %d" % (timeout, self.port))

    def _wait_port_free(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not four_letter(self.host, self.port, "ruok", timeout=0.2):
                return
            time.sleep(0.05)

    def stop(self, timeout=15.0):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout)
        self._wait_port_free()

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._wait_port_free()

    def chroot(self):
        """A fresh, existing chroot path, so tests sharing one server never see each other's nodes."""
        from kazoo.client import KazooClient

        path = "/t-" + uuid.uuid4().hex[:12]
        zk = KazooClient(hosts=self.connect, timeout=10)
        zk.start(timeout=15)
        try:
            zk.ensure_path(path)
        finally:
            zk.stop()
            zk.close()
        return self.connect + path
