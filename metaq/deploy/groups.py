"""Replication groups of the inventory: a master and its slaves, rendered as ``replication:`` settings.

A group replicates when it has a slave, when it is in ``ha: auto``, or when its master has a
``replication_port`` of its own; then every member gets a replication port (``port`` + 1 unless
set), so a slave can also be promoted. In ``ha: manual`` a slave gets ``role: slave``,
``slave_of: <master's address>:<master's replication port>`` and ``slave_id`` (1.. per master, in
inventory order, skipping the ids given); in ``ha: auto`` every member gets ``ha: auto`` and a
member id (``slave_id``: the master 0, the slaves 1..) and no role: the election decides.

Works on ``inventory.Broker`` values (never imports the inventory).
"""

import dataclasses

from metaq import limits

__all__ = ["resolve_groups", "replication_settings", "start_waves", "stop_waves"]


def resolve_groups(brokers, problems):
    """Each replication group's settings: ports, slave ids, ``slave_of``; (brokers, indexes of refused ones).

    A group is a master and its slaves. It replicates when it has a slave, when it is in ``ha: auto``, or when
    its master has a ``replication_port`` of its own; then every member gets a replication port (``port`` + 1
    unless set). Slave ids are 1.. in inventory order, skipping those given; in ``ha: auto`` the master is 0.
    """
    from metaq.server.config import is_loopback

    out, refused = {}, set()

    def refuse(b, text):
        problems.append("brokers[%d] (%s)%s" % (b.index, b.name, text))
        refused.add(b.index)

    for members in _groups_of(brokers).values():
        master, slaves = members[0], members[1:]
        _check_shared_modes(master, slaves, refuse)
        auto = master.ha == "auto"
        replicates = bool(slaves) or auto or master.replication_port is not None
        ids = _slave_ids(master, slaves, refuse)
        if ids is None:
            continue
        ids[master.index] = 0 if auto else None
        ports = {b.index: _replication_port(b, master, replicates, refuse) for b in members}
        master_host, master_port = _reachable(master), ports[master.index]
        for b in members:
            slave_of = None
            if b.role == "slave" and not auto:
                if master_port is None:
                    refused.add(b.index)  # its master's port is refused above: no slave_of to render
                else:
                    slave_of = "%s:%d" % ("[%s]" % master_host if ":" in master_host else master_host, master_port)
            out[b.index] = dataclasses.replace(b, replication_port=ports[b.index], slave_id=ids[b.index],
                                               slave_of=slave_of)
        if replicates:
            _check_secrets(members, master, master_host, refuse, is_loopback)
    return [out.get(b.index, b) for b in brokers], refused


def _groups_of(brokers):
    """``{group key: [master, slaves...]}`` in inventory order; a master named twice (refused as a clash) leads a
    group of its own."""
    groups = {}
    for b in brokers:
        if b.role == "master":
            groups[b.group if b.group not in groups else (b.index,)] = [b]
    for b in brokers:
        if b.role == "slave":
            groups[b.group].append(b)
    return groups


def _check_shared_modes(master, slaves, refuse):
    """Refuses each slave whose ``ha`` or ``replication_mode`` differs from its master's: a group shares both."""
    for b in slaves:
        if b.ha != master.ha:
            refuse(b, ".ha: %r, but its master %s has %r: a group shares one ha mode" % (b.ha, master.name, master.ha))
        if b.replication_mode != master.replication_mode:
            refuse(b, ".replication_mode: %r, but its master %s has %r: a group shares one replication_mode"
                   % (b.replication_mode, master.name, master.replication_mode))


def _slave_ids(master, slaves, refuse):
    """``{slave index: slave id}``: the ids given (refused when two slaves share one), then 1.. in inventory order
    for the rest; None (the master refused) when the ids run out."""
    given = {}
    for b in slaves:
        if b.slave_id is not None:
            if b.slave_id in given:
                refuse(b, ".slave_id: %d is also %s's: each slave of %s needs its own"
                       % (b.slave_id, given[b.slave_id].name, master.name))
            given.setdefault(b.slave_id, b)
    free = (n for n in range(1, limits.MAX_BROKER_ID + 1) if n not in given)
    ids = {b.index: b.slave_id if b.slave_id is not None else next(free, None) for b in slaves}
    if None in ids.values():
        refuse(master, ": more slaves than slave ids (1..%d)" % limits.MAX_BROKER_ID)
        return None
    return ids


