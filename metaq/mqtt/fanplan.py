"""A delivery's part in the port's fan-out readers (``fanout.Fanout``; docs/mqtt.md "Subscribing"): which partitions
it hands over once caught up (``FanMember.hand_over``), what it gets of each batch a reader read (``FanMember.plan``,
decided as its greenlet decides: ``outbound.Outbound``), and where its cursor stands after the reader wrote it
(``FanMember.wrote``, ``FanMember.try_write``), each topic alias decision undone for a PUBLISH not written.
"""

from metaq import errors
from metaq.mqtt.outbound import DROPPED


class FanMember:
    """The fan-out side of one delivery: ``out`` (its ``Outbound``), the port's ``fanouts``, ``wake`` (called when a
    reader lets a partition go: the delivery's greenlet reads it alone from its cursor). ``handed``: ``{(topic,
    partition): Fanout}`` of the partitions handed over now, None when none is."""

    __slots__ = ("out", "conn", "fanouts", "wake", "handed")

    def __init__(self, out, fanouts, wake):
        self.out = out
        self.conn = out.conn
        self.fanouts = fanouts
        self.wake = wake
        self.handed = None

    def hand_over(self):
        """Hand every partition it is caught up on (its cursor at the log's end there), whose subscriptions are
        granted QoS 0, to the port's fan-out reader of it (a TLS connection keeps its own: only ``send_bytes``
        writes it)."""
        out = self.out
        conn, session = self.conn, out.session
        if conn.tls or out.guard.paced(conn.session, "fetch"):  # a paced user reads alone, at its rate
            return
        max_offset = out.store.max_offset
        handed = self.handed
        for key, offset in session.cursors.items():
            if handed is not None and key in handed:
                continue
            if any(sub.qos and key[0] in sub.topics for sub in session.subscriptions.values()):
                continue
            try:
                if offset != max_offset(*key):
                    continue
            except errors.MetaqError:
                continue
            f = self.fanouts.join(key, self, offset)
            if f is not None:
                if handed is None:
                    handed = self.handed = {}
                handed[key] = f

    def leave_all(self):
        """Take every partition back from the fan-out readers (its cursors are where they left them)."""
        handed, self.handed = self.handed, None
        for f in (handed or {}).values():
            f.members.discard(self)

    def end(self):
        """The delivery stopped: it leaves every reader, and its ``wake`` (the delivery's, which keeps this member: a
        cycle) becomes a no-op, as a wake of a closed connection's delivery was: a reader in the middle of a pass
        that still says ``left`` wakes nothing."""
        self.leave_all()
        self.wake = _nothing

    def left(self, key):
        """A fan-out reader let partition ``key`` go: this delivery reads it alone from its cursor."""
        if self.handed is not None:
            self.handed.pop(key, None)
        self.wake()

    def plan(self, key, batch):
        """What this delivery gets of a fan-out reader's records (``batch``, a ``fanout._Batch``) of partition
        ``key``, each decided as its greenlet decides it (the permission, ``Outbound.decision``,
        ``Outbound.prepare``): ``(packets, offsets, end, stop, marks)``, the PUBLISHes to write in order, the queue
        offset of each, its cursor once they are written, True when it reads on alone from ``end`` then (a record
        needs QoS 1 or 2: its greenlet's), and with topic aliases the alias table's mark before each PUBLISH (None
        without); None when it reads on alone from its cursor now (closed, its permission gone). Members whose
        decisions, MQTT version and Maximum Packet Size are alike (no Subscription Identifier, no expiry, no topic
        aliases of their own) share one plan. Nothing here yields: the reader writes them before it does
        (``wrote``, ``try_write``), and what was not written has its topic alias decisions undone there."""
        out, conn = self.out, self.conn
        offset = out.session.cursors.get(key)
        if offset is None or conn.closed:
            return None
        topic = key[0]
        if not out.may_read(topic) or out.guard.paced(conn.session, "fetch"):
            return None  # its permission gone, or a rate set since it joined: it reads alone
        decision = out.decision
        decisions = [decision(topic, m) for m in batch.kinds]
        alike = None
        aliases = conn.outbound_aliases  # its own topic aliases: its plan is its own, each PUBLISH's alias decided
        if aliases is None and offset <= batch.first and not batch.expiring and \
                not any(ids for _granted, ids, _retain in decisions):
            alike = (tuple((granted, retain) for granted, _ids, retain in decisions), conn.version,
                     conn.client_max_packet)
            plan = batch.plans.get(alike)
            if plan is not None:
                return plan
        plan = self._decide(batch, decisions, offset, aliases)
        if alike is not None:
            batch.plans[alike] = plan
        return plan

    def _decide(self, batch, decisions, offset, aliases):
        """``plan``'s plan of ``batch`` from the cursor ``offset``, each kind of message decided (``decisions``) and
        each PUBLISH's topic alias by ``aliases`` (None: none)."""
        out = self.out
        prepare, with_alias = out.prepare, out.with_alias
        marks = None if aliases is None else []  # the table's mark before each PUBLISH's decision (wrote)
        packets, offsets = [], []
        end, stop = max(offset, batch.end), False
        for (queue_offset, dkey, m), kind in zip(batch.items, batch.kind_of, strict=True):  # one kind per item
            if queue_offset < offset:
                continue  # it sent this one itself before it joined
            granted, ids, retain = decisions[kind]
            if granted is None:
                continue
            if min(granted, m.qos):
                end, stop = queue_offset, True
                break
            prepared = prepare(m, granted, retain, ids, dkey, False)
            if prepared is not DROPPED:
                data = prepared[0]
                if aliases is not None:
                    marks.append(aliases.mark())
                    data = with_alias(aliases, data, m.topic, prepared[3])
                packets.append(data)
                offsets.append(queue_offset)
        return tuple(packets), tuple(offsets), end, stop, marks

    def wrote(self, key, plan, took=None):
        """``plan``'s PUBLISHes of partition ``key`` were written by descriptor (``Connection.fan_fd``, no yield
        since): ``took`` None when the socket took all of it, else the bytes it took (0 when full) or ``-errno``
        when the write failed (the connection closes). Its cursor moves past every record written, and past the one
        begun (the connection keeps the rest of its PUBLISH, written before anything else); True while it stays with
        the reader, False when it reads on alone from there."""
        packets, offsets, end, stop, marks = plan
        if took is not None:
            if took < 0:
                self.conn.send_failed(-took)
                took = 0
            for i, (data, queue_offset) in enumerate(zip(packets, offsets, strict=True)):  # one offset per PUBLISH
                if took < len(data):
                    if took:
                        self.conn.keep_unsent(data[took:])
                        end = queue_offset + 1
                        i += 1  # begun: the rest is written before anything else
                    else:
                        end = queue_offset
                    self._unwritten(marks, i)
                    break
                took -= len(data)
            stop = True
        self._unwritten(marks, len(packets))
        self.out.cursor_to(key, end)
        return not stop

    def _unwritten(self, marks, i):
        """A plan's PUBLISHes from the ``i``-th on were not written: their topic alias decisions are undone (``marks``,
        ``plan``'s; None: no topic aliases), the others' kept."""
        if marks is not None:
            aliases = self.conn.outbound_aliases
            if i < len(marks):
                aliases.undo(marks[i])
            aliases.settle()

    def try_write(self, key, plan):
        """``wrote``'s work for a connection that cannot be written by descriptor now (another writer holds it,
        part of a packet is left, it closed): each PUBLISH through ``try_send``, which never waits."""
        packets, offsets, end, stop, marks = plan
        conn = self.conn
        for i, (data, queue_offset) in enumerate(zip(packets, offsets, strict=True)):  # one offset per PUBLISH
            sent = conn.try_send(data)
            if not sent or sent < len(data):  # a part taken: the connection writes the rest before anything else
                self._unwritten(marks, i + 1 if sent else i)
                self.out.cursor_to(key, queue_offset + 1 if sent else queue_offset)
                return False
        self._unwritten(marks, len(packets))
        self.out.cursor_to(key, end)
        return not stop


def _nothing():
    """The wake of a member whose delivery stopped (``FanMember.end``)."""
