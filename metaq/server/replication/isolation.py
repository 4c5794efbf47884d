"""When an ``async`` master must stop acknowledging because it may be cut off (``replication.max_isolation_ms``).

An ``async`` master acknowledges a put before any slave has it. If it is cut off from its slaves and from
ZooKeeper (not from its clients), another member may be elected (``ha: auto``) or promoted (``ha: manual``)
meanwhile, and everything it acknowledged after its last contact is lost when it rejoins as a slave. The lease
(``leadership.Lease``) already bounds that window by ``lease_ms`` (half the session timeout: 15 s by default);
this bounds it by ``max_isolation_ms``: the master acknowledges only while a slave's ACK **or** ZooKeeper's
confirmation of its leadership is younger than the bound (as Redis's ``min-replicas-max-lag``).

The contacts, on a monotonic clock: the latest ACK of any slave on the replication port (``ReplicationServer.
heard_at``: slaves ACK every DATA and HEARTBEAT, and the master heartbeats at least every quarter of the bound),
and the sending time of the last request that found our ``leader`` node ours (``Lease.confirmed_at``, ha: auto;
renewed at least every quarter of the bound). A channel that has never spoken in this term does not count: a
``manual`` master whose slaves have not connected yet takes writes as before (there is no copy to be promoted
ahead of it); an ``auto`` master has ZooKeeper's word from its election on. ``sync`` mode needs no bound: a put
is acknowledged only once the in-sync slaves hold it.

Pure: times are passed in.
"""


def refusal(bound_s, now, slave_heard_at, zk_heard_at):
    """Why an ``async`` master may not acknowledge now, or None.

    ``bound_s``: the bound in seconds (0 or None: off); ``now``: the monotonic time; ``slave_heard_at``: the
    latest slave ACK (None: none this term); ``zk_heard_at``: ZooKeeper's latest confirmation of our leadership
    (None: ha: manual, or none). None while either contact is younger than the bound, or neither has ever spoken.
    """
    if not bound_s:
        return None
    heard = [t for t in (slave_heard_at, zk_heard_at) if t is not None]
    if not heard or now - max(heard) <= bound_s:
        return None
    parts = []
    if slave_heard_at is not None:
        parts.append("from no slave for %.1f s" % (now - slave_heard_at))
    else:
        parts.append("from no slave")
    if zk_heard_at is not None:
        parts.append("from ZooKeeper for %.1f s" % (now - zk_heard_at))
    return ("ISOLATED: this async master has heard %s (replication.max_isolation_ms: %d): it may be cut off while "
            "another member takes over, so it acknowledges no write until a slave or ZooKeeper answers; nothing was "
            "stored" % (" and ".join(parts), round(bound_s * 1000)))
