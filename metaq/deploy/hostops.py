"""What each fab task does on one host, given a connection to it (``fabfile.py`` supplies Fabric's).

``conn`` is anything with Fabric's ``Connection`` interface: ``run(cmd, hide=, warn=, in_stream=, pty=)``
returning a result with ``exited``/``stdout``/``stderr``, and ``sftp()``. Every function either
returns a one-line report or raises ``HostFailure`` with a message an operator can act on.
"""

import hashlib
import io
import json
import posixpath
import socket
import time

from metaq.deploy import units
from metaq.deploy.inventory import server_config
from metaq.deploy.layout import Layout
from metaq.deploy.remote import agent_command, facts_command, pip_install_command, q

__all__ = ["HostFailure", "deploy", "agent", "logs", "uninstall", "send_files",
           "status_row", "status_note", "report_line",
           "STATUS_COLUMNS"]

_TAIL = 12
_STEP = "@@metaq-deploy-step: "


class HostFailure(Exception):
    """The task failed on this host; the message says what happened and, where possible, what to do."""


def run(conn, cmd, what):
    """stdout of ``cmd`` on the host; HostFailure naming ``what`` on a non-zero exit."""
    r = conn.run(cmd, hide=True, warn=True, in_stream=False, pty=False)
    if r.exited != 0:
        raise HostFailure("%s failed (exit %d): %s" % (what, r.exited, _tail(r.stderr or r.stdout)))
    return r.stdout


def run_steps(conn, steps):
    """Run ``[(what, cmd), ...]`` in one shell on the host (one round trip), stopping at the first failure.

    Each step announces itself on stderr, so a failure names the step and shows only its own output.
    """
    script = " && ".join("{ echo %s >&2; %s; }" % (q(_STEP + what), cmd) for what, cmd in steps)
    r = conn.run(script, hide=True, warn=True, in_stream=False, pty=False)
    if r.exited != 0:
        what, output = "a step", r.stderr
        if _STEP in r.stderr:
            head, _, rest = r.stderr.rpartition(_STEP)
            what, _, output = rest.partition("\n")
        raise HostFailure("%s failed (exit %d): %s" % (what, r.exited, _tail(output or r.stdout)))
    return r.stdout


def _tail(text, lines=_TAIL):
    return "\n".join(text.strip().splitlines()[-lines:]) or "(no output)"


def facts(conn, broker):
    r = conn.run(facts_command(broker.python, broker.install_dir, broker.name), hide=True, warn=True,
                 in_stream=False, pty=False)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise HostFailure("no usable Python at `%s` on the host (exit %d: %s); install Python 3 there or set "
                          "`python:` for this broker in the inventory" % (broker.python, r.exited, _tail(r.stderr, 3))
                          ) from None


# --- deploy --------------------------------------------------------------------------------------


def deploy(conn, broker, bundle, cluster_name):
    """Bring the host to this package and this config; touch nothing when it already has both."""
    layout = Layout(broker.install_dir)
    found = facts(conn, broker)
    if (found["python"], found["machine"]) != (bundle.python, bundle.machine):
        raise HostFailure("`%s` on the host is Python %s on %s, but the wheels were built here for Python %s on %s: "
                          "point `python:` for this broker at a Python %s there" % (
                              broker.python, found["python"], found["machine"], bundle.python, bundle.machine,
                              bundle.python))
    state = found["state"] or {}
    package_ok = (state.get("package_sha256") == bundle.sha256 and found["current"] == bundle.id
                  and found["current_ok"])
    config_ok = found["config_sha256"] == broker.config_sha256 == state.get("config_sha256")
    unit = broker_unit(layout, broker, cluster_name, found["user"])
    unit_sha256 = hashlib.sha256(unit.encode("utf-8")).hexdigest()
    as_service = found["systemd"] and found["root"]
    unit_ok = found["unit_sha256"] == unit_sha256 and (not as_service or found["installed_unit_sha256"] == unit_sha256)
    if package_ok and config_ok and unit_ok:
        return "unchanged (package %s, config %s)" % (bundle.id, broker.config_sha256[:12])
    run(conn, q("mkdir", "-p", layout.wheels, layout.releases, *sorted({posixpath.dirname(p) for p in (
        layout.config, layout.pidfile, layout.log)}), broker.data_dir), "creating directories")
    changes = []
    if not package_ok:
        sent = _upload_wheels(conn, layout, bundle, found["wheels"])
        built = _install_release(conn, broker, layout, bundle, found["releases"].get(bundle.id))
        changes.append("installed metaq %s (package %s: %d of %d wheels uploaded, %.1f MB%s)" % (
            bundle.version, bundle.id, len(sent), len(bundle.wheels), sum(w.size for w in sent) / 1e6,
            ", virtualenv built" if built else ", release already on the host"))
    if found["config_sha256"] != broker.config_sha256:
        _upload_config(conn, layout, broker)
        changes.append("server.yaml updated (config %s)" % broker.config_sha256[:12])
    if not unit_ok:
        changes.append(_install_unit(conn, layout, broker, unit, as_service, found))
    _write_state(conn, layout, broker, bundle, cluster_name)
    _prune(conn, layout, bundle, found)
    if found["pid"]:
        what = " and ".join(w for w, changed in (("package", not package_ok),
                                                  ("config", found["config_sha256"] != broker.config_sha256))
                            if changed) or "deploy"
        changes.append("the running broker (pid %s) still has the previous %s: restart to apply (fab rolling-restart)"
                       % (found["pid"], what))
    return "; ".join(changes) or "state recorded (package %s, config %s)" % (bundle.id, broker.config_sha256[:12])


