"""Deploy and operate a metaq cluster over SSH (Fabric 3). The brokers come from the inventory.

    fab check                          validate the inventory; show each broker's settings (--show-config: server.yaml)
    fab deploy                         build the package once, upload it, install it, render each server.yaml
    fab start | stop | restart         daemonized brokers with a pid file; start waits for `version`
                                       (masters start before their slaves; slaves stop before their masters)
    fab status                         per broker: up or down, role, version, uptime, topics, ZooKeeper, link, lag
    fab rolling-restart                one broker at a time, each healthy before the next; stops at a failure
                                       (a group's slaves first, each caught up, then its master)
    fab logs [--lines N]               the end of each broker's log
    fab uninstall [--purge-data]       stop and remove the install (the data dir only with --purge-data)

Every task takes ``--only b0,b1`` (brokers by name) and ``--inventory PATH`` (default
``$METAQ_INVENTORY``, else ``conf/cluster.yaml`` beside this file). ``fab -i KEY`` adds an SSH key;
``fab -H host`` limits a task to the inventory's brokers on that host. The package is built from
this checkout (``$METAQ_DEPLOY_SOURCE`` names another). Exit status: 0 when every
broker did what was asked, 1 when one failed (named in the last line), 2 for an invalid inventory.
"""

import atexit
import os
import socket
import sys
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import paramiko
from fabric import Config, Connection, task
from invoke.exceptions import Exit

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # fab from another environment: use this checkout's metaq
    sys.path.insert(0, HERE)

from metaq.deploy import hostops  # noqa: E402
from metaq.deploy.bundle import BundleError, build_bundle  # noqa: E402
from metaq.deploy.groups import start_waves, stop_waves  # noqa: E402
from metaq.deploy.hostops import HostFailure  # noqa: E402
from metaq.deploy.inventory import InventoryError, load_inventory, mqtt_cluster_notes, ports  # noqa: E402
from metaq.deploy.layout import Layout  # noqa: E402
from metaq.deploy import files as host_files  # noqa: E402
from metaq.deploy import rolling  # noqa: E402

_print_lock = threading.Lock()
_connections = {}
_bundle = []  # built once per fab run


def _say(text=""):
    with _print_lock:
        print(text, flush=True)


def _inventory_path(inventory):
    return inventory or os.environ.get("METAQ_INVENTORY") or os.path.join(HERE, "conf", "cluster.yaml")


def _host_cores(c):
    """``per_host`` without ``brokers``: a host's cores, asked over SSH (``nproc``) with the defaults' login."""
    def cores(host, ssh):
        probe = SimpleNamespace(name="per_host:%s" % host, host=host, **ssh)
        try:
            out = _connection(c, probe).run("nproc", hide=True, warn=True)
        except Exception as exc:  # an SSH failure of any kind: the inventory cannot be resolved
            raise InventoryError("per_host: cannot ask %s for its cores: %s (or set per_host.brokers)"
                                 % (host, _explain(exc, probe).splitlines()[0])) from None
        if not out.ok or not out.stdout.strip().isdigit():
            raise InventoryError("per_host: %s did not tell its cores (nproc: %s); set per_host.brokers"
                                 % (host, (out.stderr or out.stdout).strip() or "exit %d" % out.exited))
        return int(out.stdout.strip())
    return cores


def _brokers(c, inventory, only):
    """(cluster, selected brokers); Exit(2) for an invalid inventory or selection."""
    try:
        cluster = load_inventory(_inventory_path(inventory), cores=_host_cores(c))
        brokers = cluster.select(only)
        if isinstance(c, Connection):  # fab -H host: this host's brokers only
            brokers = [b for b in brokers if b.host == c.host]
            if not brokers:
                raise InventoryError("%s: no broker on host %s" % (cluster.source, c.host))
    except InventoryError as exc:
        raise Exit(str(exc), code=2) from exc
    return cluster, brokers


def _connection(c, broker):
    key = (broker.name, broker.host, broker.ssh_port, broker.ssh_user)
    conn = _connections.get(key)
    if conn is None:
        config = c.config if isinstance(c.config, Config) else Config(overrides=dict(c.config))
        kwargs = dict(config.connect_kwargs)
        if broker.ssh_key:
            files = kwargs.get("key_filename") or []
            kwargs["key_filename"] = ([files] if isinstance(files, str) else list(files)) + [
                os.path.expanduser(broker.ssh_key)]
        conn = Connection(broker.host, user=broker.ssh_user, port=broker.ssh_port, config=config,
                          connect_timeout=broker.ssh_timeout_s, connect_kwargs=kwargs)
        _connections[key] = conn
    return conn


