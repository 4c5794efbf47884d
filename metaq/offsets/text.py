"""``commit_offset`` and ``query_offset`` on the text port: a consumer group's position in the broker's own
consumer-offset table (``offsets/table.py``, through ``MessageStore.commit_offset`` / ``query_offset``).

``commit_offset <group> <topic> <partition> <offset> <opaque>`` is answered 200 once the table holds it (it reaches
the disk at the next checkpoint). Only the master takes commits: any other broker (a slave, a member waiting for an
election, a master whose lease ran out) answers ``503 NOT_MASTER: ...`` naming the master when it knows it
(``PutPath.check_master``), and stores nothing: its table is the master's copy (the replication OFFSETS frames),
which would overwrite the commit anyway. ``query_offset <group> <topic> <partition> <opaque>`` is answered 200 with the
offset, 404 when the group committed none. A refusal (an offset outside the partition, the table full, an unknown
topic or partition) is raised and answered by the dispatcher's one error mapping. Both need the user to be a member
of the group (the commands' declarations, checked by the dispatcher first), and both tell the group-membership table
which connection speaks for the group.
"""

import time

from metaq.protocol.text import encode_result
from metaq.clock import now_ms

NO_WAIT = 0


class TextOffsets:
    """The two handlers over the store's consumer offsets."""

    def __init__(self, store, group_members=None, check_master=None):
        """``group_members``: told which connection commits or queries which group (``seen``), or None;
        ``check_master()``: raises NotMaster unless this broker is the master (``PutPath.check_master``)."""
        self.store = store
        self.group_members = group_members
        self.check_master = check_master

    def _member(self, e, conn):
        if self.group_members is not None:
            self.group_members.seen(e.group, getattr(conn, "conn_id", None), getattr(conn, "peer", ""),
                                    time.monotonic())

    def commit_offset(self, e, conn):
        self._member(e, conn)
        if self.check_master is not None:
            self.check_master()
        session = getattr(conn, "session", None)
        self.store.commit_offset(e.group, e.topic, e.partition, e.offset, now_ms(),
                                 session.user if session is not None else None)
        return encode_result(200, b"", e.opaque), NO_WAIT

    def query_offset(self, e, conn):
        self._member(e, conn)
        offset = self.store.query_offset(e.group, e.topic, e.partition)
        if offset is None:
            msg = "group %s has committed no offset for %s-%d" % (e.group, e.topic, e.partition)
            return encode_result(404, msg.encode(), e.opaque), NO_WAIT
        return encode_result(200, b"%d" % offset, e.opaque), NO_WAIT