def broker_unit(layout, broker, cluster_name, user):
    """The text of the broker's systemd unit, run as ``user`` (the deploying user, who owns its files)."""
    from metaq.server.config import ServerConfig

    return units.unit_text(layout, broker.name, cluster_name, user,
                           units.nofile(ServerConfig.model_validate(server_config(broker))))


def _install_unit(conn, layout, broker, unit, as_service, found):
    """Keep the unit under conf/; where systemd is the host's init and we are root, install and enable it."""
    _put_text(conn, layout.unit(broker.name), unit)
    if not as_service:
        why = "systemd is not this host's init" if not found["systemd"] else "%s is not root" % found["user"]
        return "systemd unit written to %s, not installed (%s): the agent runs the broker as its own daemon" % (
            layout.unit(broker.name), why)
    name = units.unit_name(broker.name)
    _put_text(conn, units.installed_path(broker.name), unit)
    run(conn, "%s && %s" % (q("systemctl", "daemon-reload"), q("systemctl", "enable", name)),
        "enabling the systemd unit %s" % name)
    return "systemd unit %s installed and enabled (restart on failure, start at boot)" % name


def _upload_wheels(conn, layout, bundle, on_host):
    """Upload the wheels the host lacks (or has with other content); each lands whole or not at all."""
    missing = [w for w in bundle.wheels if on_host.get(w.filename) != w.sha256]
    if missing:
        sftp = conn.sftp()
        for w in missing:
            final = posixpath.join(layout.wheels, w.filename)
            sftp.put(w.path, final + ".part")
            sftp.posix_rename(final + ".part", final)
    return missing


def _install_release(conn, broker, layout, bundle, complete):
    """Make releases/<id> (a fresh virtualenv with exactly the bundle's wheels) and point ``current`` at it."""
    release = layout.release(bundle.id)
    steps = []
    if not complete:
        wheel = lambda w: posixpath.join(layout.wheels, w.filename)  # noqa: E731
        steps += [
            ("creating the virtualenv", "%s && %s" % (q("rm", "-rf", release),
                                                      q(broker.python, "-m", "venv", "--without-pip",
                                                        layout.venv(bundle.id)))),
            ("installing the wheels", pip_install_command(layout.python(bundle.id), wheel(bundle.pip),
                                                          [wheel(w) for w in bundle.installs], layout.wheels)),
            ("checking the installed broker", "%s | grep -qF %s" % (q(layout.server_script(bundle.id), "--version"),
                                                                    q(" " + bundle.version))),
            ("marking the release complete", q("touch", posixpath.join(release, ".complete"))),
        ]
    tmp = layout.current + ".new"
    steps.append(("switching `current` to the new release", "%s && %s" % (
        q("ln", "-sfn", posixpath.join("releases", bundle.id), tmp), q("mv", "-Tf", tmp, layout.current))))
    run_steps(conn, steps)
    return not complete


def _put_text(conn, path, text):
    """Write a file on the host atomically (a temporary beside it, then a rename)."""
    sftp = conn.sftp()
    sftp.putfo(io.BytesIO(text.encode("utf-8")), path + ".tmp")
    sftp.posix_rename(path + ".tmp", path)


