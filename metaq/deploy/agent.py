"""The deploy agent: runs on a broker's host, from the installed package, and manages that one broker.

    <install_dir>/current/venv/bin/python -m metaq.deploy.agent start  --home <install_dir> [--timeout S] [--require-zk]
    <install_dir>/current/venv/bin/python -m metaq.deploy.agent stop   --home <install_dir> [--timeout S] [--force]
    <install_dir>/current/venv/bin/python -m metaq.deploy.agent status --home <install_dir>
    (each also takes --credentials FILE: how the probe authenticates, below)

Each prints one JSON object as its last line on stdout, and exits 0 when it did what was asked,
1 when not (the object's ``message`` says why).

* ``start`` launches ``releases/<id>/venv/bin/metaq-server -c conf/server.yaml`` (the real path
  behind ``current``, so a later deploy never changes the code under it) in a session of its own,
  stdin from /dev/null and output appended to ``log/metaq.log``, so the SSH session that asked
  for it ends at once. It writes the pid file and waits until the broker answers ``version`` and
  its ``stats`` show that pid (with ``--require-zk``, also until it is registered in ZooKeeper).
* ``stop`` sends SIGTERM (the broker's graceful stop) and waits until the process is gone. A
  daemon's parent is init, which may reap it late: a zombie counts as gone, so ``stop`` never
  waits on an exited process. ``--force`` sends SIGKILL after the timeout.
* ``status`` reads the pid file and the broker's ``stats``.

A pid file only counts when that pid is a live process whose command line names this
install's server.yaml: a stale file left by a crash or a reused pid is never signalled.

The probe (``version`` and ``stats`` over the text protocol) authenticates, and connects over TLS,
as the credentials file named by ``--credentials`` says (the inventory's ``credentials:``, a path
on the host), else as the host's ``METAQ_CREDENTIALS`` / ``METAQ_USER`` ... environment says
(``metaq.client.security``). Only the path is ever on a command line; the secret stays in the file.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

from metaq import errors
from metaq.deploy import units
from metaq.deploy.layout import Layout

POLL_S = 0.05
PROBE_TIMEOUT_S = 2.0
LOG_TAIL_LINES = 20


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m metaq.deploy.agent", description=__doc__.split("\n")[0])
    p.add_argument("command", choices=("start", "stop", "status"))
    p.add_argument("--home", required=True, help="the broker's install dir")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the start or the stop")
    p.add_argument("--require-zk", action="store_true", help="start: also wait for the ZooKeeper registration")
    p.add_argument("--force", action="store_true", help="stop: SIGKILL when SIGTERM did not stop it in time")
    p.add_argument("--credentials", metavar="FILE", help="the probe's credentials file (mode 0600; default: "
                   "$METAQ_CREDENTIALS and the other METAQ_* variables)")
    args = p.parse_args(argv)
    layout = Layout(os.path.abspath(args.home))
    try:
        security = probe_security(args.credentials)
    except errors.ConfigError as exc:
        ok, report = False, {"state": "error", "message": "the agent's credentials: %s" % exc}
    else:
        if args.command == "start":
            ok, report = start(layout, args.timeout, args.require_zk, security)
        elif args.command == "stop":
            ok, report = stop(layout, args.timeout, args.force)
        else:
            ok, report = status(layout, security)
    report["ok"] = ok
    print(json.dumps(report, sort_keys=True))
    return 0 if ok else 1


# --- the broker process ------------------------------------------------------------------------


def _proc_state(pid):
    """The process state letter from /proc (R, S, Z, ...), or None when there is no such process."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:][:1] or None  # the field after "(comm)", which may hold spaces


def _cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def alive(pid):
    """True until ``pid`` has exited: a zombie (exited, not yet reaped by its parent) counts as exited."""
    state = _proc_state(pid)
    return state is not None and state not in "ZX"


def is_ours(pid, layout):
    """True when ``pid`` is alive and runs this install's broker (its command line names our server.yaml)."""
    return alive(pid) and layout.config in _cmdline(pid)


def running_pid(layout):
    """The broker's pid when the pid file names our live broker, else None."""
    try:
        with open(layout.pidfile) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return pid if is_ours(pid, layout) else None


