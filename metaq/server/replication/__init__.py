"""Master→slave replication: ``master.py`` serves slaves, ``slave.py`` follows a master, ``roles.py``
moves a broker between the two.

Master→slave replication over our own stream (``metaq.protocol.replication``; DESIGN §8).

Master: ``ReplicationServer`` listens on ``replication.port``; on each
connection the two sides first prove the replication secret to each other
when one is set (``handshake.py``: the slave first, then the master; a peer
that cannot is refused before a byte of the log moves either way), and the
slave sends HELLO (its own log end and epoch history); the master answers
EPOCHS (the position up to which the two logs agree, ``store.epochs.
agreed_position``, and its own history), then streams its commit log from
that position in DATA frames (``MessageStore.read_log``: up to the flushed end
in ``async`` mode, the written end in ``sync`` mode), HEARTBEATs its ends and
message count, sends its committed consumer offsets in OFFSETS frames (the whole
table once the slave has caught up or a sync interval into the link, then what
changed, at most every ``link.OFFSETS_SYNC_S``), and reads the slave's ACKs. In
``sync`` mode a put is acknowledged only once some slave's ACK covers the put's
log end (``wait_replicated``).

Slave: ``SlaveLink`` connects to ``replication.slave_of``, HELLOs, cuts its log
to the agreed position if it ends past it (logging what it cut: a tail its
master never had), takes the master's epoch history, appends every DATA with
``append_replicated`` at the same positions, records the master's later epochs
as its copy reaches them, flushes per its store's flush mode and ACKs; it makes its consumer-offset
table the master's (``ConsumerOffsets.replace``, then ``replicate`` for each
change) and saves it at its checkpoints like a master. Any
error or disconnection: it closes and reconnects with a backoff, always
resuming from its own end.

The cut runs on the event loop (with the store's background work, checkpoints
and segments built ahead, held off by the store lock), not in a thread: no read
may see the cut range while it goes, and it happens once per divergence (a
rejoining old master), costing one checkpoint fsync.
"""