def _upload_config(conn, layout, broker):
    """Upload server.yaml beside the old one, let the installed broker validate it, then rename it into place."""
    tmp = layout.config + ".new"
    conn.sftp().putfo(io.BytesIO(broker.config_text.encode("utf-8")), tmp)
    check = q(layout.server_script(), "-c", tmp, "--check-config")
    install = q("mv", "-f", tmp, layout.config)
    r = conn.run("%s >/dev/null && %s || { status=$?; rm -f %s; exit $status; }" % (check, install, q(tmp)),
                 hide=True, warn=True, in_stream=False, pty=False)
    if r.exited != 0:
        raise HostFailure("the broker refuses the rendered server.yaml: %s" % _tail(r.stderr or r.stdout, 5))


def _write_state(conn, layout, broker, bundle, cluster_name):
    state = {
        "cluster": cluster_name, "broker": broker.name, "broker_id": broker.broker_id, "version": bundle.version,
        "package_sha256": bundle.sha256, "release": bundle.id, "config_sha256": broker.config_sha256,
        "wheels": [w.filename for w in bundle.wheels],
        "deployed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "deployed_from": socket.gethostname(),
    }
    _put_text(conn, layout.state, json.dumps(state, indent=2, sort_keys=True) + "\n")


def _prune(conn, layout, bundle, found):
    """Drop releases no one uses (keeping the previous one for a quick way back) and wheels of older packages."""
    keep = {bundle.id, found["current"], found["running_release"]}
    old = [layout.release(r) for r in found["releases"] if r not in keep]
    names = {w.filename for w in bundle.wheels}
    old += [posixpath.join(layout.wheels, n) for n in found["wheels"] if n not in names]
    if old:
        run(conn, q("rm", "-rf", "--", *old), "removing old releases and wheels")


# --- the broker: start, stop, status, logs, uninstall ---------------------------------------------


def agent(conn, broker, command, *options):
    """The agent's JSON report; ``{"state": "not deployed"}`` when the host has no installed release."""
    layout = Layout(broker.install_dir)
    if broker.credentials:  # the path of the probe's credentials file on the host: never the secret itself
        options = options + ("--credentials", broker.credentials)
    cmd = "if [ -x %s ]; then %s; else echo '{\"ok\": false, \"state\": \"not deployed\"}'; fi" % (
        q(layout.python()), agent_command(broker.install_dir, command, *options))
    r = conn.run(cmd, hide=True, warn=True, in_stream=False, pty=False)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise HostFailure("the deploy agent failed (exit %d): %s" % (r.exited, _tail(r.stderr or r.stdout))) from None


def logs(conn, broker, lines):
    layout = Layout(broker.install_dir)
    r = conn.run(q("tail", "-n", int(lines), layout.log), hide=True, warn=True, in_stream=False, pty=False)
    if r.exited != 0:
        return "(no log at %s)" % layout.log
    return r.stdout.rstrip("\n")


def send_files(conn, broker, plan):
    """Upload each ``(kind, local path, host path)`` of ``plan`` (metaq.deploy.files.planned): mode 0600, whole or
    not at all; a missing directory made 0700. The report names what went where."""
    if not plan:
        return "nothing to send"
    run(conn, " && ".join("{ [ -d %s ] || mkdir -p -m 0700 %s; }" % (q(posixpath.dirname(target)),
                                                                     q(posixpath.dirname(target)))
                          for _kind, _local, target in plan), "making the files' directories")
    sftp = conn.sftp()
    for _kind, local, target in plan:
        with open(local, "rb") as f:
            data = f.read()
        tmp = target + ".tmp"
        with sftp.open(tmp, "wb") as out:
            out.chmod(0o600)  # before the first byte: the secret is never readable by others
            out.write(data)
        sftp.posix_rename(tmp, target)
    return "sent %s (mode 0600)" % ", ".join("%s -> %s" % (kind, target) for kind, _local, target in plan)


