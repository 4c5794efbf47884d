"""A broker's replication role over its life: the role it starts in, promotion, rejoining a newer master.

**Starting.** The configured role (``replication.role`` / ``--slave-of``),
except that a data dir holding a ``promoted`` marker (written by a promotion)
starts as master whatever the configuration says (logged as a warning; delete
the file while the broker is stopped to make it follow its configuration
again). With ZooKeeper, a broker about to start as master first looks at
``ids/<id>/master``: when another live broker holds it and publishes, in
``ids/<id>/replication``, an epoch higher than ours, we were superseded (a
slave was promoted while we were down): we start as that master's slave
instead (``rejoin_if_superseded``). A master then begins a new epoch at its log
end (``begin_master_epoch``), except on the first start of a fresh data dir
(epoch 0 from position 0).

A slave whose latest epoch is one it led itself (an old master rejoining)
serves no read until its first epoch handshake has cut any tail its new master
never had (``broker.read_refusal``).

**Promotion** (``promote``; the text line ``promote <force 0|1> <opaque>``,
``metaq-admin promote``): refused unless this broker is a slave, its link to the
master is down (the master is gone), and it holds everything the master had
when last heard of (``SlaveLink.caught_up``); ``force`` skips the last two
checks and the reply says how far behind it may be. Then: stop the link, begin
a new epoch at our log end, persist the ``promoted`` marker, switch to master
(accept puts and transactions, serve slaves on ``replication.port`` if set),
register in ZooKeeper as master.
"""

import logging
import time

import gevent

from metaq import errors
from metaq.server.replication.master import ReplicationServer
from metaq.server.replication.slave import SlaveLink

log = logging.getLogger(__name__)

PROMOTED_MAGIC = b"MQPM"


def read_promoted(store):
    """The ``promoted`` marker of this data dir (a dict), or None."""
    return store.dirs.read_state(store.dirs.promoted, PROMOTED_MAGIC)


def startup_role(config, store):
    """``"master"`` or ``"slave"``: the configured role, unless a promotion marker overrides it."""
    role = config.replication.role
    promoted = read_promoted(store)
    if promoted is not None and role == "slave":
        log.warning("this broker was promoted to master (epoch %s, %s) and stays master: replication.slave_of=%s "
                    "in the configuration is ignored. To make it a slave again, stop it and delete %s",
                    promoted.get("epoch"), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(
                        promoted.get("promoted_ms", 0) / 1000.0)), config.replication.slave_of, store.dirs.promoted)
        return "master"
    return role


def handshake_refusal(broker):
    """Why reads are refused until the first handshake (a slave that led its latest epoch), or None."""
    epochs = broker.store.epochs
    if broker.slave_link is None or not epochs.led:
        return None
    return ("this broker led epoch %d and now rejoins %s as a slave: it serves no read until the epoch handshake "
            "with that master has cut any tail the master never had" % (epochs.epoch, broker.slave_link.master))


def begin_master_epoch(broker):
    """A master's start: a new epoch at the log end (not on a fresh data dir's first start)."""
    store, pool = broker.store, gevent.get_hub().threadpool
    if not store.epochs.found and store.written_position == 0:
        pool.apply(store.epochs.lead)
        return store.epochs.epoch
    return pool.apply(store.epochs.begin, (store.written_position,))


