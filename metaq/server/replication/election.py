"""Automatic failover (``replication.ha: auto``): the members of one broker id elect their master in ZooKeeper.

Nodes (ours; MetaQ's ``master`` node stays as the registry writes it), under ``<root>/brokers/ids/<id>/``:

    leader              ephemeral   {"member": m, "epoch": E, "replication": "host:port", "url": "meta://...",
                                     "remoting": "host:port" or null (its RocketMQ port)}
    insync              persistent  {"epoch": E, "master": m, "members": [m, ...]}   written with its version
    candidates/<m>      ephemeral   {"position": P}   a member's log end while an election runs

**Who may be elected.** In ``sync`` mode, a member listed in ``insync`` (the in-sync set: members holding
every acknowledged message, ``insync.py``); in ``async`` mode, any member (the most advanced wins; what it
lacks is the async lag). A group that never elected (no ``insync`` node) lets any member win.

**An election** starts when ``leader`` is absent (the master's session expired after a kill, or it stepped
down on a clean stop). Each eligible member posts its log end under ``candidates``, waits until every live
member (its ``slave<N>`` registration) has posted or ``election_settle_ms`` passed, and the most advanced
(ties: the lowest member id) creates ``leader``. The winner then writes ``insync`` with the version it read:
the epoch number is one more than both the node's and its own highest (numbers are unique per broker id), the
members just itself. A write that finds another version (a racing write) is re-read and re-checked. Then it
begins that epoch at its log end, switches to master and its registry writes MetaQ's master nodes.

**Fencing.** A master acknowledges a put only while its **lease** runs: ``lease_ms`` (default half the
ZooKeeper session timeout) from the *sending* time of the last request that found ``leader`` owned by its own
session. ZooKeeper expires a session no earlier than the session timeout after the last request it got, and no
other member can be elected before that, so an old master stops acknowledging before a new one can start:
never two brokers acknowledging for one broker id. A master that finds ``leader`` gone or owned by another
session, or whose ``insync`` write finds a newer version, steps down at once and follows the new master: its
epoch handshake cuts the divergent tail and logs it.

**A clean stop** of the master (``step_down``) stops acknowledging, waits (bounded) until an in-sync slave
holds its whole log, then closes the ZooKeeper session: ``leader`` goes at once and the election starts
without waiting for a session timeout.

kazoo calls block only the calling greenlet (its gevent handler); state changes only wake the loop.
"""

import json
import logging
import time

import gevent
from gevent.event import Event
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState

from metaq import limits
from metaq.server.replication.insync import InSyncSet

log = logging.getLogger(__name__)

TICK_S = 0.1  # the leader's in-sync checks
STEP_DOWN_WAIT_S = 5.0  # a clean stop waits this long at most for an in-sync slave to hold the whole log


class Lease:
    """Until when this master may acknowledge (monotonic clock), and why not once it may not."""

    def __init__(self, duration_s):
        self.duration_s = duration_s
        self.until = 0.0
        self.reason = "it has not been elected"

    def renew(self, sent_at):
        self.until = max(self.until, sent_at + self.duration_s)
        self.reason = None

    def revoke(self, reason):
        self.until = 0.0
        self.reason = reason

    def refusal(self):
        if self.reason is None and time.monotonic() < self.until:
            return None
        return self.reason or ("ZooKeeper has not confirmed its leadership for %.1f s (lease expired)"
                               % self.duration_s)


def _load(data):
    """A node's JSON object, or None (missing, too large, not an object)."""
    if data is None or len(data) > limits.MAX_ELECTION_NODE_BYTES:
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _dump(value):
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode("utf-8")


def members_of(insync):
    members = insync.get("members") if insync else None
    if not isinstance(members, list):
        return set()
    return {m for m in members[:limits.MAX_GROUP_MEMBERS] if isinstance(m, int) and not isinstance(m, bool)}


