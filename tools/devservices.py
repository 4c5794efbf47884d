#!/usr/bin/env python3
"""ZooKeeper and PostgreSQL for trying the README's examples: `make zookeeper`, `make postgres` and their stops.

    python3 tools/devservices.py zookeeper start|stop|status [--port 2181] [--dir devdata]
    python3 tools/devservices.py postgres  start|stop|status [--port 5432] [--dir devdata]

Each server runs as a plain background process on 127.0.0.1 (Debian's packages; the system services are
not used), its data and log under ``<dir>/<name>/`` and its PID in ``<dir>/<name>.pid``; ``stop`` signals
that PID alone (after checking that it is still that server) and waits until it is gone. PostgreSQL gets a
throwaway cluster (trust authentication on 127.0.0.1, ``max_prepared_transactions`` for two-phase commit)
with a role and a database called ``shop``, as ``examples/xa_postgres.py`` uses them. It refuses to run as
root, so as root the cluster runs as Debian's ``postgres`` user, in a directory under /tmp that user can
reach. Stdlib only: it runs with the system's python3, before any virtualenv exists.
"""

import argparse
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

ZK_JAR = "/usr/share/java/zookeeper.jar"
ZK_CONF_DIR = "/etc/zookeeper/conf"
PG_LIB = "/usr/lib/postgresql"
START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 30


class Failed(Exception):
    """What went wrong, for the one line the script prints before exiting 1."""


def port_busy(port):
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def four_letter(port, word):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(word.encode())
            chunks = []
            while True:
                data = s.recv(4096)
                if not data:
                    return b"".join(chunks).decode("utf-8", "replace")
                chunks.append(data)
    except OSError:
        return ""


