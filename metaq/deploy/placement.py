"""Brokers per host (``per_host:`` of the inventory): N brokers on each host, master/slave groups spread over hosts.

    per_host:
      hosts: [10.0.0.11, 10.0.0.12, 10.0.0.13]
      brokers: null        # brokers on each host; null: one per core of the host (fab asks it: nproc)
      slaves: 1            # slaves per master
      port_step: 10        # a host's broker k listens on port + k * port_step (each port of it: see below)
      first_broker_id: 0

One process is one core (a broker is one gevent process), so a host of C cores runs C brokers by default.
``place`` fills each host's slots with groups of a master and ``slaves`` slaves: a slave is never on its master's
host when there are two or more hosts (losing a host loses no group), the members of a group go to different
hosts while there are enough, and the masters are spread evenly (each group's master goes to a host with the
fewest masters so far). Slots a whole group cannot fill are left empty, and said so.

``expand`` turns the placement into broker entries: ``<host>-<k>`` named, ``port`` + ``k * port_step`` for the
text port (replication: that + 1, as for any group), and the same offset added to every port ``server:`` sets
(``remoting``, ``http``, ``mqtt``, ``grpc``), with ``install_dir``/``<name>`` and ``data_dir``/``<name>``.
Pure: the host's core count comes from the caller.
"""

from typing import NamedTuple

__all__ = ["Slot", "place", "expand", "SERVER_PORTS"]

#: The server.yaml sections whose ``port`` a host's broker k gets offset by ``k * port_step``.
SERVER_PORTS = ("remoting", "http", "mqtt", "grpc")


class Slot(NamedTuple):
    """One broker of the placement: ``host`` (its index in the host list), ``k`` (its number on that host),
    ``group`` (0..) and ``member`` (0: the master, 1..: its slaves)."""

    host: int
    k: int
    group: int
    member: int


def place(slots, slaves):
    """Place groups of ``1 + slaves`` brokers over hosts with ``slots[i]`` brokers each: ``([Slot], unused)``,
    slots in (group, member) order; ``unused`` counts the slots no whole group fits in."""
    hosts = len(slots)
    free = list(slots)
    masters = [0] * hosts
    used = [0] * hosts
    out = []
    group = 0
    while True:
        candidates = [h for h in range(hosts) if free[h] > 0]
        if not candidates:
            break
        master = min(candidates, key=lambda h: (masters[h], -free[h], (h - group) % hosts))
        members, taken = [master], {master: 1}
        for _ in range(slaves):
            others = [h for h in range(hosts) if free[h] - taken.get(h, 0) > 0 and (hosts < 2 or h != master)]
            if not others:
                members = None
                break
            h = min(others, key=lambda h: (taken.get(h, 0), -(free[h] - taken.get(h, 0)), (h - master - 1) % hosts))
            members.append(h)
            taken[h] = taken.get(h, 0) + 1
        if members is None:
            break
        masters[master] += 1
        for member, h in enumerate(members):
            out.append(Slot(h, used[h], group, member))
            used[h] += 1
            free[h] -= 1
        group += 1
    return out, sum(free)


def expand(per_host, defaults, slots):
    """Broker entries (dicts, as written under ``brokers:``) for ``per_host`` (its dict), given ``defaults`` (the
    inventory's resolved defaults: port, install_dir, data_dir, server) and ``slots[i]``, the brokers of host i;
    ``(entries, unused)``."""
    hosts = per_host["hosts"]
    placed, unused = place(slots, per_host["slaves"])
    step, first = per_host["port_step"], per_host["first_broker_id"]
    names = {}
    for s in placed:
        names[s.group, s.member] = "%s-%d" % (hosts[s.host], s.k)
    entries = []
    for s in placed:
        offset = s.k * step
        entry = {"name": names[s.group, s.member], "host": hosts[s.host], "port": defaults["port"] + offset,
                 "install_dir": "%s/%s" % (defaults["install_dir"], names[s.group, s.member]),
                 "data_dir": "%s/%s" % (defaults["data_dir"], names[s.group, s.member])}
        if s.member == 0:
            entry.update(broker_id=first + s.group, role="master")
        else:
            entry.update(role="slave", master=names[s.group, 0])
        server = {}
        for section in SERVER_PORTS:
            values = (defaults.get("server") or {}).get(section)
            if isinstance(values, dict) and isinstance(values.get("port"), int) and values["port"]:
                server[section] = {"port": values["port"] + offset}
        if server:
            entry["server"] = server
        entries.append(entry)
    return entries, unused
