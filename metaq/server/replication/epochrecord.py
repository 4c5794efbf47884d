"""A group's epochs kept in ZooKeeper beyond any session: which member was master of which epoch, from where.

Node ``<root>/brokers/ids/<id>/epochs`` (persistent; the ephemeral ``master``, ``replication`` and ``leader``
nodes go with their session, this one stays):

    {"epochs": [{"epoch": E, "start": P, "origin": O, "member": "meta://host:port",
                 "replication": "host:port" or null}, ...]}

the latest last, at most ``MAX_RECORDED_EPOCHS``. A master adds its epoch before it takes a write: ``ha: manual``
at its start (until it has, it refuses writes and the ``Keeper`` retries) and at a promotion (a failed write refuses
the promotion), ``ha: auto`` when elected (a failed write gives the leadership up, with a backoff). Writes carry the
version read and the latest entry the writer decided on, so two masters racing cannot both add: the second reads
again and finds the first's. Epoch numbers are taken above the record's latest when ZooKeeper answers; origins,
not numbers, tell epochs apart.

A member decides from the latest entry and its own history (``store.epochs.took_part``, ``leads_record``): with
``ha: auto`` a member that did not take part in the latest epoch may not be elected; with ``ha: manual`` only the
member that began the latest epoch starts as master, every other starts as its slave (its epoch handshake cuts
what diverged), and a running master that finds a later epoch of another member recorded (a promotion elsewhere,
or its own start while ZooKeeper was out of reach) yields: it stops acknowledging and follows that member
(``Keeper``), and keeps following it to wherever it serves. A node too large, nested too deep or not readable as
such counts as no record (logged) and is replaced by the next write.
"""

import json
import logging

import gevent
from gevent.event import Event
from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

from metaq.server.replication import limits as replication_limits
from metaq.store.epochs import leads_record

log = logging.getLogger(__name__)

#: Seconds between a manual master's looks at the record when no watch fires.
KEEPER_POLL_S = 5.0

#: ``add``'s ``checked`` when the caller decided on no particular latest entry.
ANY = object()


class NotRecorded(KazooException):
    """An epoch could not be added to the record (ZooKeeper failed, refused, or another entry came first)."""


def key(entry):
    """A recorded entry as the ``(epoch, start, origin)`` a history holds, or None."""
    return None if entry is None else (entry["epoch"], entry["start"], entry["origin"])


def who(entry):
    """How messages name the member that began a recorded epoch: its URL, else its replication address."""
    if entry.get("member"):
        return entry["member"]
    return "the member at %s" % entry["replication"] if entry.get("replication") else "a member of unknown address"


#: Entry integers (epoch, start, origin) are 0 <= n < 2**63: what a history and the wire hold.
INTEGER_LIMIT = 2 ** 63


def _json_integer(value):
    """``value`` when it is an integer in ``[0, INTEGER_LIMIT)``, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < INTEGER_LIMIT:
        return value
    return None


def parse(data):
    """The entries of a node's bytes (the latest last); ValueError naming what is wrong (nesting too deep for the
    JSON parser included: it counts as unreadable like any other malformed node)."""
    if len(data) > replication_limits.MAX_EPOCH_RECORD_BYTES:
        raise ValueError("%d bytes, more than MAX_EPOCH_RECORD_BYTES (%d)"
                         % (len(data), replication_limits.MAX_EPOCH_RECORD_BYTES))
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("not JSON") from None
    except RecursionError:
        raise ValueError("JSON nested too deep") from None
    items = value.get("epochs") if isinstance(value, dict) else None
    if not isinstance(items, list):
        raise ValueError("no list of epochs")
    out = []
    for item in items[-replication_limits.MAX_RECORDED_EPOCHS:]:
        if not isinstance(item, dict) or None in (_json_integer(item.get("epoch")), _json_integer(item.get("start")),
                                                  _json_integer(item.get("origin"))):
            raise ValueError("an entry is not {epoch, start, origin, ...} of integers 0 <= n < 2**63: %.200r"
                             % (item,))
        replication = item.get("replication")
        member = item.get("member")
        out.append({"epoch": item["epoch"], "start": item["start"], "origin": item["origin"],
                    "member": member if isinstance(member, str) else None,
                    "replication": replication if isinstance(replication, str) and replication else None})
    return out


def entry(epochs, member, replication):
    """The record entry of a history's latest epoch (``store.epochs.EpochHistory``), begun by ``member`` (its
    meta:// URL) serving slaves at ``replication`` (host:port or None)."""
    epoch, start, origin = epochs.latest
    return {"epoch": epoch, "start": start, "origin": origin, "member": member, "replication": replication}