def running_release(pid):
    """The release id a running broker was started from (from its command line), or None."""
    for arg in _cmdline(pid):
        parts = arg.split("/")
        if "releases" in parts[:-1]:
            return parts[parts.index("releases") + 1]
    return None


def _write_atomically(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _write_pidfile(layout, pid, address, release):
    """The pid file, and beside it the address the broker was started on (the config may change later)."""
    _write_atomically(layout.runinfo, json.dumps({"pid": pid, "host": address[0], "port": address[1],
                                                  "release": release}) + "\n")
    _write_atomically(layout.pidfile, "%d\n" % pid)


def _remove_pidfile(layout):
    for path in (layout.pidfile, layout.runinfo):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def running_address(layout, pid):
    """(host, port) the running broker ``pid`` was started on, else the one in its server.yaml."""
    try:
        with open(layout.runinfo) as f:
            info = json.load(f)
        if info.get("pid") == pid:
            return info["host"], int(info["port"])
    except (OSError, ValueError, KeyError):
        pass
    return broker_address(layout)


# --- talking to the broker ---------------------------------------------------------------------


def broker_address(layout):
    """(host, port) the broker listens on, from its server.yaml (a wildcard bind is probed on loopback)."""
    import yaml

    from metaq.server.config import BrokerSection

    default = BrokerSection()
    with open(layout.config) as f:
        broker = (yaml.safe_load(f) or {}).get("broker") or {}
    host = broker.get("host", default.host)
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return host, int(broker.get("port", default.port))


def probe_security(credentials=None):
    """The probe's ``ClientSecurity``: the credentials file given, else the environment's; ConfigError."""
    from metaq.client.security import ClientSecurity

    return ClientSecurity.from_file(credentials) if credentials else ClientSecurity.from_env()


#: What to tell an operator whose broker wants credentials the agent was not given (or refused them).
CREDENTIALS_HINT = ("give the deploy agent credentials: `credentials:` in the inventory (a credentials file on the "
                    "host, mode 0600), or METAQ_CREDENTIALS in the host's environment")


def probe(address, timeout=PROBE_TIMEOUT_S, security=None):
    """``(version, stats dict)`` from the broker at ``address`` (TLS and ``auth`` as ``security`` says); OSError
    or ``errors.ConnectionLost`` when it does not answer, ``errors.Unauthenticated`` when it wants credentials
    it was not given, or refused them."""
    from metaq.protocol import events as ev
    from metaq.protocol.stream import NEED_DATA
    from metaq.protocol.stats import parse_summary
    from metaq import textcommands  # noqa: F401 - every text command declared (the whole table)
    from metaq.protocol.text import TextParser, serialize

    where = "the broker at %s:%d" % address
    sock = socket.create_connection(address, timeout=timeout)
    try:
        if security is not None:
            sock = security.wrap(sock, address[0], where)
            security.authenticate(sock, where, timeout)
        sock.sendall(serialize(ev.Version(1)) + serialize(ev.Stats(None, 2)))
        parser, replies = TextParser(max_body=1 << 20), {}
        while len(replies) < 2:
            event = parser.next_event()
            if event is NEED_DATA:
                data = sock.recv(65536)
                if not data:
                    raise ConnectionError("the broker closed the connection")
                parser.receive_data(data)
                continue
            if isinstance(event, ev.Result) and event.code == errors.Unauthenticated.code:
                raise errors.Unauthenticated("%s has authentication on (%s): %s" % (
                    where, bytes(event.body).decode("utf-8", "replace"), CREDENTIALS_HINT))
            if isinstance(event, ev.Result) and event.code == 400 and bytes(event.body).startswith(b"this port "
                                                                                               b"requires TLS"):
                raise errors.Unauthenticated("%s requires TLS: give the deploy agent a credentials file with `tls:` "
                                             "(the CA that signed the broker's certificate), `credentials:` in the "
                                             "inventory, or METAQ_TLS_CA in the host's environment" % where)
            if not isinstance(event, ev.Result) or event.code != 200:
                raise ConnectionError("unexpected reply %r" % (event,))
            replies[event.opaque] = event.body
    finally:
        sock.close()
    return replies[1].decode().strip(), parse_summary(replies[2])


def _config_crc(layout):
    """The ``config_checksum`` the broker would show for server.yaml as it is now; None without a file, -1 (no
    broker's) for a file no broker could start with (unreadable, invalid). The agent's own open-files limit is not
    checked against it (``read_config``): it is not the limit the broker runs with, and a running broker whose
    file is unchanged started with it under its own; the broker's check at its start is the one that refuses."""
    from metaq.server.config import read_config

    if not os.path.exists(layout.config):
        return None
    try:
        return read_config(layout.config).checksum()
    except (OSError, errors.ConfigError):
        return -1


def _log_tail(layout, since=0):
    try:
        with open(layout.log, "rb") as f:
            f.seek(since)
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-LOG_TAIL_LINES:])


