"""``put_prio`` and ``get_prio`` (consumer priorities, ``priorities/wire.py``; docs/messaging.md "Priorities").

``put_prio`` is a put with a priority: ``PutPath.append(priority=)`` stores it in its level's sub-queue
(``<topic>%P<k>``, level 0 the topic itself) and it is answered as a put is. ``get_prio`` carries the consumer's
offset of every level; one read (``PriorityRead.read``) looks at each level's end (no record read), and when
more than one level has a backlog, at the store time of each such level's head record (one record per level),
then ``choose_level`` picks the level and its records are served as a get's, after ``<level>\\n``. Nothing to
read: the get parks on the topic's partition like a ``get`` (an append to any level wakes it: the broker's
``on_visible`` adds the topic's key to a level's). A level's expect (the record it read last, ``PriorityGet``) is
checked at every read, before anything is read, as a get's is (text/expect.py): a 412 names the level.
"""

from metaq import errors
from metaq.priorities.wire import choose_level, encode_get_prio_prefix, level_topic
from metaq.protocol.text import encode_result, encode_value_header
from metaq.clock import now_ms
from metaq.loop.coldpages import bring_in_record_head
from metaq.serving.longpoll import PartitionWaiters
from metaq.loop.expect import check_held
from metaq.serving.putchecks import uncompressed, verified_checksum

NO_WAIT = 0


class TextPriorities:
    """The two handlers, over the store, the put path and the guard, answering as the dispatcher answers."""

    def __init__(self, store, stats, roles, put_path, guard, max_body, max_transfer, *, ack_put, get_refusal, park,
                 error_reply):
        """The dispatcher's answers: ``ack_put(e, r, now, reply, conn)`` a stored put's, ``get_refusal(e, conn)`` a
        get's refusal before it reads (None: it may read), ``park(e, conn, max_size, read, miss, watch, seen)`` a get
        parked (``watch``: the levels' partitions, whose appends end its wait; ``seen``: their ends before its read);
        ``error_reply(exc, opaque)``: its one error→reply mapping."""
        self.store = store
        self.stats = stats
        self.roles = roles
        self.put_path = put_path
        self.guard = guard
        self.max_body = max_body
        self.max_transfer = max_transfer
        self.ack_put = ack_put
        self.get_refusal = get_refusal
        self.park = park
        self.error_reply = error_reply

    def put_prio(self, e, conn):
        path = self.put_path
        try:
            path.check_write(e.topic, conn.session)
            e = uncompressed(e._replace(checksum=verified_checksum(e)), self.max_body)
        except errors.MetaqError as exc:
            path.failed(e.topic, exc)
            return self.error_reply(exc, e.opaque), NO_WAIT
        now = now_ms()
        try:
            r = path.append(e.topic, e.partition, e.flag, e.body, now, checksum=e.checksum, priority=e.priority)
        except errors.MetaqError as exc:
            return self.error_reply(exc, e.opaque), NO_WAIT
        return self.ack_put(e, r, now, encode_result(200, b"%d %d %d" % (r.msg_id, r.partition, r.offset),
                                                     e.opaque), conn)

    def get_prio(self, e, conn):
        refusal = self.get_refusal(e, conn)
        if refusal is not None:
            return refusal, NO_WAIT
        settings = self.store.topics.settings_of(e.topic)
        if settings is None or not settings.priorities:
            raise errors.ClientError("topic %s has no priorities: use get (get_prio reads a topic created or altered "
                                     "with --priorities)" % e.topic)
        if len(e.offsets) != settings.priorities:
            raise errors.ClientError("get_prio %s: give one offset per level, %d of them (o_0,...,o_%d); got %d"
                                     % (e.topic, settings.priorities, settings.priorities - 1, len(e.offsets)))
        max_size = min(e.max_size, self.max_transfer)
        read = PriorityRead(self.store, self.stats, self.roles, e, max_size, settings.max_wait_ms).read
        levels = [(level_topic(e.topic, k), e.partition) for k in range(settings.priorities)]
        seen = PartitionWaiters.ends(self.store.max_offset, levels)  # before the read: it may yield (cold heads)
        reply = conn.read_reply(max_size, read)
        if reply is not None:
            return reply, NO_WAIT
        if e.max_wait_ms and not conn.closed:
            return self.park(e, conn, max_size, read, lambda: self.miss(e), watch=levels, seen=seen), NO_WAIT
        self.stats.on_get(e.topic, True)
        return self.miss(e), NO_WAIT

    def miss(self, e):
        return encode_result(404, b"Could not find a message at any level from offsets %s"
                             % ",".join("%d" % o for o in e.offsets).encode(), e.opaque)


class PriorityRead:
    """One ``get_prio``'s read: the reply buffers, or None when no level has anything."""

    def __init__(self, store, stats, roles, e, max_size, max_wait_ms):
        self.store = store
        self.stats = stats
        self.roles = roles
        self.e = e
        self.max_size = max_size
        self.max_wait_ms = max_wait_ms

    def read(self):
        e, store = self.e, self.store
        for level, expect in enumerate(e.expects or ()):
            if expect is not None:
                try:
                    check_held(store, level_topic(e.topic, level), e.partition, expect)
                except errors.Diverged as exc:
                    return [encode_result(exc.code, b"%d %s" % (level, str(exc).encode("utf-8", "replace")), e.opaque)]
        backlog = []
        for level, offset in enumerate(e.offsets):
            name = level_topic(e.topic, level)
            low, high = store.min_offset(name, e.partition), store.max_offset(name, e.partition)
            if offset > high and self.roles.end_unknown:
                continue  # past our end on a slave behind its master: not here yet
            if not low <= offset <= high:
                to = low if offset < low else high
                return [encode_result(301, b"%d %d" % (level, to), e.opaque)]
            if offset < high:
                backlog.append(level)
        if not backlog:
            return None
        if len(backlog) == 1:
            level = backlog[0]
        else:
            heads = {k: self.head_ms(k) for k in backlog}
            level = choose_level({k: t for k, t in heads.items() if t is not None}, now_ms(), self.max_wait_ms)
            if level is None:
                return None
        r = store.read_joined(level_topic(e.topic, level), e.partition, e.offsets[level], self.max_size)
        if not r.count:
            return None
        self.stats.on_get(e.topic, False)
        prefix = encode_get_prio_prefix(level)
        return [encode_value_header(len(prefix) + r.nbytes, e.opaque), prefix] + list(r.views)

    def head_ms(self, level):
        """The store time of the head record of ``level`` (the next one the consumer reads), from its header alone:
        a head of 4 MiB costs what a small one does (it was read, checked and copied whole). Its index unit and
        header are brought in off the loop first when cold."""
        topic, partition, offset = level_topic(self.e.topic, level), self.e.partition, self.e.offsets[level]
        bring_in_record_head(self.store, topic, partition, offset)
        return self.store.msg_id_at(topic, partition, offset, stored_at=True)
