"""The port's fan-out readers (docs/mqtt.md "Subscribing"): a delivery caught up on a partition, whose subscriptions
of that topic are granted QoS 0, hands the partition to the port's one reader of it (``Fanout``, one greenlet per
partition read this way). It reads each record once, decodes it and encodes its PUBLISH once (``Decoded``) and
writes it to every delivery handed to it, each member's own decision taken per record (``fanplan.FanMember.plan``).
What one read brings goes to each member in one write, and the members that get the same PUBLISHes are written by
one call of the C helper (``send_each``, by descriptor). It never waits for one: a member whose socket does not take
them all at once, whose record needs QoS 1 or 2, or that lost its permission, reads on alone from its own cursor.
"""

import _socket
import time

import gevent
from gevent.event import Event

from metaq import errors, limits, speedups
from metaq.mqtt import limits as mqtt_limits
from metaq.serving.connections import share_loop


#: Packets one ``send_each`` writes at most (Linux's IOV_MAX).
_SEND_IOV_MAX = 1024


def send_each_py(packets, fds):
    """``packets`` (bytes-like, at most ``_SEND_IOV_MAX``) written in order by one non-blocking ``sendmsg`` to each
    file descriptor of ``fds``, none waited for: ``[(i, n)]`` for each ``fds[i]`` that did not take all of them,
    ``n`` the bytes it took (0: its buffer was full) or ``-errno`` (the send failed). The C helper's twin."""
    if len(packets) > _SEND_IOV_MAX:
        raise ValueError("send_each: %d packets, at most %d" % (len(packets), _SEND_IOV_MAX))
    total = sum(memoryview(p).nbytes for p in packets)
    short = []
    for i, fd in enumerate(fds):
        if fd < 0:
            raise ValueError("send_each: bad file descriptor %d" % fd)
        try:
            s = _socket.socket(fileno=fd)  # no duplicate: the descriptor is let go (detach) after the send
        except OSError as exc:
            n = -exc.errno  # not an open socket: the C helper's sendmsg fails alike
        else:
            try:
                n = s.sendmsg(packets, [], _socket.MSG_DONTWAIT | _socket.MSG_NOSIGNAL)
            except BlockingIOError:
                n = 0
            except OSError as exc:
                n = -exc.errno
            finally:
                s.detach()
        if n != total:
            short.append((i, n))
    return short


send_each = speedups.load("send_each", send_each_py)  # the C twin when built: the GIL released, one call for all


class Fanouts:
    """The port's fan-out readers (``Fanout``), one per partition some caught-up delivery handed over."""

    __slots__ = ("store", "waiters", "decoded", "max_transfer", "readers")

    def __init__(self, store, waiters, decoded, max_transfer):
        self.store, self.waiters, self.decoded, self.max_transfer = store, waiters, decoded, max_transfer
        self.readers = {}  # (metaq topic, partition) -> Fanout

    def join(self, key, member, offset):
        """Hand partition ``key`` to its reader from ``offset`` (the delivery's cursor; ``member``: its
        ``fanplan.FanMember``): the reader, or None when one reads it from another offset (the delivery reads it alone
        and tries again once caught up)."""
        f = self.readers.get(key)
        if f is None:
            f = self.readers[key] = Fanout(self, key, offset)
            f.members.add(member)
            f.greenlet = gevent.spawn(f.run)
            return f
        if f.offset != offset or f.ended:
            return None
        f.members.add(member)
        return f


class _Batch:
    """A fan-out reader's records of one read, as every member's ``FanMember.plan`` reads them: ``items``
    (``(queue offset, key in Decoded, MqttMessage)`` each, in order), ``end`` (the offset after the last), the kinds
    of message ``Outbound.decision`` tells apart (``kinds``: the first message of each; ``kind_of``: each item's),
    whether one has an expiry, and the plans decided for members alike (``plans``)."""

    __slots__ = ("items", "first", "end", "kinds", "kind_of", "expiring", "plans")

    def __init__(self, records, topic, decoded):
        self.items, self.kinds, self.kind_of, self.expiring, self.plans = [], [], [], False, {}
        seen = {}  # what Outbound.decision reads of a message -> its kind
        for rec in records:
            dkey = (rec.position, rec.msg_id)
            m = decoded.message(dkey, topic, rec.flag, rec.data)
            self.items.append((rec.queue_offset, dkey, m))
            what = (m.topic, m.client_id, m.retain)
            kind = seen.get(what)
            if kind is None:
                kind = seen[what] = len(self.kinds)
                self.kinds.append(m)
            self.kind_of.append(kind)
            if m.expires_ms is not None:
                self.expiring = True
        self.first = records[0].queue_offset
        self.end = records[-1].queue_offset + 1


