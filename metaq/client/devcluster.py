"""``metaq-cluster``: a cluster of N brokers and its ZooKeeper on this machine, for development (``make cluster``).

    metaq-cluster start -n 3 [--slaves 1] [--ha auto|manual] [--dir data/cluster] [--base-port 8123]
                        [--zk-port 2181 | --zk HOST:PORT] [--background]
    metaq-cluster stop   [--dir data/cluster]
    metaq-cluster status [--dir data/cluster]

``start`` runs a ZooKeeper (Debian's package, a plain process, as ``make zookeeper`` and the tests run it; not with
``--zk``, which names one already running), then N masters (broker ids 0..N-1) and ``--slaves`` slaves of each,
every one ``python -m metaq.server`` on 127.0.0.1 in a process session of its own. Member ``s`` (masters and
slaves in order: broker 0, its slaves, broker 1, ...) has the ports ``base + 10*s`` + the offsets of
``PORT_OFFSETS`` (text, remoting, replication, HTTP, MQTT, gRPC), its files under ``<dir>/<id>`` (a slave:
``<dir>/<id>-s<k>``): ``data/`` (the store), ``server.yaml``, ``broker.log``. The PIDs are written to
``<dir>/cluster.json`` as each process starts. In the foreground (the default) Ctrl-C or SIGTERM stops them;
``stop`` (``make stop-cluster``) stops them from another terminal: slaves, then masters, then ZooKeeper, each by
its recorded PID and only while that PID still runs the command it was started with (a reused PID is not ours).

With ``--ha auto`` (the default) each broker id's members elect their master through ZooKeeper, as a deployed
cluster does (``replication.ha: auto``): a killed master's place is taken within seconds with no command typed
(ZooKeeper sessions of ``ZK_SESSION_MS``). Its replication is ``sync`` where the group keeps taking writes with one
member down (two slaves or more) and ``async`` with one slave (a sync pair stops writing when either member is
away: docs/cluster.md). ``--ha manual``: the first member of each id is the master, its slaves follow it, and a
person promotes one (``metaq-admin promote``).
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import yaml

from metaq import limits
from metaq.client.raw import TextClient

__all__ = ["Member", "plan", "broker_config", "start", "stop", "status", "main"]

#: Each port of a member: its offset from the member's base port (``base + PORT_STRIDE * member``).
PORT_OFFSETS = {"text": 0, "remoting": 1, "replication": 2, "http": 3, "mqtt": 4, "grpc": 5}
PORT_STRIDE = 10
STATE_FILE = "cluster.json"
ZK_JAR = "/usr/share/java/zookeeper.jar"
ZK_CONF_DIR = "/etc/zookeeper/conf"
ZK_MARKER = "QuorumPeerMain"
#: Seconds a broker or ZooKeeper may take to answer after it is started, and to exit after SIGTERM.
START_TIMEOUT_S = 60.0
#: The brokers' ZooKeeper session with ``--ha auto``: the shortest the cluster's ZooKeeper allows (two ticks of
#: 2 s), so that a dead master's election follows its death within seconds.
ZK_SESSION_MS = 4000
STOP_TIMEOUT_S = 30.0
HOST = "127.0.0.1"


class ClusterError(Exception):
    """What went wrong, in one sentence for the terminal (exit status 1)."""


@dataclass(frozen=True)
class Member:
    """One broker process of the local cluster: a master (``slave_id`` None) or a slave of ``broker_id``."""

    broker_id: int
    slave_id: object  # None: the master
    ports: dict
    home: str

    @property
    def name(self):
        return "%d" % self.broker_id if self.slave_id is None else "%d-s%d" % (self.broker_id, self.slave_id)

    @property
    def role(self):
        return "master" if self.slave_id is None else "slave %d of %d" % (self.slave_id, self.broker_id)


def plan(brokers, slaves, base_port, root):
    """The members of a cluster of ``brokers`` masters with ``slaves`` slaves each: ids, ports, directories.
    ClusterError when the broker ids or the ports do not fit."""
    if brokers < 1 or slaves < 0:
        raise ClusterError("give at least one broker (-n) and zero or more slaves per master")
    if brokers > limits.MAX_BROKER_ID + 1:
        raise ClusterError("%d brokers: broker ids end at %d" % (brokers, limits.MAX_BROKER_ID))
    if slaves > limits.MAX_BROKER_ID:
        raise ClusterError("%d slaves per master: slave ids end at %d" % (slaves, limits.MAX_BROKER_ID))
    count = brokers * (1 + slaves)
    last = base_port + PORT_STRIDE * (count - 1) + max(PORT_OFFSETS.values())
    if base_port < 1 or last > 65535:
        raise ClusterError("%d brokers need the ports %d..%d: give a --base-port from 1 to %d"
                           % (count, base_port, last, 65535 - (last - base_port)))
    members = []
    for b in range(brokers):
        for k in range(1 + slaves):
            slot = len(members)
            ports = {name: base_port + PORT_STRIDE * slot + off for name, off in PORT_OFFSETS.items()}
            name = "%d" % b if k == 0 else "%d-s%d" % (b, k)
            members.append(Member(b, None if k == 0 else k, ports, os.path.join(root, name)))
    return members


def replication_mode(slaves):
    """The replication mode of a group of one master and ``slaves`` slaves with ``ha: auto``: ``sync`` when it keeps
    taking writes with one member down (two slaves or more), ``async`` otherwise."""
    return "sync" if slaves >= 2 else "async"


def broker_config(member, master, zk_connect, ha="manual", slaves=0):
    """A member's server.yaml as a dict: its ports, its store under ``<home>/data``, the cluster's ZooKeeper, and
    its replication: with ``ha`` "auto" elected through ZooKeeper (member id: 0 for the first, k for slave k), with
    "manual" a slave following its master's replication port. Small store files (64 MiB segments), as
    conf/server.yaml's laptop settings."""
    p = member.ports
    zk = {"connect": zk_connect}
    if ha == "auto":
        replication = {"port": p["replication"], "ha": "auto", "slave_id": member.slave_id or 0,
                       "mode": replication_mode(slaves)}
        zk["session_timeout_ms"] = ZK_SESSION_MS
    else:
        replication = {"port": p["replication"], "mode": "async"}
        if member.slave_id is not None:
            replication.update(role="slave", slave_of="%s:%d" % (HOST, master.ports["replication"]),
                               slave_id=member.slave_id)
    return {
        "broker": {"id": member.broker_id, "host": HOST, "port": p["text"],
                   "data_dir": os.path.join(member.home, "data")},
        "store": {"segment_size": 64 << 20, "key_index_slots": 1 << 16, "key_index_entries": 1 << 17},
        "zk": zk,
        "replication": replication,
        "remoting": {"port": p["remoting"]},
        "http": {"port": p["http"]},
        "mqtt": {"port": p["mqtt"]},
        "grpc": {"port": p["grpc"]},
        "topics": [{"name": "*", "partitions": 4}],
    }


