"""An elected master's term (``replication.ha: auto``): its lease, its in-sync set in ZooKeeper, its clean step-down.

The **lease** (``Lease``): a master acknowledges a put only while it runs. It is renewed by a request that found
the ``leader`` node owned by our session, *after* a ``sync`` that makes the answering ZooKeeper server catch up
with the ensemble's leader (a follower cut off from it would otherwise answer from stale state), and it runs
``lease`` seconds from the moment that request was *sent*. ZooKeeper expires a session no earlier than its
negotiated timeout after the last request it got from it, and nobody else can be elected before that, so with a
lease shorter than the negotiated timeout an old master stops acknowledging before a new one may start. The
negotiated timeout is what ZooKeeper granted (``ZkRegistry.negotiated_timeout_s``), which may be less than
``zk.session_timeout_ms`` (ZooKeeper caps it at ``maxSessionTimeout``): the lease is at most half of it.

A revocation (deposed, stepping down, session lost) wins over a renewal already in flight: each renewal carries
the lease's *generation* at its sending, and a revocation starts a new one.

The **in-sync set** (``insync.py`` for the rules): ``tick`` — every ``TICK_S`` — removes from ZooKeeper, then from
memory, the members that lag or left; adds in memory, then in ZooKeeper, the slaves that caught up; retries a
write that did not land. A write whose outcome is unknown (the connection dropped) is followed by a re-read of the
node before any other decision; a write that finds a newer version means another master wrote it: deposed.
"""

import json
import logging
import time

import gevent
from kazoo.exceptions import BadVersionError, KazooException, NoNodeError

from metaq.server.replication.insync import InSyncSet

log = logging.getLogger(__name__)

TICK_S = 0.1  # the in-sync checks
STEP_DOWN_WAIT_S = 5.0  # a clean stop waits this long at most for an in-sync slave to hold the whole log


def dump(value):
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode("utf-8")


class Lease:
    """Until when this master may acknowledge (monotonic clock), and why not once it may not."""

    def __init__(self, duration_s):
        self.duration_s = duration_s
        self.until = 0.0
        self.reason = "it has not been elected"
        self.generation = 0
        self.confirmed_at = None  # when the last request that confirmed our leadership was sent (monotonic)

    def renew(self, sent_at, generation=None):
        """A request sent at ``sent_at`` (when the lease was at ``generation``) confirmed our leadership."""
        if generation is not None and generation != self.generation:
            return False  # revoked since that request left
        self.until = max(self.until, sent_at + self.duration_s)
        self.confirmed_at = sent_at if self.confirmed_at is None else max(self.confirmed_at, sent_at)
        self.reason = None
        return True

    def revoke(self, reason):
        self.generation += 1
        self.until = 0.0
        self.confirmed_at = None
        self.reason = reason

    def refusal(self):
        if self.reason is None and time.monotonic() < self.until:
            return None
        return self.reason or ("ZooKeeper has not confirmed its leadership for %.1f s (lease expired)"
                               % self.duration_s)


class Term:
    """One term as master: the in-sync set in memory and as last written to ZooKeeper."""

    def __init__(self, zk, paths, member, broker_id, epoch, lag_s, version, members, carried):
        """``members``: the node's members as written at the election (``version``); ``carried``: the members
        kept from the previous term (they held every acknowledged message): puts wait for them from the start,
        and they leave the set like any member that lags."""
        self.zk = zk
        self.insync_path = paths
        self.member = member
        self.broker_id = broker_id
        self.epoch = epoch
        self.insync = InSyncSet(member, lag_s)
        for m in carried:
            self.insync.join(m, seen=time.monotonic())
        self.version = version
        self.members = set(members)  # what ZooKeeper holds, as far as we know
        self.uncertain = False  # a write's outcome is unknown: re-read before deciding anything

    def record(self, members):
        return {"epoch": self.epoch, "master": self.member, "members": sorted(members)}

    def tick(self, written_end, positions, changed, deposed):
        """One round of in-sync upkeep (see the module docstring). ``positions``: connected slave -> confirmed;
        ``changed()``: the set sync puts wait for changed; ``deposed(reason)``: another master wrote the node."""
        insync = self.insync
        now = time.monotonic()
        insync.sample(written_end, now)
        insync.seen(positions, now)
        if self.uncertain and not self._reread(deposed):
            return
        for m in insync.lagging(positions, now):
            if m in self.members and not self._write(self.members - {m}, "member %d left the in-sync set (%s)" % (
                    m, "disconnected" if m not in positions else "behind for %.1f s" % insync.lag_s), deposed):
                return
            insync.leave(m)
            changed()
        for m, written in sorted(positions.items()):
            if insync.may_join(m, written, now):
                insync.join(m, seen=now)  # puts wait for it from now on; electable once the write below lands
                changed()
        want = insync.required() | {self.member}
        if not want <= self.members:
            self._write(self.members | want, "members %s joined the in-sync set" % sorted(want - self.members),
                        deposed)

    def _write(self, members, why, deposed):
        try:
            stat = self.zk.set(self.insync_path, dump(self.record(members)), version=self.version)
        except (BadVersionError, NoNodeError):
            deposed("the insync node of broker %d was written by another master" % self.broker_id)
            return False
        except KazooException as exc:
            self.uncertain = True
            log.warning("election: writing the in-sync set of broker %d failed (%r): reading it again before "
                        "any change", self.broker_id, exc)
            return False
        self.version, self.members = stat.version, set(members)
        log.info("election: %s: in-sync set of broker %d is now %s", why, self.broker_id, sorted(members))
        return True

    def _reread(self, deposed):
        try:
            data, stat = self.zk.get(self.insync_path)
        except NoNodeError:
            deposed("the insync node of broker %d is gone" % self.broker_id)
            return False
        except KazooException:
            return False
        try:
            node = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            node = None
        if not isinstance(node, dict) or node.get("master") != self.member or node.get("epoch") != self.epoch:
            deposed("the insync node of broker %d names another master or epoch: %s" % (self.broker_id, node))
            return False
        members = node.get("members")
        self.members = {m for m in members if isinstance(m, int)} if isinstance(members, list) else set()
        self.version, self.uncertain = stat.version, False
        return True


def step_down(term, server, written_end, mode, broker_id):
    """A clean stop (the lease already revoked): wait, at most STEP_DOWN_WAIT_S, until a slave that may be
    elected holds our whole log; the caller then closes the ZooKeeper session. With nobody to wait for (``sync``:
    no other member in the in-sync set; ``async``: no slave connected) it returns at once: no member can catch up
    from us, and the wait would only delay the stop."""
    deadline = time.monotonic() + STEP_DOWN_WAIT_S
    while server is not None and time.monotonic() < deadline:
        positions = server.positions()
        held = [m for m, p in positions.items() if p >= written_end and (mode == "async" or m in term.members)]
        if held:
            log.warning("stepping down as master of broker %d: member %s holds our whole log (%d)", broker_id,
                        held, written_end)
            return True
        if not step_down_candidates(term, positions, mode):
            break
        server.notify()
        gevent.sleep(0.05)
    log.warning("stepping down as master of broker %d: no slave that may be elected holds our whole log (%d)",
                broker_id, written_end)
    return False


def step_down_candidates(term, positions, mode):
    """The members a clean stop waits for: in ``sync`` mode the other members of the in-sync set (connected or
    not: one may be reconnecting), in ``async`` mode the slaves connected now."""
    if mode == "async":
        return set(positions)
    return term.members - {term.member}