class EpochRecord:
    """The node of one broker id (see the module doc). ``zk``: the registry's kazoo client."""

    def __init__(self, zk, ids_path):
        self.zk = zk
        self.path = ids_path + "/epochs"

    def read(self, watch=None):
        """``(entries, version)``: no node is ``([], None)``; an unreadable one is ``([], its version)`` (logged)."""
        try:
            data, stat = self.zk.get(self.path, watch=watch)
        except NoNodeError:
            if watch is not None:
                self.zk.exists(self.path, watch=watch)
            return [], None
        try:
            return parse(data), stat.version
        except ValueError as exc:
            log.warning("the epoch record %s is unreadable (%s): counted as none, replaced at the next epoch",
                        self.path, exc)
            return [], stat.version

    def latest(self):
        entries, _version = self.read()
        return entries[-1] if entries else None

    def next_epoch(self, max_epoch):
        """The number a new epoch takes: above this member's highest (``max_epoch``) and the record's latest."""
        latest = self.latest()
        return max(max_epoch, latest["epoch"] if latest else 0) + 1

    def add(self, new, checked=ANY):
        """Add ``new`` (an ``entry``) as the latest; returns None, or the recorded latest entry that is not older
        than ``new`` (another member's, added first: ``new`` is not added). ``checked``: the latest entry (or None)
        the caller decided on (``took_part``, ``leads_record``); when the record's latest is another by now, that is
        returned and nothing is added (a record deleted meanwhile holds nothing to be behind of: ``new`` is added).
        Versioned writes, read again on a race."""
        for _attempt in range(5):
            entries, version = self.read()
            latest = entries[-1] if entries else None
            if latest is not None and key(latest) == key(new):
                return None
            if latest is not None and latest["epoch"] >= new["epoch"]:
                return latest
            if checked is not ANY and latest is not None and key(latest) != key(checked):
                return latest
            kept = (entries + [new])[-replication_limits.MAX_RECORDED_EPOCHS:]
            data = json.dumps({"epochs": kept}, separators=(",", ":")).encode("utf-8")
            while len(data) > replication_limits.MAX_EPOCH_RECORD_BYTES and len(kept) > 1:
                kept = kept[1:]
                data = json.dumps({"epochs": kept}, separators=(",", ":")).encode("utf-8")
            try:
                if version is None:
                    self.zk.create(self.path, data, makepath=True)
                else:
                    self.zk.set(self.path, data, version=version)
                log.info("epoch %d of this broker id recorded in %s (from log position %d)", new["epoch"],
                         self.path, new["start"])
                return None
            except (NodeExistsError, BadVersionError):
                continue
        raise KazooException("the epoch record %s kept changing under our writes" % self.path)


class Keeper:
    """``ha: manual``, while this broker is master: its epoch is in the record (added here when its start or
    promotion could not), and when another member's later epoch is, it yields (``yield_to(entry)``). One greenlet,
    woken by a watch on the node and at least every ``KEEPER_POLL_S``.

    ``record``: ``EpochRecord``; ``epochs``: the store's ``EpochHistory`` (read only); ``mine()``: this master's
    entry now, None while it is not master; ``yield_to(entry)``: become that member's slave; ``recorded()``: our
    epoch is the record's latest (the master may take writes from then on).

    After a yield it keeps watching: ``followed()`` is the address this member follows because of the record
    ("" while it follows nobody, None when it did not yield); ``address_of(entry)`` where the latest recorded
    master serves slaves now (its live ``replication`` node when that names the same epoch, else the entry's);
    ``refollow(entry, address)``: follow that master there instead (it restarted elsewhere)."""

    def __init__(self, record, epochs, mine, yield_to, recorded=lambda: None, followed=lambda: None,
                 address_of=lambda entry: entry.get("replication"), refollow=None, poll_s=KEEPER_POLL_S):
        self.record = record
        self.epochs = epochs
        self.mine = mine
        self.yield_to = yield_to
        self.recorded = recorded
        self.followed = followed
        self.address_of = address_of
        self.refollow = refollow
        self.poll_s = poll_s
        self._wake = Event()
        self._task = None

    def start(self):
        if self._task is None:
            self._task = gevent.spawn(self._run)

    def stop(self):
        if self._task is not None:
            self._task.kill(block=False)
            self._task = None

    def wake(self):
        self._wake.set()

    def _watch(self, _event):
        self._wake.set()  # a kazoo callback: wake, nothing else

    def _run(self):
        while True:
            self._wake.clear()
            try:
                if self.record.zk.connected:
                    self.check()
            except KazooException as exc:
                log.warning("epoch record: ZooKeeper call failed (%r); looking again in %.0f s", exc, self.poll_s)
            except Exception:  # noqa: BLE001 - the keeper must go on
                log.exception("epoch record: unexpected failure")
            self._wake.wait(self.poll_s)

    def check(self):
        """One look: record our epoch, or yield to a later one of another member. Returns what it did."""
        mine = self.mine()
        if mine is None:
            return self._check_followed()
        entries, _version = self.record.read(watch=self._watch)
        latest = entries[-1] if entries else None
        epochs = self.epochs
        if leads_record(epochs.entries, epochs.led, key(latest)):
            if latest is None or key(latest) != key(mine):
                newer = self.record.add(mine, checked=latest)
                if newer is not None:
                    self.yield_to(newer)
                    return "yielded"
                self.recorded()
                return "recorded"
            self.recorded()
            return "recorded already"
        self.yield_to(latest)
        return "yielded"

    def _check_followed(self):
        """Not master: after a yield, follow the latest recorded master where it serves now."""
        followed = self.followed()
        if followed is None or self.refollow is None:
            return "not master"
        entries, _version = self.record.read(watch=self._watch)
        latest = entries[-1] if entries else None
        address = self.address_of(latest) if latest is not None else None
        if not address or address == followed:
            return "following"
        self.refollow(latest, address)
        return "refollowed"