@atexit.register
def _close_connections():
    for conn in _connections.values():
        conn.close()


def _explain(exc, broker):
    """An operator's sentence for whatever went wrong on a host."""
    where = "%s%s:%d" % (broker.ssh_user + "@" if broker.ssh_user else "", broker.host, broker.ssh_port)
    if isinstance(exc, HostFailure):
        return str(exc)
    if isinstance(exc, paramiko.AuthenticationException):
        return "SSH login to %s refused: %s (fab -i KEY, or ssh_key/ssh_user in the inventory)" % (where, exc)
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "cannot connect by SSH to %s: no answer within %.0f s" % (where, broker.ssh_timeout_s)
    if isinstance(exc, paramiko.SSHException):
        return "SSH error with %s: %s" % (where, exc)
    if isinstance(exc, OSError):
        return "cannot connect by SSH to %s: %s" % (where, exc.strerror or exc)
    return "unexpected %s: %s\n%s" % (type(exc).__name__, exc, traceback.format_exc())  # a bug: show where


def _on_hosts(c, brokers, action, parallel=False, stop_at_failure=False, quiet=False):
    """Run ``action(conn, broker)`` per broker, print ``[name] report`` lines (unless quiet); [(broker, ok, report)]."""
    def one(broker):
        try:
            report = action(_connection(c, broker), broker)
            ok = True
        except Exception as exc:  # every failure becomes a report line; the others go on (or stop, see below)
            report, ok = _explain(exc, broker), False
        if report is not None and not quiet:
            _say(hostops.report_line(broker, ok, report))
        return broker, ok, report

    if parallel and len(brokers) > 1:
        with ThreadPoolExecutor(max_workers=min(8, len(brokers))) as pool:
            return list(pool.map(one, brokers))
    results = []
    for broker in brokers:
        results.append(one(broker))
        if stop_at_failure and not results[-1][1]:
            break
    return results


def _finish(what, results, total=None):
    failed = [b.name for b, ok, _ in results if not ok]
    if failed:
        raise Exit("%s failed on %d of %d brokers: %s" % (what, len(failed), total or len(results), ", ".join(failed)),
                   code=1)


def _get_bundle():
    if not _bundle:
        try:
            bundle = build_bundle(os.environ.get("METAQ_DEPLOY_SOURCE") or HERE, say=_say)
        except BundleError as exc:
            raise Exit("cannot build the package: %s" % exc, code=1) from exc
        _say("package: metaq %s, id %s (%d wheels, %.1f MB, for Python %s on %s), ready in %.1f s" % (
            bundle.version, bundle.id, len(bundle.wheels), bundle.size / 1e6, bundle.python, bundle.machine,
            bundle.seconds))
        _bundle.append(bundle)
    return _bundle[0]


@task
def check(c, inventory=None, only=None, show_config=False):
    """Validate the inventory and show each broker's settings (--show-config: its rendered server.yaml)."""
    cluster, brokers = _brokers(c, inventory, only)
    _say("%s: cluster %s, %d brokers" % (cluster.source, cluster.name, len(cluster.brokers)))
    header = ("BROKER", "SSH", "ROLE", "ID", "LISTEN", "PORT", "REPL_PORT", "INSTALL_DIR", "DATA_DIR", "ZOOKEEPER")
    rows = [(b.name, "%s%s:%d" % (b.ssh_user + "@" if b.ssh_user else "", b.host, b.ssh_port), b.role_text,
             b.broker_id, b.listen, b.port, b.replication_port or "-", b.install_dir, b.data_dir, b.zk_connect or "-")
            for b in brokers]
    _say(hostops.table(rows, header))
    names = ("text", "replication", "remoting", "http", "mqtt", "grpc")
    _say("\nports (- : off):")
    _say(hostops.table([(b.name, b.listen) + tuple(ports(b)[n] or "-" for n in names) for b in brokers],
                       ("BROKER", "LISTEN") + tuple(n.upper() for n in names)))
    for note in cluster.notes + tuple(_group_notes(cluster, brokers)) + tuple(mqtt_cluster_notes(brokers)):
        _say("note: %s" % note)
    if show_config:
        for b in brokers:
            _say("\n--- %s: %s/conf/server.yaml (config %s)" % (b.name, b.install_dir, b.config_sha256[:12]))
            _say(b.config_text.rstrip("\n"))


