"""Automatic failover (``replication.ha: auto``): the members of one broker id elect their master in ZooKeeper.

Nodes (ours; MetaQ's ``master`` node stays as the registry writes it), under ``<root>/brokers/ids/<id>/``:

    leader              ephemeral   {"member": m, "epoch": E, "replication": "host:port", "url": "meta://...",
                                     "remoting": "host:port" or null (its RocketMQ port),
                                     "mqtt": "host:port" or null (its MQTT port)}
    insync              persistent  {"epoch": E, "master": m, "members": [m, ...]}   written with its version
    candidates/<m>      ephemeral   {"epoch": E, "max_epoch": X, "position": P}   latest epoch, highest seen, log end
    epochs              persistent  the group's epoch record (``epochrecord.py``): the winner adds its epoch

**Who may be elected.** In ``sync`` mode, a member listed in ``insync`` (the in-sync set: members holding
every acknowledged message, ``insync.py``) that has ever followed or led an elected master (a member restarted
on an empty data dir has not, whatever the node says); in ``async`` mode, any member. A group with no ``insync`` node
(never elected, or ZooKeeper lost its data) lets any member win. In either mode a member that did not take part in
the group's latest recorded epoch (``ids/<id>/epochs``, ``epochrecord.py``: it was down while another member led
it) may not be elected, unless in ``sync`` mode it is in that epoch's in-sync set (``in_sync_at``): it waits for
one that did and follows it (``metaq-admin epochs ID --forget --yes`` clears the record when none will return).
Among the eligible, the most advanced wins: the latest epoch first, then the log end (as Raft compares the last
term, then the index).

**An election** starts when ``leader`` is absent (the master's session expired after a kill, or it stepped
down on a clean stop). Each eligible member posts its log end under ``candidates``, waits until every live
member (its ``slave<N>`` registration) has posted or ``election_settle_ms`` passed, and the most advanced
(ties: the lowest member id) creates ``leader``. The winner then writes ``insync`` with the version it read:
the epoch number is one more than both the node's and its own highest (numbers are unique per broker id), the
members itself and, in sync mode, the eligible members that posted (they hold every acknowledged message:
puts wait for them from the start, and they leave the set like any member that lags). A write that finds
another version (a racing write) is re-read and re-checked. Then it begins that epoch at its log end, switches
to master and its registry writes MetaQ's master nodes. Anything failing on the way gives the leadership up.

**Fencing.** A master acknowledges a put only while its **lease** runs (``leadership.Lease``: ``lease_ms``,
at most half the session timeout ZooKeeper granted, from the *sending* time of the last synced request that
found ``leader`` owned by its own session). ZooKeeper expires a session no earlier than that timeout after the
last request it got, and no other member can be elected before that, so an old master stops acknowledging
before a new one can start: never two brokers acknowledging for one broker id. A master that finds ``leader``
gone or owned by another
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

from metaq.server.replication import limits as replication_limits
from metaq.server.replication import leadership
from metaq.server.replication.epochrecord import EpochRecord, NotRecorded, key as record_key, who
from metaq.server.replication.leadership import TICK_S, Lease, Term, dump as _dump
from metaq.store.epochs import took_part

log = logging.getLogger(__name__)


def _load(data):
    """A node's JSON object, or None (missing, too large, not an object)."""
    if data is None or len(data) > replication_limits.MAX_ELECTION_NODE_BYTES:
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def members_of(insync):
    members = insync.get("members") if insync else None
    if not isinstance(members, list):
        return set()
    return {m for m in members[:replication_limits.MAX_GROUP_MEMBERS] if isinstance(m, int) and not isinstance(m, bool)}


#: Seconds an elected member whose epoch could not be recorded waits before its next candidacy: doubling from the
#: first, at most the last (each candidacy that wins begins and fsyncs a local epoch).
RECORD_RETRY_S = (2.0, 60.0)