class Election:
    """One member's side of its broker id's election, and, while it leads, its lease and in-sync set."""

    def __init__(self, config, store, roles, zk, ids_path, url, remoting=lambda: None):
        """``roles``: ``Roles`` (``lead``, ``follow``, ``wait_for_master``); ``zk``: the registry's KazooClient
        (one session per broker); ``ids_path``: ``<root>/brokers/ids/<id>``; ``url()``: our meta:// URL;
        ``remoting()``: our RocketMQ remoting address (host:port) or None."""
        self.remoting = remoting
        rep = config.replication
        self.store = store
        self.roles = roles
        self.zk = zk
        self.url = url
        self.broker_id = config.broker.id
        self.member = rep.slave_id
        self.mode = rep.mode
        self.replication_port = rep.port
        self.advertised_address = rep.advertised_address  # what the leader node names, if set
        self.settle_s = rep.election_settle_ms / 1000.0
        self.lease = Lease(config.lease_ms() / 1000.0)
        self.insync = InSyncSet(self.member, rep.insync_lag_ms / 1000.0)
        self.leader_path = ids_path + "/leader"
        self.insync_path = ids_path + "/insync"
        self.candidates_path = ids_path + "/candidates"
        self.ids_path = ids_path
        self.leading = False
        self.insync_version = None  # the version of our last insync write while leading
        self.members = set()  # the insync node's members as we last wrote them
        self.elections = 0  # won (stats)
        self.last_leader = None  # the leader node last seen (stats)
        self._wake = Event()
        self._stopping = False
        self._tasks = []
        self._quiet = set()  # messages logged once per situation

    # -- life ----------------------------------------------------------------------------

    def start(self):
        self.zk.add_listener(self._on_state)
        self._tasks = [gevent.spawn(self._run), gevent.spawn(self._leader_loop)]
        self._wake.set()

    def stop(self):
        self._stopping = True
        self._wake.set()
        gevent.killall(self._tasks, block=True, timeout=2.0)

    def step_down(self):
        """A clean stop: stop acknowledging, let an in-sync slave catch up (bounded); the caller then closes the
        ZooKeeper session, which removes ``leader`` at once."""
        if not self.leading:
            return
        self.lease.revoke("it is stopping (leadership handed over)")
        server = self.roles.replication
        end = self.store.written_position
        deadline = time.monotonic() + STEP_DOWN_WAIT_S
        while server is not None and time.monotonic() < deadline:
            held = [m for m, p in server.positions().items() if p >= end and m in self.insync.waiting_for]
            if held or (self.mode == "async" and any(p >= end for p in server.positions().values())):
                log.warning("stepping down as master of broker %d: member %s holds our whole log (%d)",
                            self.broker_id, held or sorted(server.positions()), end)
                break
            server.notify()
            gevent.sleep(0.05)
        else:
            log.warning("stepping down as master of broker %d: no in-sync slave holds our whole log (%d)",
                        self.broker_id, end)
        self._stopping = True
        self.leading = False

    def _on_state(self, state):
        if state == KazooState.LOST and self.leading:
            self.lease.revoke("its ZooKeeper session expired")
        self._wake.set()

    # -- the loop ------------------------------------------------------------------------

    def _run(self):
        delay = 0.1
        while not self._stopping:
            self._wake.clear()
            try:
                if self.zk.connected:
                    self._pass()
                delay = 0.1
            except KazooException as exc:
                log.warning("election: ZooKeeper call failed (%r); retrying in %.1f s", exc, delay)
                gevent.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            self._wake.wait(1.0)

    def _watch(self, _event):
        self._wake.set()

    def _read(self, path, watch=None):
        try:
            data, stat = self.zk.get(path, watch=watch)
        except NoNodeError:
            if watch is not None:
                self.zk.exists(path, watch=watch)
            return None, None
        return _load(data), stat

    def _pass(self):
        leader, stat = self._read(self.leader_path, watch=self._watch)
        self.last_leader = leader
        if stat is not None and stat.ephemeralOwner == self.zk.client_id[0]:
            if not self.leading:  # ours from before a crash of this loop: give it up and elect again
                self.zk.delete(self.leader_path, version=stat.version)
            return
        if self.leading:
            self._depose("the leader node of broker %d is %s" % (self.broker_id, leader or "gone"))
        if stat is not None:
            self._withdraw()
            address = leader.get("replication") if leader else None
            if isinstance(address, str) and leader.get("member") != self.member:
                self.roles.follow(address, self.member)
            return
        self._candidacy()

    def _once(self, key, text, *args):
        if key not in self._quiet:
            self._quiet.add(key)
            log.warning(text, *args)

    # -- candidacy -----------------------------------------------------------------------

    def _eligible(self, insync):
        if insync is None or self.mode == "async":
            return True
        return self.member in members_of(insync)

    def _candidacy(self):
        if self.roles.is_master:  # a master without the leader node acknowledges nothing from here on
            self._depose("broker %d has no leader node" % self.broker_id)
        insync, stat = self._read(self.insync_path)
        if not self._eligible(insync):
            self._once("ineligible", "election: member %d of broker %d is not in the in-sync set %s (sync mode): "
                       "it may not be elected; waiting for a member that is", self.member, self.broker_id,
                       sorted(members_of(insync)))
            return
        self._post()
        deadline = time.monotonic() + self.settle_s
        while not self._stopping:
            if self.zk.exists(self.leader_path, watch=self._watch):
                return
            posted = self._posted(insync)
            expected = self._live_members(insync) | {self.member}
            if expected <= set(posted) or time.monotonic() >= deadline:
                break
            gevent.sleep(0.05)
        best = max(posted.items(), key=lambda kv: (kv[1], -kv[0]))[0] if posted else self.member
        if best == self.member:
            self._try_lead(insync, stat)
            return
        log.info("election: member %d (log end %d) defers to member %d (log end %d)", self.member,
                 posted.get(self.member, -1), best, posted[best])
        self._wake.wait(max(2.0, self.settle_s * 4))  # its leader node wakes us; else we look again

    def _post(self):
        path = "%s/%d" % (self.candidates_path, self.member)
        data = _dump({"position": self.store.written_position})
        try:
            self.zk.create(path, data, ephemeral=True, makepath=True)
        except NodeExistsError:
            self.zk.set(path, data)

    def _withdraw(self):
        try:
            self.zk.delete("%s/%d" % (self.candidates_path, self.member))
        except NoNodeError:
            pass

    def _posted(self, insync):
        out = {}
        try:
            names = self.zk.get_children(self.candidates_path)
        except NoNodeError:
            return out
        for name in names[:limits.MAX_GROUP_MEMBERS]:
            if not name.isdigit():
                continue
            value, _stat = self._read("%s/%s" % (self.candidates_path, name))
            position = value.get("position") if value else None
            if isinstance(position, int) and self._eligible_member(int(name), insync):
                out[int(name)] = position
        return out

    def _eligible_member(self, member, insync):
        return insync is None or self.mode == "async" or member in members_of(insync)

    def _live_members(self, insync):
        """Eligible members with a live registration (``slave<N>``): the candidates worth waiting for."""
        live = set()
        for name in self.zk.get_children(self.ids_path):
            if name.startswith("slave") and name[5:].isdigit() and self._eligible_member(int(name[5:]), insync):
                live.add(int(name[5:]))
        return live

    def _try_lead(self, insync, stat):
        sent = time.monotonic()
        address = self.advertised_address or "%s:%d" % (self.url()[len("meta://"):].rsplit(":", 1)[0],
                                                        self.replication_port)
        try:
            self.zk.create(self.leader_path, _dump(self._leader_record(None, address)), ephemeral=True,
                           makepath=True)
        except NodeExistsError:
            return
        for _attempt in range(3):
            epoch = max(int(insync.get("epoch", 0)) if insync else 0, self.store.epochs.max_epoch) + 1
            record = {"epoch": epoch, "master": self.member, "members": [self.member]}
            try:
                if stat is None:
                    _path, stat = self.zk.create(self.insync_path, _dump(record), makepath=True, include_data=True)
                else:
                    stat = self.zk.set(self.insync_path, _dump(record), version=stat.version)
                break
            except (NodeExistsError, BadVersionError):
                insync, stat = self._read(self.insync_path)
                if not self._eligible(insync):
                    self.zk.delete(self.leader_path)
                    return
        else:
            self.zk.delete(self.leader_path)
            return
        self.insync_version, self.members = stat.version, {self.member}
        self.insync.waiting_for = set()
        self.insync.acked = self.store.written_position
        self.lease.renew(sent)
        self.leading = True
        self.elections += 1
        self._quiet.clear()
        self._withdraw()
        position = self.roles.lead(epoch, self.insync)
        self.zk.set(self.leader_path, _dump(self._leader_record(epoch, address)))
        log.warning("election: member %d is now the master of broker %d, epoch %d from log position %d",
                    self.member, self.broker_id, epoch, position)

    def _leader_record(self, epoch, address):
        return {"member": self.member, "epoch": epoch, "replication": address, "url": self.url(),
                "remoting": self.remoting()}

    def current_leader(self):
        """The leader node as last read (a dict: member, epoch, url, replication, remoting), or None."""
        return self.last_leader

    def _depose(self, reason):
        was = self.leading
        self.leading = False
        self.lease.revoke("it is no longer the elected master: %s" % reason)
        if was or self.roles.is_master:
            log.warning("election: member %d steps down as master of broker %d: %s; it acknowledges nothing more "
                        "and follows the elected master", self.member, self.broker_id, reason)
            self.roles.wait_for_master()

    # -- while leading: the lease and the in-sync set ------------------------------------

    def _leader_loop(self):
        renew_every = self.lease.duration_s / 4.0
        last_renew = 0.0
        while not self._stopping:
            gevent.sleep(TICK_S)
            if not self.leading:
                continue
            try:
                if time.monotonic() - last_renew >= renew_every:
                    last_renew = time.monotonic()
                    self._renew(last_renew)
                self._insync_tick()
            except KazooException as exc:
                log.info("election: ZooKeeper call failed while leading (%r); the lease runs out unless renewed",
                         exc)

    def _renew(self, sent):
        stat = self.zk.exists(self.leader_path)
        if not self.leading:
            return
        if stat is not None and stat.ephemeralOwner == self.zk.client_id[0]:
            self.lease.renew(sent)
        else:
            self._depose("its leader node is %s" % ("gone" if stat is None else "another session's"))
            self._wake.set()

    def _insync_tick(self):
        server = self.roles.replication
        if server is None:
            return
        insync = self.insync
        insync.sample(self.store.written_position)
        positions = server.positions()
        for member in insync.lagging(positions):
            if self._write_members(self.members - {member}, "member %d left the in-sync set (%s)" % (
                    member, "disconnected" if member not in positions else "behind for %.1f s" % insync.lag_s)):
                insync.leave(member)
                server.changed()
        for member, written in sorted(positions.items()):
            if insync.may_join(member, written):
                insync.join(member)  # puts wait for it from now on; electable once the write below lands
                server.changed()
                self._write_members(self.members | {member}, "member %d joined the in-sync set" % member)

    def _write_members(self, members, why):
        if members == self.members:
            return True
        record = {"epoch": self.store.epochs.epoch, "master": self.member, "members": sorted(members)}
        try:
            stat = self.zk.set(self.insync_path, _dump(record), version=self.insync_version)
        except (BadVersionError, NoNodeError):
            self._depose("the insync node was written by another master")
            self._wake.set()
            return False
        self.insync_version, self.members = stat.version, set(members)
        log.info("election: %s: in-sync set of broker %d is now %s", why, self.broker_id, sorted(members))
        return True

    def stats_values(self):
        return [("replication_ha", "auto"), ("replication_member", self.member),
                ("replication_leading", self.leading),
                ("replication_lease_left_ms", max(0, int((self.lease.until - time.monotonic()) * 1000))
                 if self.leading and self.lease.reason is None else 0),
                ("replication_insync", ",".join(str(m) for m in sorted(self.members)) if self.leading else ""),
                ("replication_elections_won", self.elections)]