# --- commands ----------------------------------------------------------------------------------


def start(layout, timeout, require_zk=False, security=None):
    pid = running_pid(layout)
    if pid:
        return True, {"state": "up", "pid": pid, "message": "already running (pid %d)" % pid}
    if not os.path.exists(layout.current):
        return False, {"state": "down", "message": "not deployed (no %s): run fab deploy" % layout.current}
    release = os.path.realpath(layout.current)
    server = os.path.join(release, "venv", "bin", "metaq-server")
    address = broker_address(layout)
    os.makedirs(os.path.dirname(layout.log), exist_ok=True)
    log_start = os.path.getsize(layout.log) if os.path.exists(layout.log) else 0
    started = time.monotonic()
    unit = service(layout)
    if unit is not None:  # systemd runs it: restarted on failure, started at boot
        ok, pid, why = _systemctl_start(unit, timeout)
        if not ok:
            return False, {"state": "down", "message": "systemctl start %s failed: %s; its log:\n%s"
                           % (unit, why, _log_tail(layout, log_start))}
        proc = _Started(pid)
    else:
        with open(layout.log, "ab") as log, open(os.devnull, "rb") as devnull:
            proc = subprocess.Popen([server, "-c", layout.config], stdin=devnull, stdout=log,
                                    stderr=subprocess.STDOUT, cwd=layout.home, start_new_session=True,
                                    close_fds=True)
    _write_pidfile(layout, proc.pid, address, os.path.basename(release))
    report = {"pid": proc.pid, "release": os.path.basename(release)}
    if unit is not None:
        report["unit"] = unit
    waiting_for = "an answer to `version`"
    while time.monotonic() - started < timeout:
        code = proc.poll()
        if code is not None:
            _remove_pidfile(layout)
            report.update(state="down", message="the broker exited with code %s while starting; its log:\n%s"
                          % (code, _log_tail(layout, log_start)))
            return False, report
        try:
            version, stats = probe(address, security=security)
        except errors.Unauthenticated as exc:  # it is up, but will not tell us more: waiting does not help
            report.update(state="unauthenticated", message="pid %d answers, but %s" % (proc.pid, exc))
            return False, report
        except (OSError, ValueError, errors.MetaqError):
            time.sleep(POLL_S)
            continue
        if stats.get("pid") != str(proc.pid):
            report.update(state="down", message="%s:%d is answered by another process (pid %s), not the broker "
                          "just started" % (address[0], address[1], stats.get("pid")))
            return False, report
        zk = stats.get("zookeeper", "standalone")
        if require_zk and zk not in ("standalone", "connected"):
            waiting_for = "the ZooKeeper registration (zookeeper %s)" % zk
            time.sleep(POLL_S)
            continue
        report.update(state="up", version=version, zookeeper=zk, seconds=round(time.monotonic() - started, 2),
                      message="started (pid %d) in %.1f s" % (proc.pid, time.monotonic() - started))
        return True, report
    report.update(state="starting", message="still running as pid %d but no %s within %.0f s; see fab logs"
                  % (proc.pid, waiting_for, timeout))
    return False, report