def _group_notes(cluster, brokers):
    """What a rolling restart of each selected replication group costs (README "Deploying with Fabric")."""
    notes, seen = [], set()
    for b in brokers:
        members = cluster.members(b)
        if len(members) < 2 or b.group in seen:
            continue
        seen.add(b.group)
        master, slaves = members[0], members[1:]
        names = "%s with %s" % (master.name, ", ".join(s.name for s in slaves))
        if master.ha == "manual":
            notes.append("%s (ha manual): start runs masters before slaves, stop slaves before masters; "
                         "rolling-restart restarts the slaves first, then %s, and sends to broker id %d fail "
                         "while %s is down (ha: auto hands the writes over instead)"
                         % (names, master.name, master.broker_id, master.name))
        else:
            notes.append("%s (ha auto): rolling-restart restarts the slaves first, then stops the master, waits for "
                         "another member to be elected and brings it back as a slave" % names)
        if master.replication_mode == "sync" and len(slaves) == 1:
            notes.append("%s replicates in sync mode with one slave: sends to broker id %d fail while %s restarts "
                         "(503 SLAVE_NOT_AVAILABLE); a second slave avoids that" % (master.name, master.broker_id,
                                                                                  slaves[0].name))
    return notes


@task(help={kind: "local path of %s ({host}, {name}: the broker's)" % what
            for kind, (what, _where) in host_files.KINDS.items()})
def files(c, inventory=None, only=None, acl=None, secret=None, cert=None, key=None, ca=None, credentials=None):
    """Send the files the brokers' settings name on their hosts (ACL, replication secret, TLS, credentials) from
    local paths, mode 0600: no secret ever goes into the inventory."""
    _, brokers = _brokers(c, inventory, only)
    given = {"acl": acl, "secret": secret, "cert": cert, "key": key, "ca": ca, "credentials": credentials}
    if not any(given.values()):
        raise Exit("give at least one of --%s" % ", --".join(host_files.KINDS), code=2)
    try:
        plans = {b.name: host_files.planned(b, given) for b in brokers}
    except InventoryError as exc:
        raise Exit(str(exc), code=2) from exc
    _finish("files", _on_hosts(c, brokers, lambda conn, b: hostops.send_files(conn, b, plans[b.name]),
                               parallel=True))


@task
def deploy(c, inventory=None, only=None, serial=False):
    """Build the package once, then per host: upload, install into a new virtualenv, render server.yaml."""
    cluster, brokers = _brokers(c, inventory, only)
    bundle = _get_bundle()
    results = _on_hosts(c, brokers, lambda conn, b: hostops.deploy(conn, b, bundle, cluster.name),
                        parallel=not serial)
    _finish("deploy", results)


def _agent_task(verb, options_of, ok_states):
    def action(conn, broker):
        report = hostops.agent(conn, broker, verb, *options_of(broker))
        if not report.get("ok") and report.get("state") not in ok_states:
            raise HostFailure(report.get("message") or "%s: %s" % (verb, report.get("state")))
        return report.get("message") or report.get("state")
    return action


def _start_action(require_zk=False):
    options = lambda b: ["--timeout", b.start_timeout_s] + (["--require-zk"] if require_zk else [])  # noqa: E731
    return _agent_task("start", options, ())


def _stop_action(force=False):
    options = lambda b: ["--timeout", b.stop_timeout_s] + (["--force"] if force else [])  # noqa: E731
    return _agent_task("stop", options, ("not deployed",))


def _statuses(c, brokers):
    """{name: the agent's status report} of each broker, asked in parallel (an SSH failure: ``unreachable``)."""
    reports = {}

    def ask(conn, broker):
        reports[broker.name] = hostops.agent(conn, broker, "status")

    for broker, ok, error in _on_hosts(c, brokers, ask, parallel=True, quiet=True):
        if not ok:
            reports[broker.name] = {"state": "unreachable", "message": error}
    return reports


def _start_all(c, brokers):
    """Masters first (in parallel), then slaves (in parallel): a slave finds its master listening."""
    return [r for wave in start_waves(brokers) for r in _on_hosts(c, wave, _start_action(), parallel=True)]


