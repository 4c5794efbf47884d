"""A broker's replication role over its life: the role it starts in, promotion, rejoining a newer master.

**Starting.** The configured role (``replication.role`` / ``--slave-of``),
except that a data dir holding a ``promoted`` marker (written by a promotion)
starts as master whatever the configuration says (logged as a warning; delete
the file while the broker is stopped to make it follow its configuration
again). With ZooKeeper, a broker about to start as master first reads the group's
epoch record (``epochrecord.py``): when its latest epoch is another member's, we
were superseded (a slave was promoted while we were down) and start as that
member's slave (``Roles.follow_record``); with a replication port, it takes no write until its epoch is
in the record (``Roles.unrecorded``): while it is master, the ``Keeper`` records
its epoch (ZooKeeper out of reach at the start) and yields the same way to a
later one (``Roles.yield_to``).
A group without a record falls back on ``ids/<id>/master``: when another live
broker holds it and publishes, in ``ids/<id>/replication``, an epoch higher than
ours, we start as that master's slave (``Roles.rejoin_if_superseded``). A master
begins a new epoch, numbered above the record's latest, at its log
end (``Roles.begin_master_epoch``; on the first start of a fresh data dir,
epoch 1 from position 0), with a fresh random origin (``metaq.store.epochs``).

A slave whose latest epoch is one it led itself (an old master rejoining)
serves no read until its first epoch handshake has cut any tail its new master
never had (``Roles.read_refusal``).

**Promotion** (``Roles.promote``; the text line ``promote <force 0|1> <opaque>``,
``metaq-admin promote``): refused unless this broker is a slave, its link to the
master is down (the master is gone), and it holds everything the master had
when last heard of (``SlaveLink.caught_up``); ``force`` skips the last two
checks and the reply says how far behind it may be. With ZooKeeper it is refused
while ZooKeeper is out of reach. Then: stop the link, begin a new epoch at our log
end, add it to the group's record (a failure refuses the promotion and resumes the
link), persist the ``promoted`` marker, switch to master
(accept puts and transactions, serve slaves on ``replication.port`` if set),
register in ZooKeeper as master.

**Automatic** (``replication.ha: auto``, ``election.py``): every member starts as a slave with no master
(``waiting``: puts refused, reads served unless it led its latest epoch) and the election decides:
``lead`` (elected: a new epoch whose number ZooKeeper assigned, then master), ``follow`` (another member
leads: its slave), ``wait_for_master`` (deposed or no leader: acknowledge nothing). The election's lease is
part of ``slave_refusal``: an elected master whose lease ran out refuses puts like a slave.
"""

import logging
import time

import gevent
from kazoo.exceptions import KazooException

from metaq import errors
from metaq.clock import now_ms
from metaq.server.replication import isolation
from metaq.server.replication.epochrecord import ANY, EpochRecord, Keeper, NotRecorded, entry as record_entry, \
    key as record_key, who
from metaq.serving.replication.link import CAUGHT_UP_SILENCE_S
from metaq.server.replication.master import ReplicationServer
from metaq.server.replication.slave import SlaveLink
from metaq.store.epochs import leads_record, origin_text

log = logging.getLogger(__name__)

PROMOTED_MAGIC = b"MQPM"


def read_promoted(store):
    """The ``promoted`` marker of this data dir (a dict), or None."""
    return store.dirs.read_state(store.dirs.promoted, PROMOTED_MAGIC)


def startup_role(config, store):
    """``"master"`` or ``"slave"``: the configured role, unless a promotion marker overrides it (ha: auto: a
    slave until elected)."""
    if config.replication.ha == "auto":
        return "slave"
    role = config.replication.role
    promoted = read_promoted(store)
    if promoted is not None and role == "slave":
        log.warning("this broker was promoted to master (epoch %s, %s) and stays master: replication.slave_of=%s "
                    "in the configuration is ignored. To make it a slave again, stop it and delete %s",
                    promoted.get("epoch"), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(
                        promoted.get("promoted_ms", 0) / 1000.0)), config.replication.slave_of, store.dirs.promoted)
        return "master"
    return role