def rejoin_if_superseded(broker):
    """With ZooKeeper, before starting as master: become the slave of a newer live master, if there is one."""
    other = broker.registry.live_master()
    if other is None:
        return False
    store = broker.store
    ours = tuple(store.epochs.latest)
    theirs = (other.get("epoch", -1), other.get("epoch_start", -1))
    if theirs == ours:  # our own previous incarnation, killed before its session expired
        return False
    if not other.get("address") or theirs[0] <= ours[0]:
        log.warning("ZooKeeper shows %s as master of broker %d at epoch %s (ours: %d); not rejoining it (it is "
                    "not newer or has no replication address): both may take writes until one stops",
                    other.get("url"), broker.config.broker.id, theirs[0], ours[0])
        return False
    slave_id = broker.config.replication.slave_id
    if slave_id is None:
        slave_id = broker.registry.free_slave_id()
    log.warning("ZooKeeper shows %s (replication %s) as master of broker %d at epoch %d, newer than ours (%d): "
                "we were superseded while down; rejoining it as slave %d (the epoch handshake cuts any tail it "
                "never had)", other.get("url"), other["address"], broker.config.broker.id, theirs[0], ours[0],
                slave_id)
    if read_promoted(store) is not None:
        store.dirs.remove(store.dirs.promoted)
    broker.set_role("slave", SlaveLink(broker, other["address"], slave_id))
    return True


def _lag_text(link):
    if link.master_written is None:
        return "it has never heard from its master %s" % link.master
    return "%d bytes, %d messages behind the last known end of its master %s (%d)" % (
        link.lag_bytes, max(0, link.lag_messages), link.master, link.master_written)


def promote(broker, force):
    """Make this slave the master of its broker id; returns the reply text (raises MetaqError when refused)."""
    link = broker.slave_link
    if link is None:
        raise errors.ClientError("not a slave: broker %d is already a master; promote a slave instead"
                                 % broker.config.broker.id)
    if broker.promoting:
        raise errors.Unavailable("a promotion of this broker is already under way")
    if not force:
        if link.connected:
            raise errors.Unavailable("the link to the master %s is up (the master is alive); stop the "
                                     "master first, or use --force (two masters would then take writes)"
                                     % link.master)
        if not link.caught_up():
            raise errors.Unavailable("this slave is not caught up: %s; promoting it would lose those "
                                     "messages. Wait for the master to return, or use --force" % _lag_text(link))
    behind = None if link.caught_up() else _lag_text(link)
    broker.promoting = True
    try:
        return _promote(broker, link, behind)
    finally:
        broker.promoting = False


def _promote(broker, link, behind):
    store = broker.store
    link.stop()
    broker.flusher.wait_flushed(store.written_position)
    pool = gevent.get_hub().threadpool
    position = store.written_position
    epoch = pool.apply(store.epochs.begin, (position,))
    pool.apply(store.dirs.write_state, (store.dirs.promoted, PROMOTED_MAGIC, {
        "epoch": epoch, "position": position, "former_master": link.master, "promoted_ms": int(time.time() * 1000)}))
    broker.set_role("master", None)
    text = "promoted: broker %d is now the master, epoch %d from log position %d (former master %s)" % (
        broker.config.broker.id, epoch, position, link.master)
    if behind is not None:
        text += "; FORCED while %s: those messages are not here" % behind
    if broker.replication is not None:
        text += "; slaves may attach on replication port %d" % broker.replication.port
    if broker.registry is not None:
        text += "; registering in ZooKeeper as master"
    log.warning("%s", text)
    return text


def make_replication_server(broker):
    """The master's ReplicationServer when a replication port is configured, else None."""
    return ReplicationServer(broker) if broker.config.replication.port else None


def stats_values(broker):
    """The ``stats`` summary's replication pairs: role (slave; master with a replication port or after a
    promotion; none = standalone), epoch, then the link's or the replication server's own figures."""
    store = broker.store
    promoted = broker.role == "master" and read_promoted(store) is not None
    if broker.slave_link is not None:
        role, more = "slave", broker.slave_link.stats_values()
    elif broker.replication is not None:
        role, more = "master", broker.replication.stats_values()
    else:
        role, more = ("master" if promoted else "none"), []
    return [("replication_role", role), ("replication_epoch", store.epochs.epoch),
            ("replication_epoch_start", store.epochs.latest[1]), ("replication_promoted", promoted),
            ("replication_reads_refused", bool(broker.read_refusal))] + more
