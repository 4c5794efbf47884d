"""A get's ``expect`` (events.Get): the client names the record it read last and its id; a broker whose record at
that offset has another id answers 412 (``errors.Diverged``) instead of reading on, so that a consumer that read a
log a failover later cut or rewrote goes back to the last record both logs hold (client/divergence.py) rather than
skip the messages written at those offsets since (docs/replication.md, "Read failover")."""

from metaq import errors
from metaq.loop.coldpages import bring_in_record_head


def check_expected(store, e):
    """Raise Diverged when a get's ``expect`` (events.Get) names a record held here with another id; an offset
    not held (below the minimum, past the end: a slave still behind) is not checked, and is again at each read
    of a long poll."""
    if e.expect is not None:
        check_held(store, e.topic, e.partition, e.expect)


def check_held(store, topic, partition, expect):
    """Raise Diverged when this broker holds ``expect``'s offset (``(offset, msg_id)``) of ``topic``-``partition``
    with another id (``check_expected``; a ``get_prio`` checks one per level, priorities/text.py). The record's
    index unit and header are brought in off the loop first when cold (any offset the broker holds may be named:
    a client could otherwise make the loop wait on the disk, per level of a ``get_prio``)."""
    offset, msg_id = expect
    bring_in_record_head(store, topic, partition, offset)
    held = store.msg_id_at(topic, partition, offset)
    if held is not None and held != msg_id:
        raise errors.Diverged("diverged: %s-%d offset %d holds message %d here, not %d as read before (this log "
                              "differs there from the one read: a failover); read on from the last record both "
                              "hold" % (topic, partition, offset, held, msg_id))