# -- processes --------------------------------------------------------------------------------------------------


def _alive(pid, marker):
    """True while ``pid`` runs a command whose command line holds ``marker`` (a zombie's is empty: not alive)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return marker.encode() in f.read()
    except (OSError, TypeError):
        return False


def _port_busy(port):
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((HOST, port)) == 0


def _zk_answers(port):
    try:
        with socket.create_connection((HOST, port), timeout=1) as s:
            s.sendall(b"srvr")
            return b"Mode:" in s.recv(4096)
    except OSError:
        return False


def _wait(check, what, proc, log_path, timeout=START_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            raise ClusterError("%s exited with status %s; its log: %s" % (what, proc.returncode, log_path))
        if time.monotonic() > deadline:
            raise ClusterError("%s did not answer within %.0f s; its log: %s" % (what, timeout, log_path))
        time.sleep(0.1)


def _spawn(cmd, log_path, cwd):
    """A process in a session of its own (Ctrl-C reaches the command, which stops it in order), output to a log."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=cwd,
                                start_new_session=True)


def _start_zookeeper(root, port):
    if not os.path.exists(ZK_JAR):
        raise ClusterError("ZooKeeper is not installed (%s missing): apt-get install zookeeper, or give --zk "
                           "HOST:PORT of one already running" % ZK_JAR)
    home = os.path.join(root, "zookeeper")
    os.makedirs(os.path.join(home, "data"), exist_ok=True)
    cfg = os.path.join(home, "zoo.cfg")
    with open(cfg, "w") as f:
        f.write("tickTime=2000\ndataDir=%s\nclientPort=%d\nclientPortAddress=%s\nadmin.enableServer=false\n"
                "4lw.commands.whitelist=ruok,srvr,stat\n" % (os.path.join(home, "data"), port, HOST))
    log_path = os.path.join(home, "zookeeper.log")
    proc = _spawn(["java", "-Xmx256m", "-Dzookeeper.admin.enableServer=false", "-cp", "%s:%s" % (ZK_CONF_DIR, ZK_JAR),
                   "org.apache.zookeeper.server.quorum.QuorumPeerMain", cfg], log_path, home)
    return proc, {"pid": proc.pid, "marker": cfg, "port": port, "log": log_path}