def _stop_all(c, cluster, brokers, force=False):
    """Slaves first, then masters (by the role each plays now, asked first when it replicates): no election and
    no master left without the log its slaves hold."""
    replicating = [b for b in brokers if len(cluster.members(b)) > 1 or b.ha == "auto"]
    roles = {name: rolling.live_role(r) for name, r in _statuses(c, replicating).items()} if replicating else {}
    return [r for wave in stop_waves(brokers, roles) for r in _on_hosts(c, wave, _stop_action(force), parallel=True)]


@task
def start(c, inventory=None, only=None):
    """Start each broker (a daemon with a pid file) and wait until it answers `version`; masters before slaves."""
    _, brokers = _brokers(c, inventory, only)
    _finish("start", _start_all(c, brokers), len(brokers))


@task
def stop(c, inventory=None, only=None, force=False):
    """Stop each broker: SIGTERM (graceful), then wait until it has exited (--force: SIGKILL after the timeout);
    slaves before their masters."""
    cluster, brokers = _brokers(c, inventory, only)
    _finish("stop", _stop_all(c, cluster, brokers, force), len(brokers))


@task
def restart(c, inventory=None, only=None):
    """Stop every selected broker, then start them all (a full restart; see rolling-restart for no downtime)."""
    cluster, brokers = _brokers(c, inventory, only)
    stopped = _stop_all(c, cluster, brokers)
    started = _start_all(c, [b for b, ok, _ in stopped if ok])
    _finish("restart", [r for r in stopped if not r[1]] + started, len(brokers))


class _Ops:
    """What metaq.deploy.rolling does on the hosts, through Fabric."""

    def __init__(self, c):
        self.c = c
        self.start_healthy = _start_action(require_zk=True)
        self.stop_action = _stop_action()

    def statuses(self, brokers):
        return _statuses(self.c, brokers)

    def status(self, broker):
        return hostops.agent(_connection(self.c, broker), broker, "status")

    def stop(self, broker):
        return self.stop_action(_connection(self.c, broker), broker)

    def start(self, broker):
        return self.start_healthy(_connection(self.c, broker), broker)

    explain = staticmethod(lambda exc, broker: _explain(exc, broker))
    say = staticmethod(lambda text: _say(text))


@task
def rolling_restart(c, inventory=None, only=None):
    """Restart one broker at a time, each healthy (and registered) before the next; stop at the first failure.

    First every selected broker must be up (a preflight over all of them): nothing restarts otherwise. Each
    replication group restarts its slaves first (each waited for until caught up), then its master (ha: manual:
    its broker id takes no writes meanwhile; ha: auto: another member is elected first). See metaq/deploy/rolling.py.
    """
    cluster, brokers = _brokers(c, inventory, only)
    try:
        rolling.rolling_restart(cluster, brokers, _Ops(c))
    except rolling.RollingFailed as failed:
        if failed.preflight:
            _finish("rolling restart (nothing was restarted)", failed.results, len(brokers))
        rest = [b.name for b in failed.remaining]
        raise Exit("rolling restart stopped at %s%s" % (
            failed.results[-1][0].name, "; not restarted: %s" % ", ".join(rest) if rest else ""), code=1) from failed


@task
def status(c, inventory=None, only=None):
    """Show each broker: state, role, pid, version, uptime, topics, messages, ZooKeeper, replication link and lag,
    pending restart."""
    cluster, brokers = _brokers(c, inventory, only)
    reports = _statuses(c, brokers)
    rows = [hostops.status_row(b, reports[b.name]) for b in brokers]
    _say(hostops.table(rows, hostops.STATUS_COLUMNS))
    for note in filter(None, (hostops.status_note(b, reports[b.name]) for b in brokers)):
        _say(note)
    down = [b.name for b in brokers if reports[b.name].get("state") != "up"]
    if down:
        raise Exit("not up: %s" % ", ".join(down), code=1)


@task
def logs(c, inventory=None, only=None, lines=50):
    """Print the last --lines lines (default 50) of each broker's log."""
    _, brokers = _brokers(c, inventory, only)
    _finish("logs", _on_hosts(c, brokers, lambda conn, b: "==> %s <==\n%s" % (
        Layout(b.install_dir).log, hostops.logs(conn, b, lines))))


@task
def uninstall(c, inventory=None, only=None, purge_data=False):
    """Stop each broker and remove its install dir (with --purge-data, its data dir too)."""
    _, brokers = _brokers(c, inventory, only)
    _finish("uninstall", _on_hosts(c, brokers, lambda conn, b: hostops.uninstall(conn, b, purge_data)))