class Fanout:
    """One reader of partition ``key`` for the deliveries handed to it (see the module doc): ``offset`` is the next
    record it writes to them; it ends when it has none left, and lets every one go when the partition cannot be read
    as it was (moved, a damaged record, the topic deleted, its partitions changed: each member's own read decides)."""

    __slots__ = ("fanouts", "key", "offset", "members", "greenlet", "ended", "_wake", "_partitions")

    def __init__(self, fanouts, key, offset):
        self.fanouts, self.key, self.offset = fanouts, key, offset
        self.members = set()  # fanplan.FanMember
        self.greenlet = None
        self.ended = False
        self._wake = Event()
        self._partitions = None

    def run(self):
        f, (topic, partition) = self.fanouts, self.key
        store, decoded = f.store, f.decoded
        try:
            try:
                self._partitions = store.partitions_of(topic)
            except errors.MetaqError:
                return
            turn = time.monotonic()
            while self.members and not f.waiters.closed:
                try:
                    if store.partitions_of(topic) != self._partitions:
                        return  # a literal filter's partition may have moved: each member rescans alone
                    records, _next = store.read_records(topic, partition, self.offset, mqtt_limits.MQTT_DELIVERY_BATCH,
                                                        f.max_transfer)
                except errors.MetaqError:
                    return
                if not records:
                    self._wake.clear()
                    f.waiters.wait_any((self.key,), mqtt_limits.MQTT_TOPIC_RESCAN_S, self._wake)
                    turn = time.monotonic()
                    continue
                batch = _Batch(records, topic, decoded)
                self.offset = batch.end  # a delivery that joins meanwhile has read these itself
                turn = self._write(batch, turn)
        finally:
            self.ended = True
            if f.readers.get(self.key) is self:
                del f.readers[self.key]
            members, self.members = self.members, set()
            for m in members:
                m.left(self.key)

    def _write(self, batch, turn):
        """Write the records of ``batch`` (a ``_Batch``) to every member, each one's PUBLISHes decided by its delivery
        (``FanMember.plan``) and written by one non-blocking call for all the members that get the same ones
        (``send_each``: one ``sendmsg`` of them all per socket, by descriptor; a connection that cannot be written so
        now goes through ``try_send``); a member whose socket did not take all of them reads on alone
        (``FanMember.wrote``). Members are decided and written in rounds, the loop shared between rounds
        (``share_loop``), never between a member's decision and its write. Returns when this turn started."""
        key = self.key
        members = self.members
        same = {}  # the PUBLISHes, in order -> [(FanMember, plan)]
        budget = limits.MAX_TURN_MS / 1000.0
        for d in list(members):
            if d not in members:
                continue
            plan = d.plan(key, batch)
            if plan is None:
                self.leave(d)
            elif not plan[0]:
                if not d.wrote(key, plan):
                    self.leave(d)
            else:
                same.setdefault(plan[0], []).append((d, plan))
            if time.monotonic() - turn >= budget:
                self._send(same)
                same = {}
                turn = share_loop(turn)
        self._send(same)
        return turn

    def _send(self, same):
        """Write each run of PUBLISHes of ``same`` (see ``_write``) to its members, decided with no yield since."""
        key = self.key
        for packets, planned in same.items():
            direct, fds = [], []
            for d, plan in planned:
                fd = d.conn.fan_fd()
                if fd is None:
                    if not d.try_write(key, plan):
                        self.leave(d)
                else:
                    direct.append((d, plan))
                    fds.append(fd)
            if not fds:
                continue
            short = dict(send_each(packets, fds))
            for i, (d, plan) in enumerate(direct):
                if not d.wrote(key, plan, short.get(i)):
                    self.leave(d)

    def leave(self, member):
        """``member``'s delivery reads this partition alone from now on, from its cursor."""
        self.members.discard(member)
        member.left(self.key)