def alive(pid, marker):
    """True while ``pid`` runs and its command line holds ``marker`` (a PID the kernel reused is not ours)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return marker.encode() in f.read()
    except OSError:
        return False


def wait_until(check, what, log_path, proc=None):
    deadline = time.monotonic() + START_TIMEOUT_S
    while not check():
        if proc is not None and proc.poll() is not None:
            raise Failed("%s exited with %s; its log: %s" % (what, proc.returncode, log_path))
        if time.monotonic() > deadline:
            raise Failed("%s did not answer within %d s; its log: %s" % (what, START_TIMEOUT_S, log_path))
        time.sleep(0.1)


class Service:
    name = marker = None

    def __init__(self, root, port):
        self.root = os.path.abspath(root)
        self.port = port
        self.pid_file = os.path.join(self.root, self.name + ".pid")

    def recorded_pid(self):
        try:
            with open(self.pid_file) as f:
                return int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def running_pid(self):
        pid = self.recorded_pid()
        return pid if pid is not None and alive(pid, self.marker) else None

    def start(self):
        pid = self.running_pid()
        if pid is not None:
            print("%s already runs (PID %d, from %s)" % (self.name, pid, self.pid_file))
            return
        if port_busy(self.port):
            raise Failed("127.0.0.1:%d is already in use by another program; give another port (%s)"
                         % (self.port, self.port_hint))
        os.makedirs(self.root, exist_ok=True)
        pid = self.launch()
        with open(self.pid_file, "w") as f:
            f.write("%d\n" % pid)
        print("%s runs on 127.0.0.1:%d (PID %d, recorded in %s); stop it with: %s"
              % (self.name, self.port, pid, self.pid_file, self.stop_command()))
        self.after_start()

    def after_start(self):
        pass

    def stop_command(self):
        words = ["make", "stop-" + self.name]
        if self.port != self.default_port:
            words.append("%s=%d" % (self.port_variable, self.port))
        if self.root != os.path.abspath("devdata"):
            words.append("DEVDATA=%s" % self.root)
        return " ".join(words)

    def stop(self):
        pid = self.running_pid()
        if pid is None:
            print("%s is not running (no live PID in %s)" % (self.name, self.pid_file))
        else:
            os.kill(pid, self.stop_signal)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while alive(pid, self.marker) and time.monotonic() < deadline:
                time.sleep(0.1)
            if alive(pid, self.marker):
                os.kill(pid, signal.SIGKILL)
            print("%s stopped (PID %d)" % (self.name, pid))
        if os.path.exists(self.pid_file):
            os.remove(self.pid_file)

    def status(self):
        pid = self.running_pid()
        print("%s: %s" % (self.name, "running, PID %d, 127.0.0.1:%d" % (pid, self.port) if pid else "not running"))
        return 0 if pid else 3


class ZooKeeper(Service):
    name = "zookeeper"
    marker = "QuorumPeerMain"
    stop_signal = signal.SIGTERM
    default_port, port_variable = 2181, "ZK_PORT"
    port_hint = "make zookeeper ZK_PORT=2182"

    def launch(self):
        if not os.path.exists(ZK_JAR):
            raise Failed("ZooKeeper is not installed (%s missing): apt-get install zookeeper" % ZK_JAR)
        workdir = os.path.join(self.root, "zookeeper")
        os.makedirs(os.path.join(workdir, "data"), exist_ok=True)
        cfg = os.path.join(workdir, "zoo.cfg")
        with open(cfg, "w") as f:
            f.write("tickTime=2000\ndataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\n"
                    "admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr,stat\n"
                    % (os.path.join(workdir, "data"), self.port))
        log_path = os.path.join(workdir, "zookeeper.log")
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(["java", "-Xmx256m", "-Dzookeeper.admin.enableServer=false",
                                     "-cp", "%s:%s" % (ZK_CONF_DIR, ZK_JAR),
                                     "org.apache.zookeeper.server.quorum.QuorumPeerMain", cfg],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        wait_until(lambda: "Mode:" in four_letter(self.port, "srvr"), "ZooKeeper", log_path, proc)
        return proc.pid


def pg_bindir():
    found = sorted((int(os.path.basename(os.path.dirname(d))), d) for d in glob.glob(os.path.join(PG_LIB, "*", "bin"))
                   if os.path.basename(os.path.dirname(d)).isdigit() and os.access(os.path.join(d, "initdb"), os.X_OK))
    if not found:
        raise Failed("PostgreSQL is not installed (no %s/<version>/bin/initdb): apt-get install postgresql" % PG_LIB)
    return found[-1][1]


class Postgres(Service):
    name = "postgres"
    marker = "postgres"
    stop_signal = signal.SIGINT  # fast shutdown
    default_port, port_variable = 5432, "PG_PORT"
    port_hint = "make postgres PG_PORT=5433, then add port=5433 to the DSN"

    def __init__(self, root, port):
        super().__init__(root, port)
        self.user = "postgres" if os.geteuid() == 0 else None  # PostgreSQL refuses to run as root
        if self.user:
            self.workdir = os.path.join(tempfile.gettempdir(), "metaq-devdata-postgres-%d" % port)
        else:
            self.workdir = os.path.join(self.root, "postgres")

    def run_kwargs(self):
        kw = {"env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "TZ": "UTC"}}
        if self.user:
            pw = pwd.getpwnam(self.user)
            kw.update(user=pw.pw_uid, group=pw.pw_gid, extra_groups=[])
            kw["env"]["HOME"] = pw.pw_dir
        return kw

    def launch(self):
        bindir = pg_bindir()
        data = os.path.join(self.workdir, "data")
        if not os.path.exists(os.path.join(data, "PG_VERSION")):
            shutil.rmtree(self.workdir, ignore_errors=True)  # a cluster that never finished initdb
            os.makedirs(os.path.join(self.workdir, "sock"))
            if self.user:
                pw = pwd.getpwnam(self.user)
                for p in (self.workdir, os.path.join(self.workdir, "sock")):
                    os.chown(p, pw.pw_uid, pw.pw_gid)
            out = subprocess.run([os.path.join(bindir, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
                                  "-E", "UTF8", "--locale=C", "--no-sync"], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, cwd=self.workdir, **self.run_kwargs())
            if out.returncode != 0:
                raise Failed("initdb failed: %s" % out.stdout.decode("utf-8", "replace").strip().splitlines()[-1:])
        log_path = os.path.join(self.workdir, "postgres.log")
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        if self.user:
            os.chown(log_path, pwd.getpwnam(self.user).pw_uid, -1)
        proc = subprocess.Popen([os.path.join(bindir, "postgres"), "-D", data, "-p", str(self.port),
                                 "-k", os.path.join(self.workdir, "sock"), "-c", "listen_addresses=127.0.0.1",
                                 "-c", "max_prepared_transactions=20", "-c", "fsync=off"],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=self.workdir, **self.run_kwargs())
        os.close(log)
        isready = [os.path.join(bindir, "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)]
        wait_until(lambda: subprocess.run(isready).returncode == 0, "PostgreSQL", log_path, proc)
        self.bindir = bindir
        return proc.pid

    def after_start(self):
        psql = [os.path.join(self.bindir, "psql"), "-q", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-tAc"]
        exists = subprocess.run(psql + ["SELECT 1 FROM pg_roles WHERE rolname = 'shop'"], capture_output=True,
                                text=True)
        if exists.stdout.strip() != "1":
            for sql in ("CREATE ROLE shop LOGIN", "CREATE DATABASE shop OWNER shop"):
                subprocess.run(psql + [sql], check=True, capture_output=True)
        print('connect with: psql "host=127.0.0.1 port=%d dbname=shop user=shop" (data in %s)'
              % (self.port, self.workdir))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("service", choices=("zookeeper", "postgres"))
    p.add_argument("action", choices=("start", "stop", "status"))
    p.add_argument("--port", type=int, help="port on 127.0.0.1 (default 2181 for ZooKeeper, 5432 for PostgreSQL)")
    p.add_argument("--dir", default="devdata", help="where the data, logs and PID files go (default ./devdata)")
    args = p.parse_args(argv)
    cls = ZooKeeper if args.service == "zookeeper" else Postgres
    service = cls(args.dir, args.port or cls.default_port)
    try:
        return getattr(service, args.action)() or 0
    except (Failed, OSError, subprocess.CalledProcessError) as exc:
        print("%s: %s" % (args.service, exc), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
