"""``fab rolling-restart``: one broker at a time, replication groups in the order that keeps them serving.

For each group (a master and its slaves; a broker without replication is a group of one), in
inventory order:

1. its **slaves**, one at a time: stop, start, then wait (``catch_up_timeout_s``) until it reports
   ``replication_role slave``, ``replication_link connected`` and ``replication_caught_up true``;
2. its **master** (the member that reports ``replication_role master`` now: in ``ha: auto`` the
   election may have moved it):

   * ``ha: manual``: stop, start, then wait until the slaves that were linked catch up again.
     While it is down nothing takes writes for its broker id: sends to its partitions fail (a
     producer retries them, or sends to other brokers' partitions); the task says so, and for
     how long.
   * ``ha: auto``: stop it cleanly (it hands leadership over), wait (``handover_timeout_s``) until
     another member reports ``replication_role master``, start it, and wait
     (``catch_up_timeout_s``) until it reports ``replication_role slave`` and caught up.

Before anything restarts, every selected broker must be up, every slave to restart linked to its
master, and each group's roles as expected: in ``ha: manual`` the inventory's (a promoted slave
must be written into the inventory first), in ``ha: auto`` exactly one master. The task stops at
the first broker that fails.

The fabfile supplies ``ops``: ``status(broker)`` (the agent's status report), ``stop(broker)`` and
``start(broker)`` (their one-line reports; each raises ``HostFailure``), ``explain(exc, broker)``
(an operator's sentence for any other exception) and ``say(text)``.
"""

import time

from metaq.deploy.hostops import HostFailure, report_line

__all__ = ["rolling_restart", "RollingFailed", "live_role", "caught_up", "wait_caught_up", "POLL_S"]

#: Seconds between two status polls while waiting for a slave to catch up or a new master to be elected.
POLL_S = 0.2


class RollingFailed(Exception):
    """The preflight refused (``results`` are its refusals, nothing restarted) or a broker failed (the last of
    ``results``; ``remaining``: the brokers it did not get to)."""

    def __init__(self, results, remaining, preflight=False):
        super().__init__("rolling restart failed")
        self.results = results
        self.remaining = remaining
        self.preflight = preflight


def _stats(report):
    return (report.get("stats") or {}) if report.get("state") == "up" else {}


def live_role(report):
    """``master``, ``slave`` or ``none`` from a status report; None when the broker is not up."""
    return _stats(report).get("replication_role") if report.get("state") == "up" else None


def caught_up(report):
    stats = _stats(report)
    return (stats.get("replication_role") == "slave" and stats.get("replication_link") == "connected"
            and stats.get("replication_caught_up") == "true")


def _replicates(cluster, broker):
    return len(cluster.members(broker)) > 1 or broker.ha == "auto"


def rolling_restart(cluster, brokers, ops):
    """Restart ``brokers`` as the module says; [(broker, ok, report)]; RollingFailed when it stopped."""
    asked = {b.name: b for b in brokers}
    for b in brokers:
        if _replicates(cluster, b):
            asked.update((m.name, m) for m in cluster.members(b))
    reports = ops.statuses(list(asked.values()))
    problems = _preflight(cluster, brokers, reports)
    if problems:
        for broker, text in problems:
            ops.say(report_line(broker, False, text))
        raise RollingFailed([(b, False, t) for b, t in problems], [], preflight=True)
    plan = [step for members in _groups(cluster, brokers) for step in _steps(cluster, members, reports)]
    results = []
    for i, (broker, step) in enumerate(plan):
        try:
            results.append((broker, True, step(ops, broker)))
        except Exception as exc:  # the report line names it; nothing after it restarts
            results.append((broker, False, str(exc) if isinstance(exc, HostFailure) else ops.explain(exc, broker)))
        ops.say(report_line(*results[-1]))
        if not results[-1][1]:
            raise RollingFailed(results, [b for b, _ in plan[i + 1:]])
    return results


def _preflight(cluster, brokers, reports):
    """[(broker, why it must not start)]: every selected broker up, slaves linked, roles as expected."""
    problems = []
    for b in brokers:
        report = reports[b.name]
        state = report.get("state")
        if state == "not deployed":
            problems.append((b, "not deployed: run fab deploy first"))
        elif state == "unreachable":
            problems.append((b, report.get("message")))
        elif state != "up":
            problems.append((b, "%s (%s): start it first (fab start --only %s); a rolling restart keeps the others "
                                "up" % (state, report.get("message") or "-", b.name)))
        elif live_role(report) == "slave" and _stats(report).get("replication_link") != "connected":
            problems.append((b, "its replication link to %s is down: a restarted slave must catch up before the "
                                "next broker restarts; fix the link first (fab logs --only %s)"
                             % (_stats(report).get("replication_master", "its master"), b.name)))
    seen = set()
    for b in brokers:
        if not _replicates(cluster, b) or b.group in seen:
            continue
        seen.add(b.group)
        members = cluster.members(b)
        up = [m for m in members if live_role(reports[m.name]) is not None]
        masters = [m for m in up if live_role(reports[m.name]) == "master"]
        if b.ha == "auto":
            if len(masters) != 1 and up:
                problems.append((b, "%s of %s's group (ha: auto) report replication_role master: expected exactly "
                                    "one; wait for the election (fab status) and try again"
                                 % (" and ".join(m.name for m in masters) or "none", b.group)))
            continue
        for m in up:
            expected = "master" if m.role == "master" else "slave"
            if live_role(reports[m.name]) != expected:
                problems.append((m, "reports replication_role %s, but the inventory says %s: after a promotion by "
                                    "hand, write the new roles into the inventory (fab check) and deploy before a "
                                    "rolling restart" % (live_role(reports[m.name]), m.role_text)))
    return problems