class Roles:
    """This broker's role as it changes, and everything that changes it.

    Readers: the put path (``slave_refusal``, ``sync_replication``, ``replication``), the dispatchers
    (``read_refusal``), stats. Changers: start, promotion, a rejoin; ``on_change(fn)`` tells the
    ZooKeeper registry and the delay scheduler (``fn(slave_id or None)``).
    """

    def __init__(self, config, store, core, flusher, waiters, store_lock):
        self.config = config
        self.store = store
        self.core = core
        self.flusher = flusher
        self.waiters = waiters
        self.store_lock = store_lock
        self.registry = None  # set by attach_registry (ZooKeeper is optional)
        self.record = None  # the group's EpochRecord in ZooKeeper (with the registry)
        self.keeper = None  # ha: manual: the epochrecord.Keeper (with the registry)
        self.behind = None  # ha: manual: why this member takes no writes and follows nobody (a record's master
        self._follow_id = None  # without a replication address); the slave id it registers as meanwhile
        self.unrecorded = None  # ha: manual with ZooKeeper: why this master takes no writes (epoch not recorded)
        self.yielded = False  # ha: manual: this member follows the record's latest master (yield_to)
        self.secret = config.security.read_replication_secret()  # read once: a promotion reads no file
        #: serves a peer broker following this master for MQTT (``metaq.mqttcluster.serve``), None: none
        self.peer_handler = None
        self.role = startup_role(config, store)  # "master" | "slave"
        self.auto = config.replication.ha == "auto"
        self.election = None  # set by attach_election (ha: auto)
        #: the put path's one decision whether a put is refused before it is written (``PutPath.writable_refusal``:
        #: these roles' refusals, a full disk, a failed flush), set by the broker: what ``writable`` answers from
        self.put_refusal = None
        self.promoting = False
        self.started = False
        self._listeners = []
        self._cut_listeners = []
        self._disk_full_listeners = []
        self.slave_link = self.make_slave_link() if self.role == "slave" and not self.auto else None
        self._serve(self.make_replication_server() if self.role == "master" else None)
        self.read_refusal = self.handshake_refusal()  # why gets are refused (before a rejoin's handshake)

    def attach_registry(self, registry):
        self.registry = registry
        self.record = EpochRecord(registry.zk, registry.ids_path)
        if not self.auto:
            self.keeper = Keeper(self.record, self.store.epochs, self._recorded_entry, self.yield_to,
                                 recorded=self._epoch_recorded, followed=self._followed,
                                 address_of=self._serving_address, refollow=self._refollow)
            registry.zk.add_listener(lambda _state: self.keeper.wake())  # a kazoo callback: wake, nothing else

    def attach_election(self, election):
        self.election = election

    def on_change(self, fn):
        self._listeners.append(fn)

    def on_disk_full(self, fn):
        """``fn()`` when a slave link's copy met a full disk (``SlaveLink.disk_full`` says why)."""
        self._disk_full_listeners.append(fn)

    def on_cut(self, fn):
        """``fn(report)`` after a slave's handshake cut the log's tail (``store.replica.TruncateReport``)."""
        self._cut_listeners.append(fn)

    # -- what the put path and the dispatchers read --------------------------------

    @property
    def is_master(self):
        return self.role == "master"

    @property
    def slave_refusal(self):
        """Why puts are refused: a slave, a member waiting for an election, an elected master whose lease ran
        out; None on a master that may acknowledge."""
        link = self.slave_link
        if link is not None:
            return "this broker is a replication slave of %s (read-only): send puts to the master" % link.master
        if self.role == "slave" and self.behind is not None:
            return self.behind
        if self.role == "master" and self.unrecorded is not None:
            return self.unrecorded
        if self.role == "slave":
            return ("broker %d has no elected master yet (replication.ha: auto): an election is under way; retry "
                    "shortly" % self.config.broker.id)
        if self.election is not None:
            refusal = self.election.lease.refusal()
            if refusal is not None:
                return "this broker may not acknowledge writes for broker %d: %s" % (self.config.broker.id, refusal)
        return None

    @property
    def master_url(self):
        """The ``meta://`` URL of the master this broker knows of when it is not that master itself, or None: with
        ``ha: auto`` the elected master's leader node as last read; a manual slave knows only its master's
        replication address (its refusal names that)."""
        leader = self.election.current_leader() if self.election is not None else None
        if not leader or self.election.leading or leader.get("member") == self.election.member:
            return None
        url = leader.get("url")
        return url if isinstance(url, str) and url.startswith("meta://") else None

    def not_master(self):
        """``errors.NotMaster`` (503, naming the master when known) while ``slave_refusal`` refuses puts, else None:
        what an offset commit gets on a broker that is not the master. The same one decision as a put's, so a
        deposed master refuses commits from the moment it refuses puts (its lease, not its next election pass)."""
        refusal = self.slave_refusal
        if refusal is None:
            return None
        return errors.not_master(refusal, self.master_url)

    @property
    def unconfirmable_refusal(self):
        """Why a ``sync`` master refuses a put before writing it (no slave could confirm it), or None
        (``ReplicationServer.no_slave_refusal``)."""
        server = self.replication
        return server.no_slave_refusal() if server is not None else None

    def acknowledge_refusal(self):
        """Why this broker may acknowledge no write now, or None: a slave or a master whose lease ran out
        (``slave_refusal``), an isolated ``async`` master (``isolation_refusal``), a ``sync`` master no slave could
        confirm a put for (``unconfirmable_refusal``). What the MQTT port reads to keep sessions and wills."""
        return self.slave_refusal or self.isolation_refusal() or self.unconfirmable_refusal

    def writable(self):
        """``"yes"``, or ``"no (why)"`` in a few words: whether this broker takes writes now (stats
        ``replication_writable``, the ``metaq_replication_writable`` metric, ``metaq-admin cluster``). The yes or no
        is the put path's (``put_refusal``: a full disk and a failed flush refuse too; unwired:
        ``acknowledge_refusal``). A ``sync`` master with no in-sync member is the case an operator must see: it is
        the master, and it serves nothing until a member is back in sync."""
        if self.put_refusal is not None:
            exc = self.put_refusal()
            if exc is None:
                return "yes"
        elif self.acknowledge_refusal() is None:
            return "yes"
        else:
            exc = None
        words = self._refusal_words()
        if words is None:  # not these roles': the disk's or the flusher's
            words = "disk full" if isinstance(exc, errors.DiskFull) else "writes refused after a failed flush" \
                if exc is not None and "failed flush" in str(exc) else str(exc)[:80]
        return "no (%s)" % words

    def _refusal_words(self):
        """Why these roles refuse writes, in a few words (``writable``), or None: they do not."""
        if self.role != "master":
            return "slave" if self.slave_link is not None else "no elected master"
        if self.election is not None and self.election.lease.refusal() is not None:
            return "lease not confirmed by ZooKeeper"
        if self.unrecorded is not None:
            return "epoch not recorded in ZooKeeper yet"
        if self.isolation_refusal() is not None:
            return "isolated from its slaves and ZooKeeper"
        server = self.replication
        short = server.no_slave_short() if server is not None else None
        if short is None and self.slave_refusal is not None:
            return self.slave_refusal[:80]
        return short

    def isolation_refusal(self):
        """Why this ``async`` master may be cut off and must acknowledge nothing (``replication/isolation.py``: no
        slave's ACK and no ZooKeeper confirmation within ``replication.max_isolation_ms``), or None."""
        server = self.replication
        if server is None or self.slave_link is not None:
            return None
        zk_heard_at = self.election.lease.confirmed_at if self.election is not None else None
        return isolation.refusal(server.isolation_s, time.monotonic(), server.heard_at, zk_heard_at)

    def confirmed_end(self):
        """What this master's peers may be sent of its log: ``ReplicationServer.confirmed_end`` (None: all)."""
        server = self.replication
        return server.confirmed_end() if server is not None and self.role == "master" else None

    def wait_confirmed(self, timeout):
        """Wait for the next slave ACK of this master (at most ``timeout`` s)."""
        server = self.replication
        if server is not None:
            server.wait_confirmed(timeout)
        else:
            gevent.sleep(timeout)

    @property
    def end_unknown(self):
        """True while this broker's partition ends may be short of the master's: a slave not linked, or linked and
        not caught up (a member waiting for an election too). A read past our end is then "not here yet", never
        "out of range": the master may hold it, and a consumer sent back to our end would read twice."""
        if self.role == "master":
            return False
        link = self.slave_link
        return link is None or not (link.connected and link.caught_up())

    #: True while this master serves slaves in ``sync`` mode (a put is acknowledged once a slave has it): kept with
    #: ``replication`` by ``_serve``, the one place it changes, so a put reads an attribute, not a property.
    sync_replication = False

    def _serve(self, server):
        """``server`` (a ReplicationServer, or None: a slave, or no replication port) is the master's now; its
        mode is fixed for its life, so ``sync_replication`` is decided here."""
        self.replication = server
        self.sync_replication = server is not None and server.mode == "sync"

    @property
    def slave_id(self):
        """Our slave (member) id while not master, else None (what the registry registers as)."""
        if self.role == "master":
            return None
        if self.slave_link is not None:
            return self.slave_link.slave_id
        return self._follow_id if self._follow_id is not None else self.config.replication.slave_id

    @property
    def replication_port(self):
        return self.replication.port if self.replication is not None else None

    def notify(self):
        """New bytes may be there for the slaves."""
        if self.replication is not None:
            self.replication.notify()

    # -- building the two sides ----------------------------------------------------

    def make_slave_link(self, master=None, slave_id=None):
        on_topics = self._new_topics if self.registry is not None or self.config.zk.connect else None
        return SlaveLink(self.store, self.config, self.flusher, self.waiters, self.store_lock, master, slave_id,
                         on_handshake=self._handshake_done, on_new_topics=on_topics, secret=self.secret,
                         on_cut=lambda report: [fn(report) for fn in self._cut_listeners],
                         on_disk_full=lambda: [fn() for fn in self._disk_full_listeners])

    def serve_peers(self, handler):
        """Serve the other masters of an MQTT cluster (their follows and their calls) with ``handler``
        (``ReplicationServer.peer_handler``), on the replication server now and on any made later (a promotion)."""
        self.peer_handler = handler
        if self.replication is not None:
            self.replication.peer_handler = handler

    def make_replication_server(self, insync=None):
        """The master's ReplicationServer when a replication port is configured, else None."""
        if not self.config.replication.port:
            return None
        server = ReplicationServer(self.core, self.store, self.config, secret=self.secret, insync=insync)
        server.peer_handler = self.peer_handler
        return server

    def _handshake_done(self):
        """A slave's epoch handshake cut what needed cutting: reads may be served. True if they were refused."""
        if self.read_refusal is None:
            return False
        self.read_refusal = None
        return True

    def _new_topics(self, topics):
        if self.registry is not None:
            for topic in topics:
                self.registry.topic_created(topic)

    def handshake_refusal(self):
        """Why reads are refused until the first handshake (a slave that led its latest epoch), or None."""
        epochs = self.store.epochs
        if self.role == "master" or not epochs.led:
            return None
        master = self.slave_link.master if self.slave_link is not None else "its elected master"
        return ("this broker led epoch %d and now rejoins %s as a slave: it serves no read until the epoch "
                "handshake with that master has cut any tail the master never had" % (epochs.epoch, master))

    # -- life ----------------------------------------------------------------------

    def start(self):
        """At the broker's start (ZooKeeper session open): maybe rejoin a newer master; a master's new epoch.
        ``start_links`` then serves slaves or follows the master."""
        if self.auto:
            return  # the election decides
        if self.role == "master" and self.registry is not None and self.registry.zk.connected:
            if not self.follow_record():
                self.rejoin_if_superseded()
        if self.role == "master":
            self.begin_master_epoch()

    def start_links(self):
        if self.keeper is not None:
            self.keeper.start()
        if self.replication is not None:
            self.replication.start()
        if self.slave_link is not None:
            self.slave_link.start()
        self.started = True

    def stop(self):
        if self.keeper is not None:
            self.keeper.stop()
        if self.slave_link is not None:
            self.slave_link.stop()
        if self.replication is not None:
            self.replication.stop()

    def set_role(self, role, slave_link, insync=None):
        """Switch to ``"master"`` (slave_link None) or to ``"slave"`` of ``slave_link``'s master (None: of no
        master yet, ha: auto)."""
        if self.slave_link is not None and self.slave_link is not slave_link:
            self.slave_link.stop()
        if self.replication is not None and role == "slave":
            self.replication.stop()
        self.role, self.slave_link = role, slave_link
        if role == "master":
            self.behind = self._follow_id = None
            self.yielded = False
            self._serve(self.make_replication_server(insync))
            self.read_refusal = None
            if self.keeper is not None:
                self.keeper.wake()
            if self.started and self.replication is not None:
                self.replication.start()
        else:
            self.unrecorded = None
            self._serve(None)
            self.read_refusal = self.handshake_refusal()
            if self.started and slave_link is not None:
                slave_link.start()
        for fn in self._listeners:
            fn(self.slave_id)

    def begin_master_epoch(self):
        """A master's start: a new epoch (fresh origin) at the log end, numbered above the group's record and added
        to it before this master serves."""
        store = self.store
        epoch = gevent.get_hub().threadpool.apply(store.epochs.begin, (store.written_position, self._next_epoch()))
        self._record_epoch()
        return epoch

    # -- the group's epoch record (epochrecord.py) ---------------------------------------

    def _next_epoch(self):
        """The number of our next epoch: above the record's latest (None: ZooKeeper not asked, ``begin`` picks)."""
        if self.record is None or not self.registry.zk.connected:
            return None
        try:
            return self.record.next_epoch(self.store.epochs.max_epoch)
        except KazooException as exc:
            log.warning("epoch record: not read (%r); numbering the new epoch from this broker's history", exc)
            return None

    def _recorded_entry(self, master=True):
        """Our latest epoch as the record names it (``master``: only while we are master, else None)."""
        if master and (self.role != "master" or self.promoting):
            return None
        return record_entry(self.store.epochs, self.registry.member_url(),
                            self.registry.replication_address(self.config.replication.port or None)
                            if self.config.replication.port else None)

    def _record_epoch(self, strict=False, checked=ANY):
        """Add the epoch just begun to the group's record, before we serve in it. ``strict`` (a promotion, an
        election): a failure raises, and so does a later epoch recorded first. Else (a manual master's start) a
        failure leaves this master refusing writes (``unrecorded``) until the keeper has read the record and added
        our epoch (or yields to a later one): it never serves an epoch the group may not know of. ``checked``:
        the latest entry the caller decided on (``EpochRecord.add``). A strict failure raises ``NotRecorded``."""
        if self.record is None:
            return
        epoch = self.store.epochs.epoch
        if not strict and not self.registry.zk.connected:
            self._unrecorded(epoch, "ZooKeeper is not reachable")
            return
        try:
            newer = self.record.add(self._recorded_entry(master=False), checked)
        except KazooException as exc:
            if strict:
                raise NotRecorded("the write failed: %r" % (exc,)) from None
            self._unrecorded(epoch, "the write failed: %r" % (exc,))
            return
        if newer is not None:
            if strict:
                raise NotRecorded("epoch %d of %s was recorded first" % (newer["epoch"], who(newer)))
            self._unrecorded(epoch, "a later epoch %d of %s is recorded" % (newer["epoch"], who(newer)))
            return
        self.unrecorded = None

    def _unrecorded(self, epoch, why):
        """Refuse writes until the keeper has recorded ``epoch`` (or yielded): ``why`` it is not recorded yet. A
        master without a replication port serves meanwhile: no member can have followed it, so none holds a later
        epoch begun from its log (a standalone broker serves while ZooKeeper is down, as it always did)."""
        if not self.config.replication.port:  # debug: the registry says once that ZooKeeper does not answer
            log.debug("epoch record: epoch %d of broker %d not recorded yet (%s): recorded once ZooKeeper answers; "
                        "this broker serves meanwhile (it has no replication port, so no slave of it exists)",
                        epoch, self.config.broker.id, why)
            if self.keeper is not None:
                self.keeper.wake()
            return
        self.unrecorded = ("broker %d's master has not recorded its epoch %d in ZooKeeper's epoch record yet (%s): "
                           "it takes no writes until it has read the record and added its epoch (it follows "
                           "another member instead if that one began a later epoch); retry shortly"
                           % (self.config.broker.id, epoch, why))
        log.warning("epoch record: %s", self.unrecorded)
        if self.keeper is not None:
            self.keeper.wake()

    def _epoch_recorded(self):
        """The keeper found our epoch the record's latest: writes are taken from now on."""
        if self.unrecorded is not None:
            self.unrecorded = None
            log.warning("epoch record: epoch %d of broker %d recorded in ZooKeeper: this master takes writes",
                        self.store.epochs.epoch, self.config.broker.id)

    def follow_record(self):
        """ha: manual, before starting as master: when the group's record names another member's later epoch
        (a promotion while we were down), follow that member instead; True when we did."""
        try:
            latest = self.record.latest() if self.record is not None else None
        except KazooException as exc:
            log.warning("epoch record: not read at start (%r); starting as configured", exc)
            return False
        epochs = self.store.epochs
        if leads_record(epochs.entries, epochs.led, record_key(latest)):
            return False
        return self.yield_to(latest)

    def yield_to(self, latest):
        """ha: manual: ``latest``, another member's epoch later than ours, is the group's latest recorded: stop
        acknowledging and follow that member as a slave (its epoch handshake cuts what diverged); the promotion
        marker goes. A member it cannot follow (no replication address) leaves it taking no writes. ``latest`` begun
        by this broker itself (known by its URL or its replication address) whose data dir lost it: with a
        replication port a slave may hold what it lost, so it takes no writes. A broker without a replication port
        yielding to itself or to a member without one (no slave possible on either side) logs loudly and stays
        master in a new epoch, as before the record existed. True when it left the master's role."""
        store = self.store
        address, mine = latest.get("replication"), self._recorded_entry(master=False)
        own = (address is not None and address == mine["replication"]) or (
            latest.get("member") is not None and latest.get("member") == mine["member"])
        text = ("broker %d's latest epoch is %d, begun by %s from log position %d (ZooKeeper's epoch record), "
                "after this broker's epoch %d" % (self.config.broker.id, latest["epoch"], who(latest),
                                                  latest["start"], store.epochs.epoch))
        if not self.config.replication.port and (own or address is None):
            log.error("%s: %s, and this broker serves no replication port: no slave of either can hold more than "
                      "this broker does (its epochs file damaged, emptied or restored from a backup), so it goes on "
                      "as master in a new epoch above the recorded one. If such a slave did exist, compare the logs "
                      "now", text, "this broker began that epoch" if own else "that member served no slaves either")
            if self.started and self.role == "master":
                self.begin_master_epoch()
            return False
        slave_id = self.config.replication.slave_id
        if slave_id is None:
            slave_id = self.registry.free_slave_id()
        if read_promoted(store) is not None:
            store.dirs.remove(store.dirs.promoted)
        self.behind = None
        if own:
            self.behind = ("%s: this broker began that epoch, but its data dir no longer holds it (emptied or "
                           "replaced), so it takes no writes: a slave of it may hold what it lost (promote that "
                           "one), or, to start this broker afresh as master, delete the ZooKeeper node %s"
                           % (text, self.record.path))
        elif address is None:
            self.behind = ("%s; it has no replication address to follow: this broker takes no writes. Start that "
                           "member (or promote a slave of it)" % text)
        self.yielded = True
        if self.behind is not None:
            self._follow_id = slave_id
            log.warning("%s", self.behind)
            self.set_role("slave", None)
            return True
        log.warning("%s: this broker is behind it and follows it as slave %d at %s (the epoch handshake cuts any "
                    "tail that member never had); it is master again only by a promotion", text, slave_id, address)
        self.set_role("slave", self.make_slave_link(address, slave_id))
        return True


    def _followed(self):
        """For the keeper: the address followed after a yield ("" while following nobody), None when not yielded."""
        if self.role == "master" or not self.yielded:
            return None
        return self.slave_link.master if self.slave_link is not None else ""

    def _serving_address(self, latest):
        """Where ``latest``'s master serves slaves now: the live ``replication`` node when it names that very epoch
        (the master restarted elsewhere before its next epoch was recorded), else the recorded address. None for
        an epoch of our own (a data dir that lost it follows nobody)."""
        mine = self._recorded_entry(master=False)
        if (latest.get("member") is not None and latest.get("member") == mine["member"]) or (
                latest.get("replication") is not None and latest.get("replication") == mine["replication"]):
            return None
        try:
            live = self.registry.live_master()
        except KazooException:
            live = None
        if live and isinstance(live.get("address"), str) and live["address"] and record_key(latest) == (
                live.get("epoch"), live.get("epoch_start"), live.get("epoch_origin")):
            return live["address"]
        return latest.get("replication")

    def _refollow(self, latest, address):
        """The latest recorded master serves at ``address`` now: follow it there (same slave id)."""
        slave_id = self.slave_id
        log.warning("broker %d's latest recorded master %s (epoch %d) serves slaves at %s now: following it there "
                    "as slave %d", self.config.broker.id, who(latest), latest["epoch"], address, slave_id)
        self.behind = self._follow_id = None
        self.set_role("slave", self.make_slave_link(address, slave_id))

    # -- ha: auto (called by the election) ----------------------------------------------

    def lead(self, epoch, insync, checked=ANY):
        """Elected: stop following, begin ``epoch`` (assigned through ZooKeeper) at our log end, record it
        (``checked``: the latest recorded entry the election decided on; ``NotRecorded`` when it cannot be), become
        master with ``insync`` as the set sync puts wait for; returns the epoch's start position."""
        store = self.store
        if self.slave_link is not None:
            self.slave_link.stop()
        self.flusher.wait_flushed(store.written_position)
        position = store.written_position
        gevent.get_hub().threadpool.apply(store.epochs.begin, (position, epoch))
        self._record_epoch(strict=True, checked=checked)
        self.set_role("master", None, insync)
        return position

    def follow(self, address, member):
        """Another member leads: be its slave (no change when already following ``address``)."""
        link = self.slave_link
        if self.role == "slave" and link is not None and link.master == address:
            return
        log.warning("following the elected master of broker %d at %s (as member %d)", self.config.broker.id,
                    address, member)
        self.set_role("slave", self.make_slave_link(address, member))

    def wait_for_master(self):
        """Deposed, or no leader: acknowledge nothing until the election says whom to follow."""
        if self.role == "slave" and self.slave_link is None:
            return
        self.set_role("slave", None)

    def rejoin_if_superseded(self):
        """With ZooKeeper, before starting as master: become the slave of a newer live master, if there is one."""
        other = self.registry.live_master()
        if other is None:
            return False
        store = self.store
        ours = tuple(store.epochs.latest)
        theirs = (other.get("epoch", -1), other.get("epoch_start", -1), other.get("epoch_origin", 0))
        if theirs == ours:  # our own previous incarnation, killed before its session expired
            return False
        if not other.get("address") or theirs[0] <= ours[0]:
            log.warning("ZooKeeper shows %s as master of broker %d at epoch %s (ours: %d); not rejoining it (it is "
                        "not newer or has no replication address): both may take writes until one stops",
                        other.get("url"), self.config.broker.id, theirs[0], ours[0])
            return False
        slave_id = self.config.replication.slave_id
        if slave_id is None:
            slave_id = self.registry.free_slave_id()
        log.warning("ZooKeeper shows %s (replication %s) as master of broker %d at epoch %d, newer than ours (%d): "
                    "we were superseded while down; rejoining it as slave %d (the epoch handshake cuts any tail it "
                    "never had)", other.get("url"), other["address"], self.config.broker.id, theirs[0], ours[0],
                    slave_id)
        if read_promoted(store) is not None:
            store.dirs.remove(store.dirs.promoted)
        self.set_role("slave", self.make_slave_link(other["address"], slave_id))
        return True


    @staticmethod
    def _lag_text(link):
        if link.master_written is None:
            return "it has never heard from its master %s" % link.master
        silence = link.silence_s()
        if link.lag_bytes == 0 and silence is not None and silence > CAUGHT_UP_SILENCE_S:
            return ("its master %s said nothing for %.0f s before the link went down: it may have acknowledged puts "
                    "this slave never heard of (another slave confirming them, or async); compare the slaves' log "
                    "ends (stats: log_end_position) and promote the most advanced with --force"
                    % (link.master, silence))
        return "%d bytes, %d messages behind the last known end of its master %s (%d)" % (
            link.lag_bytes, max(0, link.lag_messages), link.master, link.master_written)


    def promote(self, force):
        """Make this slave the master of its broker id; returns the reply text (raises MetaqError when refused)."""
        link = self.slave_link
        if self.auto:
            raise errors.ClientError("broker %d elects its master through ZooKeeper (replication.ha: auto): stop "
                                     "the master and the election picks an in-sync member; promote is for "
                                     "ha: manual" % self.config.broker.id)
        if link is None:
            raise errors.ClientError("not a slave: broker %d is already a master; promote a slave instead"
                                     % self.config.broker.id)
        if self.promoting:
            raise errors.Unavailable("a promotion of this broker is already under way")
        if not force:
            if link.connected:
                raise errors.Unavailable("the link to the master %s is up (the master is alive); stop the "
                                         "master first, or use --force (two masters would then take writes)"
                                         % link.master)
            if not link.caught_up():
                raise errors.Unavailable("this slave is not caught up: %s; promoting it would lose those "
                                         "messages. Wait for the master to return, or use --force"
                                         % self._lag_text(link))
        if self.registry is not None and not self.registry.zk.connected:
            raise errors.Unavailable("ZooKeeper (zk.connect) is not reachable: a promotion records its epoch in "
                                     "broker %d's epoch record before it takes writes (else the old master could "
                                     "win a later restart); retry once ZooKeeper answers" % self.config.broker.id)
        behind = None if link.caught_up() else self._lag_text(link)
        self.promoting = True
        try:
            return self._promote(link, behind)
        finally:
            self.promoting = False


    def _promote(self, link, behind):
        store = self.store
        link.stop()
        self.flusher.wait_flushed(store.written_position)
        pool = gevent.get_hub().threadpool
        position = store.written_position
        epoch = pool.apply(store.epochs.begin, (position, self._next_epoch()))
        try:
            self._record_epoch(strict=True)
        except NotRecorded as exc:
            link.resume()
            raise errors.Unavailable("promotion refused: epoch %d could not be added to broker %d's epoch record in "
                                     "ZooKeeper (%s); this broker stays a slave of %s (a master whose epoch the "
                                     "group does not know of could lose its writes to the old master at a restart). "
                                     "Fix ZooKeeper (reachable, writable by this broker) and promote again"
                                     % (epoch, self.config.broker.id, exc, link.master)) from None
        pool.apply(store.dirs.write_state, (store.dirs.promoted, PROMOTED_MAGIC, {
            "epoch": epoch, "position": position, "former_master": link.master, "promoted_ms": now_ms()}))
        self.set_role("master", None)
        text = "promoted: broker %d is now the master, epoch %d from log position %d (former master %s)" % (
            self.config.broker.id, epoch, position, link.master)
        if behind is not None:
            text += "; FORCED while %s: those messages are not here" % behind
        if self.replication is not None:
            text += "; slaves may attach on replication port %d" % self.replication.port
        if self.registry is not None:
            text += "; registering in ZooKeeper as master"
        log.warning("%s", text)
        return text

    def stats_values(self):
        """The ``stats`` summary's replication pairs: role (slave; master with a replication port or after a
        promotion; none = standalone), epoch, then the link's or the replication server's own figures."""
        store = self.store
        promoted = self.role == "master" and read_promoted(store) is not None
        if self.slave_link is not None:
            role, more = "slave", self.slave_link.stats_values()
        elif self.role == "slave":  # ha: auto, no elected master to follow yet
            role, more = "slave", [("replication_master", "none"), ("replication_link", "down")]
        elif self.replication is not None:
            role, more = "master", self.replication.stats_values()
        else:
            role, more = ("master" if promoted else "none"), []
        more = more + (self.election.stats_values() if self.election is not None else [("replication_ha", "manual")])
        return [("replication_role", role), ("replication_epoch", store.epochs.epoch),
                ("replication_epoch_start", store.epochs.latest[1]),
                ("replication_epoch_origin", origin_text(store.epochs.latest[2])), ("replication_promoted", promoted),
                ("replication_reads_refused", bool(self.read_refusal)), ("replication_writable", self.writable())] \
            + more