def in_sync_at(mode, member, insync, latest):
    """In ``sync`` mode, whether ``member`` is in the in-sync set (``insync``, the node's value) of the recorded
    ``latest`` epoch (a record entry) or a later one: puts of that epoch waited for it, so it holds every one
    acknowledged and may be elected though its history lacks the epoch's entry (elected, that master died before
    this member's handshake)."""
    if mode != "sync" or insync is None or latest is None:
        return False
    epoch = _json_int(insync.get("epoch"))
    return epoch is not None and epoch >= latest["epoch"] and member in members_of(insync)


def _json_int(value):
    """A JSON value read from ZooKeeper when it is an integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class Election:
    """One member's side of its broker id's election, and, while it leads, its lease and in-sync set."""

    def __init__(self, config, store, roles, zk, ids_path, url, remoting=lambda: None, granted_timeout=lambda: None,
                 mqtt=lambda: None):
        """``roles``: ``Roles`` (``lead``, ``follow``, ``wait_for_master``); ``zk``: the registry's KazooClient
        (one session per broker); ``ids_path``: ``<root>/brokers/ids/<id>``; ``url()``: our meta:// URL;
        ``remoting()``: our RocketMQ remoting address (host:port) or None; ``granted_timeout()``: the session
        timeout ZooKeeper granted, in seconds, or None before the first session; ``mqtt()``: our MQTT address
        (host:port) or None."""
        rep = config.replication
        self.store = store
        self.roles = roles
        self.zk = zk
        self.url = url
        self.remoting = remoting
        self.mqtt = mqtt
        self.granted_timeout = granted_timeout
        self.broker_id = config.broker.id
        self.member = rep.slave_id
        self.mode = rep.mode
        self.replication_port = rep.port
        self.advertised_address = rep.advertised_address  # what the leader node names, if set
        self.settle_s = rep.election_settle_ms / 1000.0
        self.lag_s = rep.insync_lag_ms / 1000.0
        self.lease_s = config.lease_ms() / 1000.0
        self.lease = Lease(self.lease_s)
        self.isolation_s = config.max_isolation_ms() / 1000.0
        self.leader_path = ids_path + "/leader"
        self.insync_path = ids_path + "/insync"
        self.candidates_path = ids_path + "/candidates"
        self.ids_path = ids_path
        self.record = EpochRecord(zk, ids_path)  # the group's epochs beyond the sessions (epochrecord.py)
        self.leading = False
        self.term = None  # leadership.Term while leading
        self.elections = 0  # won (stats)
        self.last_leader = None  # the leader node last seen (routes, stats)
        self._wake = Event()
        self._stopping = False
        self._tasks = []
        self._quiet = set()  # messages logged once per situation
        self._record_retry = (0.0, 0.0)  # (no candidacy before this monotonic time, the last wait) after NotRecorded

    # -- life ----------------------------------------------------------------------------

    def start(self):
        self.zk.add_listener(self._on_state)
        self._tasks = [gevent.spawn(self._loop, self._pass_once, "election"),
                       gevent.spawn(self._loop, self._leader_tick, "leadership")]
        self._wake.set()

    def stop(self):
        self._stopping = True
        self._wake.set()
        gevent.killall(self._tasks, block=True, timeout=2.0)

    def step_down(self):
        """A clean stop: stop acknowledging, let a slave that may be elected catch up (bounded); the caller then
        closes the ZooKeeper session, which removes ``leader`` at once."""
        if not self.leading:
            return
        self.leading = False  # before the revocation: no renewal in flight can bring the lease back
        self.lease.revoke("it is stopping (leadership handed over)")
        self._stopping = True
        leadership.step_down(self.term, self.roles.replication, self.store.written_position, self.mode,
                             self.broker_id)

    def _on_state(self, state):
        if state == KazooState.LOST and self.leading:
            self.lease.revoke("its ZooKeeper session expired")
        self._wake.set()

    def _session(self):
        client_id = self.zk.client_id  # None while not connected
        return client_id[0] if client_id else None

    # -- the loops -----------------------------------------------------------------------

    def _loop(self, step, name):
        """Run ``step`` until stopped; a failure is logged and retried with a backoff, never ends the loop."""
        delay = 0.1
        while not self._stopping:
            try:
                step()
                delay = 0.1
            except KazooException as exc:
                log.warning("%s: ZooKeeper call failed (%r); retrying in %.1f s", name, exc, delay)
            except Exception:  # noqa: BLE001 - the election must outlive any surprise; the lease protects
                log.exception("%s: unexpected failure; retrying in %.1f s", name, delay)
            else:
                continue
            gevent.sleep(delay)
            delay = min(delay * 2, 2.0)

    def _pass_once(self):
        self._wake.clear()
        if self.zk.connected:
            self._pass()
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
        if stat is not None and stat.ephemeralOwner == self._session():
            if not self.leading:  # ours from before a failure of this loop: give it up and elect again
                self._delete_ours(self.leader_path)
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

    def _delete_ours(self, path):
        """Delete ``path`` only while it is an ephemeral node of our session (never another member's)."""
        stat = self.zk.exists(path)
        if stat is not None and stat.ephemeralOwner == self._session():
            try:
                self.zk.delete(path, version=stat.version)
            except (NoNodeError, BadVersionError):
                pass

    # -- candidacy -----------------------------------------------------------------------

    def _eligible(self, member, insync, epochs_seen=None):
        """Whether ``member`` may be elected (``epochs_seen``: the highest epoch it has seen, when known)."""
        if insync is None or self.mode == "async":
            return True
        return member in members_of(insync) and (epochs_seen is None or epochs_seen >= 1)

    def _candidacy(self):
        if self.roles.is_master:  # a master without the leader node acknowledges nothing from here on
            self._depose("broker %d has no leader node" % self.broker_id)
        insync, stat = self._read(self.insync_path)
        self.roles.wait_for_master()  # no leader: stop following the one that was (its node is gone)
        if not self._eligible(self.member, insync, self.store.epochs.max_epoch):
            self._once("ineligible", "election: member %d of broker %d may not be elected in sync mode: the in-sync "
                       "set is %s at epoch %s and this member %s; waiting for a member that may",
                       self.member, self.broker_id, sorted(members_of(insync)), insync.get("epoch"),
                       "is not in it" if self.member not in members_of(insync) else
                       "has an empty data dir that never followed an elected master")
            return
        latest = self.record.latest()
        epochs = self.store.epochs
        in_sync = in_sync_at(self.mode, self.member, insync, latest)
        if not took_part(epochs.entries, epochs.led, record_key(latest)) and not in_sync:
            self._once("behind", "election: member %d of broker %d may not be elected: the group's latest epoch %d "
                       "(from log position %d, begun by %s) is one it did not take part in (its own latest: %d); "
                       "waiting for a member that did, to follow it. If none will ever return, `metaq-admin --zk "
                       "ZK epochs %d --forget --yes` deletes the record %s (what only that epoch's members held is "
                       "lost)", self.member, self.broker_id, latest["epoch"], latest["start"], who(latest),
                       epochs.epoch, self.broker_id, self.record.path)
            return
        if time.monotonic() < self._record_retry[0]:
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
            self._try_lead(insync, stat, set(posted) - {self.member}, latest)
            return
        log.info("election: member %d (epoch, log end %s) defers to member %d (%s)", self.member,
                 posted.get(self.member), best, posted[best])
        self._wake.wait(max(2.0, self.settle_s * 4))  # its leader node wakes us; else we look again

    def _post(self):
        path = "%s/%d" % (self.candidates_path, self.member)
        epochs = self.store.epochs
        data = _dump({"epoch": epochs.epoch, "max_epoch": epochs.max_epoch, "position": self.store.written_position})
        for _attempt in range(3):
            try:
                self.zk.create(path, data, ephemeral=True, makepath=True)
                return
            except NodeExistsError:
                stat = self.zk.exists(path)
                if stat is None:
                    continue
                if stat.ephemeralOwner == self._session():
                    self.zk.set(path, data, version=stat.version)
                    return
                try:  # left by our previous incarnation, whose session has not expired yet
                    self.zk.delete(path, version=stat.version)
                except (NoNodeError, BadVersionError):
                    pass

    def _withdraw(self):
        self._delete_ours("%s/%d" % (self.candidates_path, self.member))

    def _posted(self, insync):
        """Eligible candidates: member -> (latest epoch, log end)."""
        out = {}
        try:
            names = self.zk.get_children(self.candidates_path)
        except NoNodeError:
            return out
        for name in names[:replication_limits.MAX_GROUP_MEMBERS]:
            if not name.isdigit():
                continue
            value, _stat = self._read("%s/%s" % (self.candidates_path, name))
            epoch, seen, position = ((_json_int(value.get("epoch")), _json_int(value.get("max_epoch")),
                                      _json_int(value.get("position"))) if value else (None, None, None))
            if None not in (epoch, seen, position) and self._eligible(int(name), insync, seen):
                out[int(name)] = (epoch, position)
        return out

    def _live_members(self, insync):
        """Eligible members with a live registration (``slave<N>``): the candidates worth waiting for."""
        live = set()
        for name in self.zk.get_children(self.ids_path):
            if name.startswith("slave") and name[5:].isdigit() and self._eligible(int(name[5:]), insync):
                live.add(int(name[5:]))
        return live

    def _try_lead(self, insync, stat, others, checked):
        sent = time.monotonic()
        generation = self.lease.generation
        address = self.advertised_address or "%s:%d" % (self.url()[len("meta://"):].rsplit(":", 1)[0],
                                                        self.replication_port)
        epoch = max(_json_int(insync.get("epoch")) or 0 if insync else 0,
                    self.record.next_epoch(self.store.epochs.max_epoch) - 1) + 1
        try:
            self.zk.create(self.leader_path, _dump(self._leader_record(epoch, address)), ephemeral=True,
                           makepath=True)
        except NodeExistsError:
            return
        carried = others if self.mode == "sync" and insync is not None else set()
        try:
            written = self._claim_epoch(insync, stat, epoch, carried)
            if written is None:
                self._delete_ours(self.leader_path)
                return
            epoch, stat, carried = written
            self.term = Term(self.zk, self.insync_path, self.member, self.broker_id, epoch, self.lag_s,
                             stat.version, {self.member} | carried, carried)
            self.term.insync.acked = self.store.written_position
            self.leading = True
            self.lease.renew(sent, generation)
            position = self.roles.lead(epoch, self.term.insync, checked)
        except BaseException as exc:
            self.leading = False
            self.lease.revoke("its election did not complete")
            self.roles.wait_for_master()
            self._delete_ours(self.leader_path)
            if not isinstance(exc, NotRecorded):
                raise
            self._withdraw()
            wait = min(max(self._record_retry[1] * 2, RECORD_RETRY_S[0]), RECORD_RETRY_S[1])
            self._record_retry = (time.monotonic() + wait, wait)
            self._once("unrecorded", "election: member %d of broker %d was elected but its epoch %d could not be "
                       "added to the epoch record %s (%s): it gave the leadership up and stands again after a "
                       "backoff (up to %.0f s; logged once until an election succeeds)", self.member, self.broker_id,
                       epoch, self.record.path, exc, RECORD_RETRY_S[1])
            return
        self.elections += 1
        self._quiet.clear()
        self._record_retry = (0.0, 0.0)
        self._withdraw()
        log.warning("election: member %d is now the master of broker %d, epoch %d from log position %d (in-sync "
                    "set %s)", self.member, self.broker_id, epoch, position, sorted({self.member} | carried))

    def _claim_epoch(self, insync, stat, epoch, carried):
        """Write the insync node for our term (versioned); ``(epoch, stat, carried)`` or None when we may not."""
        for _attempt in range(3):
            record = {"epoch": epoch, "master": self.member, "members": sorted({self.member} | carried)}
            try:
                if stat is None:
                    _path, stat = self.zk.create(self.insync_path, _dump(record), makepath=True, include_data=True)
                else:
                    stat = self.zk.set(self.insync_path, _dump(record), version=stat.version)
                return epoch, stat, carried
            except (NodeExistsError, BadVersionError):
                insync, stat = self._read(self.insync_path)
                if not self._eligible(self.member, insync, self.store.epochs.max_epoch):
                    return None
                epoch = max(epoch, (_json_int(insync.get("epoch")) or 0 if insync else 0) + 1)
                carried = carried & members_of(insync)
        return None

    def _leader_record(self, epoch, address):
        return {"member": self.member, "epoch": epoch, "replication": address, "url": self.url(),
                "remoting": self.remoting(), "mqtt": self.mqtt()}

    def current_leader(self):
        """The leader node as last read (a dict: member, epoch, url, replication, remoting), or None."""
        return self.last_leader

    def master_mqtt(self):
        """The elected master's MQTT address (host:port) as this member last knew it, when another member leads;
        None otherwise: what a slave names to a device it refuses (MQTT 5 Server Reference)."""
        if self.leading or not self.last_leader or self.last_leader.get("member") == self.member:
            return None
        address = self.last_leader.get("mqtt")
        return address if isinstance(address, str) and address else None

    def master_remoting(self):
        """The elected master's RocketMQ address (host:port) as this member last knew it, or None (no leader, or
        one without a remoting port): what every member's RocketMQ routes name as broker 0 (remoting/dispatch.py).
        While ZooKeeper is out of reach it stays the last one seen, as RocketMQ's name servers keep serving the
        routes brokers last registered: reads go on there, and its lease refuses writes once it is not sure."""
        if self.leading:
            return self.remoting()
        address = self.last_leader.get("remoting") if self.last_leader else None
        return address if isinstance(address, str) and address else None

    def _depose(self, reason):
        was = self.leading
        self.leading = False
        self.lease.revoke("it is no longer the elected master: %s" % reason)
        self._wake.set()
        if was or self.roles.is_master:
            log.warning("election: member %d steps down as master of broker %d: %s; it acknowledges nothing more "
                        "and follows the elected master", self.member, self.broker_id, reason)
            self.roles.wait_for_master()

    # -- while leading: the lease and the in-sync set ------------------------------------

    def _leader_tick(self):
        gevent.sleep(TICK_S)
        if not self.leading:
            return
        granted = self.granted_timeout()
        self.lease.duration_s = min(self.lease_s, granted / 2.0) if granted else self.lease_s
        if time.monotonic() - self._last_renew >= self.renew_every_s():
            self._last_renew = time.monotonic()
            self._renew(self._last_renew, self.lease.generation)
        server = self.roles.replication
        if self.leading and server is not None:
            self.term.tick(self.store.written_position, server.positions(), server.changed, self._depose)

    _last_renew = 0.0

    def renew_every_s(self):
        """A quarter of the lease, and of ``max_isolation_ms`` when set: ZooKeeper's word on our leadership is
        never older than that while it answers (``isolation.py`` counts it as contact)."""
        every = self.lease.duration_s / 4.0
        return min(every, self.isolation_s / 4.0) if self.isolation_s else every

    def _renew(self, sent, generation):
        """Confirm our leadership: ``sync`` (the server catches up with the ensemble), then the leader node."""
        self.zk.sync(self.leader_path)
        stat = self.zk.exists(self.leader_path)
        if not self.leading:
            return
        if stat is not None and stat.ephemeralOwner == self._session():
            self.lease.renew(sent, generation)
        else:
            self._depose("its leader node is %s" % ("gone" if stat is None else "another session's"))

    def stats_values(self):
        term = self.term if self.leading else None
        return [("replication_ha", "auto"), ("replication_member", self.member),
                ("replication_leading", self.leading),
                ("replication_lease_left_ms", max(0, int((self.lease.until - time.monotonic()) * 1000))
                 if self.leading and self.lease.reason is None else 0),
                ("replication_insync", ",".join(str(m) for m in sorted(term.members)) if term else ""),
                ("replication_elections_won", self.elections)]