def _groups(cluster, brokers):
    """The selected brokers by group, groups in the inventory order of their first selected member."""
    groups = {}
    for b in brokers:
        groups.setdefault(b.group if _replicates(cluster, b) else (b.name,), []).append(b)
    return list(groups.values())


def _steps(cluster, members, reports):
    """[(broker, step)] of one group: its slaves (by live role), then its master."""
    slaves = [b for b in members if live_role(reports[b.name]) != "master"]
    masters = [b for b in members if live_role(reports[b.name]) == "master"]
    steps = [(b, _restart_slave if live_role(reports[b.name]) == "slave" else _restart_plain) for b in slaves]
    for m in masters:
        if not _replicates(cluster, m):
            steps.append((m, _restart_plain))
            continue
        others = [o for o in cluster.members(m) if o is not m and live_role(reports[o.name]) is not None]
        if m.ha == "auto" and others:
            steps.append((m, lambda ops, b, others=others: _hand_over(ops, b, others)))
        else:  # after the restart, wait for the slaves that were linked (restarted ones were)
            linked = [o for o in others if _stats(reports[o.name]).get("replication_link") == "connected"]
            steps.append((m, lambda ops, b, linked=linked: _restart_master(ops, b, linked)))
    return steps


def _restart_plain(ops, broker):
    return "%s, then %s" % (ops.stop(broker), ops.start(broker))


def _restart_slave(ops, broker):
    text = _restart_plain(ops, broker)
    seconds = wait_caught_up(ops, [broker], broker.catch_up_timeout_s)
    return "%s; caught up with its master in %.1f s" % (text, seconds)


def _restart_master(ops, broker, slaves):
    """ha: manual (or no other member up): its broker id takes no writes until it is back."""
    ops.say("[%s] ha %s: while %s restarts, sends to broker id %d's partitions fail (no other broker takes its "
            "writes%s); producers retry them or use other brokers" % (
                broker.name, broker.ha, broker.name, broker.broker_id,
                "" if broker.ha == "manual" else ": no other member of its group is up"))
    began = time.monotonic()
    text = "%s, then %s; broker id %d took no writes for at most %.1f s" % (
        ops.stop(broker), ops.start(broker), broker.broker_id, time.monotonic() - began)
    if slaves:
        seconds = wait_caught_up(ops, slaves, broker.catch_up_timeout_s)
        text += "; %s caught up in %.1f s" % (", ".join(s.name for s in slaves), seconds)
    return text


def _hand_over(ops, broker, others):
    """ha: auto: stop the master cleanly, see another member elected, bring the old one back as a slave."""
    stopped = ops.stop(broker)
    began = time.monotonic()
    deadline = began + broker.handover_timeout_s
    successor = None
    while successor is None:
        successor = next((o for o in others if live_role(ops.status(o)) == "master"), None)
        if successor is None:
            if time.monotonic() >= deadline:
                started = ops.start(broker)
                raise HostFailure("%s; no other member of %s's group reported replication_role master within %g s "
                                  "(handover_timeout_s); %s again (fab status, fab logs)"
                                  % (stopped, broker.group, broker.handover_timeout_s, started))
            time.sleep(POLL_S)
    elected = time.monotonic() - began
    started = ops.start(broker)
    seconds = wait_caught_up(ops, [broker], broker.catch_up_timeout_s)
    return "%s; %s took over as master in %.1f s; %s, and caught up as its slave in %.1f s" % (
        stopped, successor.name, elected, started, seconds)


def wait_caught_up(ops, slaves, timeout):
    """Seconds until every one of ``slaves`` reports itself a linked, caught-up slave; HostFailure at ``timeout``."""
    began = time.monotonic()
    for slave in slaves:
        while True:
            report = ops.status(slave)
            if caught_up(report):
                break
            if time.monotonic() - began >= timeout:
                stats = _stats(report)
                raise HostFailure("%s is not a caught-up slave %g s (catch_up_timeout_s) after the restart: state %s, "
                                  "replication_role %s, replication_link %s, replication_lag_messages %s "
                                  "(fab status, fab logs --only %s)"
                                  % (slave.name, timeout, report.get("state"), stats.get("replication_role", "-"),
                                     stats.get("replication_link", "-"), stats.get("replication_lag_messages", "-"),
                                     slave.name))
            time.sleep(POLL_S)
    return time.monotonic() - began