def uninstall(conn, broker, purge_data):
    layout = Layout(broker.install_dir)
    r = conn.run(q("test", "-d", layout.home), hide=True, warn=True, in_stream=False)
    gone = []
    if r.exited == 0:
        report = agent(conn, broker, "stop", "--timeout", broker.stop_timeout_s)
        if report.get("state") not in ("down", "not deployed"):
            raise HostFailure("not removed: the broker did not stop: %s" % report.get("message"))
        if conn.run(q("test", "-f", layout.state), hide=True, warn=True, in_stream=False).exited != 0:
            raise HostFailure("not removed: %s has no %s, so deploy did not make it" % (
                layout.home, posixpath.basename(layout.state)))
        unit = units.installed_path(broker.name)
        run(conn, "if [ -f %s ]; then %s; %s && %s; fi" % (q(unit), q("systemctl", "disable", units.unit_name(
            broker.name)), q("rm", "-f", unit), q("systemctl", "daemon-reload")), "removing the systemd unit")
        run(conn, q("rm", "-rf", "--", layout.home), "removing the install dir")
        gone.append(layout.home)
    if purge_data:
        run(conn, q("rm", "-rf", "--", broker.data_dir), "removing the data dir")
        gone.append(broker.data_dir)
    if not gone:
        return "not installed (no %s)" % layout.home
    kept = "" if purge_data else "; data kept in %s (uninstall --purge-data removes it)" % broker.data_dir
    return "removed %s%s" % (" and ".join(gone), kept)


STATUS_COLUMNS = ("BROKER", "HOST", "PORT", "ROLE", "STATE", "PID", "VERSION", "UPTIME", "TOPICS", "MESSAGES",
                  "ZOOKEEPER", "LINK", "REPL_LAG", "PENDING")


def report_line(broker, ok, report):
    """How a task reports one broker: ``[b0] <report>``, or ``[b0] FAILED on b0 (root@host:22): <why>``."""
    return "%s %s" % ("[%s]" % broker.name if ok else "[%s] FAILED on %s:" % (broker.name, broker.label), report)


def status_row(broker, report):
    """One status table row (a tuple matching STATUS_COLUMNS) from the agent's status report."""
    up = report.get("state") == "up"
    stats = (report.get("stats") or {}) if up else {}
    pending = report.get("pending") or []
    return (broker.name, broker.listen, str(broker.port), _role(broker, stats), report.get("state", "?"),
            str(report.get("pid") or stats.get("pid") or "-"), report.get("version") or "-",
            format_uptime(stats.get("uptime")), stats.get("topics", "-"), stats.get("total_messages", "-"),
            stats.get("zookeeper", "-"), _link(stats), _lag(stats),
            "restart (%s)" % "+".join(pending) if pending else "-")


def _role(broker, stats):
    """The role the broker plays now (from ``stats``; the inventory's when it does not say), and how it differs."""
    live = stats.get("replication_role")
    if live not in ("master", "slave"):
        return broker.role if broker.ha == "manual" else "ha auto"
    if broker.ha == "auto":
        return "%s (auto)" % live
    return live if live == broker.role else "%s (inventory: %s)" % (live, broker.role)


def _link(stats):
    """A slave's link to its master; a master's number of connected slaves."""
    role = stats.get("replication_role")
    if role == "slave":
        return stats.get("replication_link", "-")
    if role == "master" and stats.get("replication_slaves") is not None:
        n = stats["replication_slaves"]
        return "%s slave%s" % (n, "" if n == "1" else "s")
    return "-"


def _lag(stats):
    """A slave's lag behind its master, from its ``stats`` (docs/replication.md: up to 100 ms old)."""
    if stats.get("replication_role") != "slave":
        return "-"
    if stats.get("replication_caught_up") == "true":
        return "caught up"
    lag = stats.get("replication_lag_messages", "-1")
    return "unknown" if lag.startswith("-") else "%s msgs behind" % lag


def status_note(broker, report):
    """A line to print under the status table for this broker, or None."""
    if report.get("state") != "up":
        return "%s: %s" % (broker.name, report["message"]) if report.get("message") else None
    stats = report.get("stats") or {}
    if stats.get("replication_role") == "slave" and stats.get("replication_link") != "connected":
        return "%s: replication link to %s is down (fab logs --only %s)" % (
            broker.name, stats.get("replication_master", "its master"), broker.name)
    return None


def format_uptime(seconds):
    if seconds is None or not str(seconds).isdigit():
        return "-"
    s = int(seconds)
    if s < 60:
        return "%ds" % s
    if s < 3600:
        return "%dm%02ds" % (s // 60, s % 60)
    if s < 86400:
        return "%dh%02dm" % (s // 3600, s % 3600 // 60)
    return "%dd%02dh" % (s // 86400, s % 86400 // 3600)


def table(rows, header):
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    line = lambda r: "  ".join(str(v).ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])