def _start_broker(member, master, zk_connect, ha, slaves):
    os.makedirs(member.home, exist_ok=True)
    cfg = os.path.join(member.home, "server.yaml")
    with open(cfg, "w") as f:
        yaml.safe_dump(broker_config(member, master, zk_connect, ha, slaves), f, sort_keys=False)
    log_path = os.path.join(member.home, "broker.log")
    proc = _spawn([sys.executable, "-m", "metaq.server", "-c", cfg], log_path, member.home)
    return proc, {"name": member.name, "broker_id": member.broker_id, "slave_id": member.slave_id,
                  "pid": proc.pid, "marker": cfg, "ports": member.ports, "home": member.home, "log": log_path}


def _read_state(root):
    try:
        with open(os.path.join(root, STATE_FILE)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _write_state(root, state):
    path = os.path.join(root, STATE_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(state, f, indent=2)
    os.replace(path + ".tmp", path)


def _running(state):
    """The recorded processes that still run: [(what, pid, marker)], slaves first, then masters, then ZooKeeper
    (the order they stop in)."""
    procs = sorted(state.get("brokers", ()), key=lambda b: (b["slave_id"] is None, b["broker_id"]))
    out = [("broker %s" % b["name"], b["pid"], b["marker"]) for b in procs]
    if state.get("zookeeper"):
        out.append(("zookeeper", state["zookeeper"]["pid"], state["zookeeper"]["marker"]))
    return [(what, pid, marker) for what, pid, marker in out if _alive(pid, marker)]


def _stop_pid(pid, marker, timeout=STOP_TIMEOUT_S):
    """SIGTERM, then SIGKILL when it has not exited within ``timeout``; True when it had to be killed."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout
    while _alive(pid, marker):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return True
        time.sleep(0.05)
        try:  # our own child: reap it, or it stays a zombie (which _alive counts as gone anyway)
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
    return False


def stop_recorded(state, say=print):
    """Stop every recorded process still running, in order; the names stopped."""
    stopped = []
    for what, pid, marker in _running(state):
        killed = _stop_pid(pid, marker)
        say("stopped %s (PID %d%s)" % (what, pid, ", killed after %.0f s" % STOP_TIMEOUT_S if killed else ""))
        stopped.append(what)
    return stopped


# -- commands ---------------------------------------------------------------------------------------------------


def start(root, brokers, slaves=0, base_port=8123, zk_port=2181, zk_connect=None, say=print, ha="auto"):
    """Start ZooKeeper (unless ``zk_connect``), the masters, then their slaves; the state written to
    ``<root>/cluster.json`` as each starts. On a failure what was started is stopped and ClusterError raised.
    ``ha``: "auto" (elected masters) or "manual" (module docstring)."""
    if ha not in ("auto", "manual"):
        raise ClusterError("--ha is auto or manual, not %r" % (ha,))
    root = os.path.abspath(root)
    old = _read_state(root)
    if old and _running(old):
        raise ClusterError("a cluster already runs from %s (PIDs %s): metaq-cluster stop --dir %s first"
                           % (root, ", ".join(str(pid) for _w, pid, _m in _running(old)), root))
    members = plan(brokers, slaves, base_port, root)
    wanted = [(m.name, name, port) for m in members for name, port in m.ports.items()]
    if zk_connect is None:
        wanted.append(("zookeeper", "client", zk_port))
    busy = [w for w in wanted if _port_busy(w[2])]
    if busy:
        raise ClusterError("port %d (%s's %s) is already in use: give another --base-port%s"
                           % (busy[0][2], busy[0][0], busy[0][1], " or --zk-port" if busy[0][0] == "zookeeper" else ""))
    os.makedirs(root, exist_ok=True)
    state = {"supervisor": None, "zookeeper": None, "zk_connect": zk_connect or "%s:%d" % (HOST, zk_port),
             "ha": ha, "brokers": []}
    try:
        if zk_connect is None:
            proc, state["zookeeper"] = _start_zookeeper(root, zk_port)
            _write_state(root, state)
            _wait(lambda: _zk_answers(zk_port), "ZooKeeper", proc, state["zookeeper"]["log"])
        masters = {m.broker_id: m for m in members if m.slave_id is None}
        for wave in ([m for m in members if m.slave_id is None], [m for m in members if m.slave_id is not None]):
            started = []
            for m in wave:
                proc, entry = _start_broker(m, masters[m.broker_id], state["zk_connect"], ha, slaves)
                state["brokers"].append(entry)
                _write_state(root, state)
                started.append((m, proc, entry))
            for m, proc, entry in started:
                _wait(lambda m=m: _answers(m.ports["text"]), "broker %s" % m.name, proc, entry["log"])
        if ha == "auto":
            for broker_id in sorted(masters):
                group = [m for m in members if m.broker_id == broker_id]
                _wait_until(lambda group=group: _elected(group), "broker %d's election of a master that takes "
                            "writes" % broker_id, [b["log"] for b in state["brokers"] if b["broker_id"] == broker_id])
    except BaseException:
        stop_recorded(state, say)
        raise
    return state


def _elected(group):
    """True when one member of ``group`` reports itself master and may acknowledge writes."""
    for m in group:
        try:
            with TextClient(HOST, m.ports["text"], timeout=2.0) as client:
                seen = client.stats_dict()
        except (OSError, AssertionError, ValueError):
            continue
        if seen.get("replication_role") == "master" and str(seen.get("replication_writable", "")).startswith("yes"):
            return True
    return False


def _wait_until(check, what, logs, timeout=START_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise ClusterError("no %s within %.0f s; the logs: %s" % (what, timeout, ", ".join(logs)))
        time.sleep(0.2)


def _answers(port):
    try:
        with socket.create_connection((HOST, port), timeout=1) as s:
            s.sendall(b"version 0\r\n")
            return s.recv(256).startswith(b"result 200")
    except OSError:
        return False


def role_now(port):
    """The role a member reports now (its ``replication_role`` stat: ``master``, ``slave``, ...), or None when it
    does not answer."""
    try:
        with TextClient(HOST, port, timeout=2.0) as client:
            return client.stats_dict().get("replication_role")
    except (OSError, AssertionError, ValueError):
        return None


def table(state, live=True):
    """What ``start`` and ``status`` print: one line per broker with its role now (asked of it when ``live``; its
    role at start otherwise) and its addresses."""
    columns = ("BROKER", "ROLE", "PID", "TEXT", "HTTP", "MQTT", "GRPC", "REMOTING", "REPLICATION", "DIR")
    rows = [columns]
    for b in state["brokers"]:
        p = b["ports"]
        up = _alive(b["pid"], b["marker"])
        role = role_now(p["text"]) if live and up else None
        if role is None:
            role = ("master" if b["slave_id"] is None else "slave") + (" at start" if live else "")
        rows.append((b["name"], role, "%d" % b["pid"] if up else "down", "meta://%s:%d" % (HOST, p["text"]),
                     "http://%s:%d" % (HOST, p["http"]), "mqtt://%s:%d" % (HOST, p["mqtt"]),
                     "%s:%d" % (HOST, p["grpc"]), "%s:%d" % (HOST, p["remoting"]), "%s:%d" % (HOST, p["replication"]),
                     b["home"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def status(root, say=print):
    state = _read_state(os.path.abspath(root))
    if not state:
        say("no cluster recorded in %s" % os.path.abspath(root))
        return 3
    say("ZooKeeper %s%s" % (state["zk_connect"], "" if not state.get("zookeeper") else " (PID %d, %s)" % (
        state["zookeeper"]["pid"], "up" if _alive(state["zookeeper"]["pid"], state["zookeeper"]["marker"])
        else "down")))
    say(table(state))
    return 0 if _running(state) else 3


def stop(root, say=print):
    """Stop the cluster recorded in ``root``: its foreground command first (it stops the rest in order), then
    any recorded process still running."""
    root = os.path.abspath(root)
    state = _read_state(root)
    if not state:
        say("no cluster recorded in %s" % root)
        return 0
    sup = state.get("supervisor")
    if sup and _alive(sup["pid"], sup["marker"]):
        _stop_pid(sup["pid"], sup["marker"], timeout=STOP_TIMEOUT_S * 2)
        say("stopped metaq-cluster (PID %d)" % sup["pid"])
    if not stop_recorded(state, say) and not sup:
        say("nothing of the cluster in %s runs" % root)
    return 0


def _serve(root, state, say, stopping):
    """The foreground: wait until SIGINT or SIGTERM (``stopping`` filled by their handlers), saying when a broker
    exits; then stop everything. It ends by itself when every process it started has gone."""
    reported = set()
    while not stopping and _running(state):
        for b in state["brokers"]:
            if b["name"] not in reported and not _alive(b["pid"], b["marker"]):
                reported.add(b["name"])
                say("broker %s (PID %d) exited; its log: %s" % (b["name"], b["pid"], b["log"]))
        time.sleep(0.2)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    say("stopping the cluster")
    stop_recorded(state, say)
    state["supervisor"] = None
    _write_state(root, state)


def main(argv=None):
    p = argparse.ArgumentParser(prog="metaq-cluster", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("start", help="start ZooKeeper and N brokers; Ctrl-C stops them")
    s.add_argument("-n", "--brokers", type=int, default=3, help="masters, broker ids 0..N-1 (default 3)")
    s.add_argument("--slaves", type=int, default=0, help="slaves per master (default 0)")
    s.add_argument("--ha", choices=("auto", "manual"), default="auto",
                   help="auto: each broker id elects its master through ZooKeeper, a dead master replaced within "
                   "seconds (default); manual: the first member is the master until metaq-admin promote")
    s.add_argument("--base-port", type=int, default=8123, help="broker 0's text port (default 8123)")
    s.add_argument("--zk-port", type=int, default=2181, help="the ZooKeeper this command runs (default 2181)")
    s.add_argument("--zk", help="HOST:PORT[/chroot] of a ZooKeeper already running: none is started")
    s.add_argument("--background", action="store_true", help="return once every broker answers; stop with "
                   "metaq-cluster stop")
    for name, text in (("stop", "stop the recorded cluster"), ("status", "show the recorded cluster")):
        sub.add_parser(name, help=text)
    for parser in sub.choices.values():
        parser.add_argument("--dir", default=os.path.join("data", "cluster"),
                            help="where the brokers' and ZooKeeper's files go (default ./data/cluster)")
    args = p.parse_args(argv)
    say = lambda text: print(text, flush=True)  # noqa: E731
    try:
        if args.command == "stop":
            return stop(args.dir, say)
        if args.command == "status":
            return status(args.dir, say)
        state = start(args.dir, args.brokers, args.slaves, args.base_port, args.zk_port, args.zk, say, args.ha)
    except (ClusterError, OSError) as exc:
        print("metaq-cluster: %s" % exc, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    say("ZooKeeper %s; %d brokers:" % (state["zk_connect"], len(state["brokers"])))
    say(table(state))
    say("look at it: metaq-admin --zk %s cluster" % state["zk_connect"])
    if args.background:
        say("stop it with: metaq-cluster stop --dir %s (or make stop-cluster)" % args.dir)
        return 0
    stopping = []  # from here on Ctrl-C and SIGTERM (metaq-cluster stop) stop the cluster in order
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    with open("/proc/self/cmdline", "rb") as f:  # `python -m metaq.client.devcluster` or the metaq-cluster script
        marker = "metaq.client.devcluster" if b"metaq.client.devcluster" in f.read() else "metaq-cluster"
    state["supervisor"] = {"pid": os.getpid(), "marker": marker}  # recorded before we say so: stop finds us
    _write_state(os.path.abspath(args.dir), state)
    say("Ctrl-C stops it")
    _serve(os.path.abspath(args.dir), state, say, stopping)
    return 0


if __name__ == "__main__":
    sys.exit(main())