def stop(layout, timeout, force=False):
    pid = running_pid(layout)
    unit = service(layout)
    if pid is None and unit is None:
        _remove_pidfile(layout)
        return True, {"state": "down", "message": "not running"}
    started = time.monotonic()
    if unit is not None:  # through systemd, or it would start the broker again (Restart=on-failure)
        ok, why = _systemctl("stop", unit, timeout=timeout + 15)
        if not ok:
            return False, {"state": "up", "pid": pid, "message": "systemctl stop %s failed: %s" % (unit, why)}
        _remove_pidfile(layout)
        return True, {"state": "down", "pid": pid, "unit": unit, "seconds": round(time.monotonic() - started, 2),
                      "message": "stopped %s in %.1f s" % (unit, time.monotonic() - started)}
    os.kill(pid, signal.SIGTERM)
    signals = ["SIGTERM"]
    deadline = started + timeout
    while alive(pid):  # not is_ours(): an exiting process's command line is empty before it has closed its files
        if time.monotonic() >= deadline:
            if not force or "SIGKILL" in signals:
                return False, {"state": "up", "pid": pid, "message": "still running %g s after SIGTERM (pid %d); "
                               "fab stop --force sends SIGKILL" % (timeout, pid)}
            os.kill(pid, signal.SIGKILL)
            signals.append("SIGKILL")
            deadline = time.monotonic() + 10
        time.sleep(POLL_S / 2)
    _remove_pidfile(layout)
    return True, {"state": "down", "pid": pid, "seconds": round(time.monotonic() - started, 2),
                  "message": "stopped (pid %d, %s) in %.1f s" % (pid, "+".join(signals), time.monotonic() - started)}


class _Started:
    """A broker systemd started: its main pid, polled like a child process (None while it runs)."""

    def __init__(self, pid):
        self.pid = pid

    def poll(self):
        return None if alive(self.pid) else "(see systemctl status)"


def service(layout):
    """The systemd unit that runs this install's broker: when systemd is the host's init and ``fab deploy``
    installed the unit (metaq/deploy/units.py); None otherwise (the agent runs the broker itself)."""
    if not os.path.isdir("/run/systemd/system"):
        return None
    try:
        with open(layout.state) as f:
            name = json.load(f)["broker"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return units.unit_name(name) if os.path.exists(units.installed_path(name)) else None


def _systemctl(verb, unit, timeout):
    """(ok, why) of ``systemctl <verb> <unit>`` within ``timeout`` seconds."""
    try:
        r = subprocess.run(["systemctl", verb, unit], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, str(exc)
    return r.returncode == 0, (r.stderr or r.stdout).strip()


def _systemctl_start(unit, timeout):
    """(ok, main pid, why) of starting ``unit``."""
    ok, why = _systemctl("start", unit, timeout)
    if not ok:
        return False, None, why
    r = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", unit], capture_output=True, text=True,
                       timeout=timeout)
    pid = int(r.stdout.strip() or 0) if r.returncode == 0 and r.stdout.strip().isdigit() else 0
    return (True, pid, "") if pid else (False, None, "no main pid (%s)" % (r.stderr or r.stdout).strip())


def status(layout, security=None):
    report = {"current": os.path.basename(os.path.realpath(layout.current)) if os.path.exists(layout.current)
              else None}
    pid = running_pid(layout)
    report["pid"] = pid
    try:
        version, stats = probe(running_address(layout, pid) if pid else broker_address(layout), security=security)
    except errors.Unauthenticated as exc:
        report.update(state="unauthenticated", message=str(exc))
        return False, report
    except (OSError, ValueError, errors.MetaqError) as exc:
        report.update(state="down" if pid is None else "unresponsive",
                      message="not running" if pid is None else "pid %d does not answer: %s" % (pid, exc))
        return pid is None, report
    report.update(state="up", version=version, stats=stats)
    if pid is None:
        report["message"] = "answering, but not the broker of this install's pid file (pid %s)" % stats.get("pid")
        report["state"] = "foreign"
        return False, report
    pending = []
    if report["current"] and running_release(pid) not in (None, report["current"]):
        pending.append("package")
    crc = _config_crc(layout)
    if crc is not None and stats.get("config_checksum") not in (None, str(crc)):
        pending.append("config")
    report["pending"] = pending
    report["release"] = running_release(pid)
    return True, report


if __name__ == "__main__":
    sys.exit(main())