def _replication_port(b, master, replicates, refuse):
    """A member's replication port (``port`` + 1 unless set, when its group replicates), or None; refuses one past
    65535 or equal to its port, and a member of an ``ha: auto`` group without ``zk_connect``."""
    port = b.replication_port if b.replication_port is not None else b.port + 1 if replicates else None
    if port is not None and port > 65535:
        refuse(b, ".replication_port: the default, port + 1, is %d: set replication_port" % port)
        port = None
    elif port is not None and port == b.port:
        refuse(b, ".replication_port: %d is also its port: each listener needs its own" % port)
    if master.ha == "auto" and not b.zk_connect:
        refuse(b, ".zk_connect: required with ha: auto (the group elects its master through ZooKeeper): "
                  "set zk_connect in defaults or on every member of %s's group" % master.name)
    return port


def _reachable(broker):
    """The address its slaves connect to: ``listen``, or the SSH host when the broker binds a wildcard."""
    return broker.host if broker.listen in ("0.0.0.0", "::", "[::]") else broker.listen


def _security(broker):
    section = broker.server.get("security")
    return section if isinstance(section, dict) else {}


def _check_secrets(members, master, master_host, refuse, is_loopback):
    """Protected mode, as the broker applies it, in the inventory's words: a group that replicates over a
    non-loopback address needs ``security.replication_secret`` (or ``_file``) on every member; and every member
    needs the same one (a secret written inline must be equal; files are on the hosts and not compared)."""
    def secret(b):
        sec = _security(b)
        if sec.get("replication_secret") is not None:
            return "inline", sec["replication_secret"]
        if sec.get("replication_secret_file") is not None:
            return "file", None
        return None

    mine = secret(master)
    for b in members:
        sec, has = _security(b), secret(b)
        exposed = [h for h in (b.listen, master_host if b is not master and b.ha == "manual" else None)
                   if h is not None and not is_loopback(h)]
        if has is None and exposed and sec.get("insecure") is not True:
            refuse(b, ": replication with %s's group goes over %s (not a loopback address) and %s has no "
                      "replication secret: the broker refuses that (protected mode). Set "
                      "server.security.replication_secret_file (a file on each host holding the same secret, "
                      "openssl rand -hex 32) in defaults or on every member, or server.security.insecure: true"
                   % (master.name, exposed[0], b.name))
        elif b is not master and (has is None) != (mine is None):
            refuse(b, ".server.security: %s has a replication secret and %s has none: every member of a group "
                      "needs the same one" % ((master.name, b.name) if has is None else (b.name, master.name)))
        elif b is not master and has and mine and has[0] == mine[0] == "inline" and has[1] != mine[1]:
            refuse(b, ".server.security.replication_secret: differs from its master %s's: a group shares one "
                      "secret" % master.name)


def replication_settings(broker):
    """The ``replication:`` settings the inventory owns for this broker ({} for a master alone in ha: manual)."""
    if broker.replication_port is None:
        return {}
    if broker.ha == "auto":  # no role, no slave_of: the election decides
        return {"ha": "auto", "port": broker.replication_port, "slave_id": broker.slave_id,
                "mode": broker.replication_mode}
    if broker.role == "slave":
        return {"role": "slave", "slave_of": broker.slave_of, "slave_id": broker.slave_id,
                "port": broker.replication_port, "mode": broker.replication_mode}
    return {"port": broker.replication_port, "mode": broker.replication_mode}


def start_waves(brokers):
    """``fab start``'s order: the masters (in parallel), then the slaves, so each slave finds its master
    listening (and in ``ha: auto`` the inventory's master is the first member up)."""
    return [w for w in ([b for b in brokers if b.role == "master"], [b for b in brokers if b.role != "master"]) if w]


def stop_waves(brokers, roles):
    """``fab stop``'s order: the slaves, then the masters, so no election or promotion starts and each master
    stops holding at least what its slaves hold. ``roles``: {name: the role it plays now (``master``, ``slave``,
    or None when not known)}; a broker not in it is ordered by its inventory role."""
    def is_master(b):
        role = roles.get(b.name)
        return role == "master" if role in ("master", "slave") else b.role == "master"
    return [w for w in ([b for b in brokers if not is_master(b)], [b for b in brokers if is_master(b)]) if w]
