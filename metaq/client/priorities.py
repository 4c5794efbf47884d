"""A priority topic's partition fetcher (docs/messaging.md "Priorities"): one offset per level, ``get_prio`` requests.

``consumer.subscribe(topic, handler, priorities=L)`` says the topic has L levels (the broker answers a wrong
count 400, logged and retried slowly: fix the subscription). The fetcher keeps the next offset of every level
and asks ``get_prio`` with all of them; the broker answers with the records of the one level it chose (the
highest with a backlog, unless a lower level's head waited past the topic's ``priority_max_wait_ms``), and the
fetcher delivers them in order, moving that level's offset. Level k's offset is kept in the consumer's offset
store under the level's internal topic ``<topic>%P<k>`` (level 0 under the topic itself), so commits, ZooKeeper
or broker-kept offsets, ``metaq-admin reset-offsets`` and a restart work per level unchanged. Delivered
messages carry their level in ``message.priority``.

Each level remembers the records it read (``divergence.Checkpoints``) and every ``get_prio`` names the last one of
each (its expects, as a plain get's ``expect``): a broker holding another record there (a failover rewrote that
level's log) answers 412 naming the level, and the fetcher takes that level back to the last record both logs hold
(``PartitionFetcher._go_back``), as it does after a 301 below what the level read. A broker older than the expects
answers 400: the fetcher says so once and asks without them.

``lag()`` counts every level. Not supported for a priority subscription: a broker-side tag filter (a callable or
attribute filter still
runs here, on every message), ``seek`` (ClientError) and a ``start_from`` time (ClientError at ``subscribe``:
each level starts at its stored offset, else at ``start_from``'s earliest or latest).
"""

import logging

from metaq import errors
from metaq.priorities import limits as priorities_limits
from metaq.client.divergence import Checkpoints
from metaq.client.fetcher import LONG_POLL_MARGIN_S, PartitionFetcher, records_of
from metaq.client.message import Message
from metaq.client.replies import reply_error
from metaq.protocol import events as ev
from metaq.protocol.message import iter_records
from metaq.priorities.wire import PriorityGet, decode_get_prio_body, level_topic

log = logging.getLogger(__name__)

__all__ = ["PriorityFetcher", "check_levels"]


def check_levels(priorities, replay=None):
    """``subscribe``'s ``priorities``: 0 (none) or 2..MAX_PRIORITY_LEVELS; ClientError otherwise, and with a
    ``start_from`` time (``replay``: the consumer's ReplayStart, or None)."""
    if priorities in (0, None):
        return 0
    if replay is not None:
        raise errors.ClientError("a priority subscription cannot start_from a time: its levels start at their stored "
                                 "offsets, else at earliest or latest")
    if not isinstance(priorities, int) or isinstance(priorities, bool) or not (
            2 <= priorities <= priorities_limits.MAX_PRIORITY_LEVELS):
        raise errors.ClientError("priorities must be 0 (none) or 2..%d levels, got %r"
                                 % (priorities_limits.MAX_PRIORITY_LEVELS, priorities))
    return priorities


class PriorityFetcher(PartitionFetcher):
    def __init__(self, consumer, sub, partition):
        super().__init__(consumer, sub, partition)
        self.levels = sub.priorities
        self.offsets = None  # the next offset of each level, once loaded
        self.committed_levels = [None] * self.levels  # each level's offset last committed (or loaded)
        self.msg_ids = [-1] * self.levels
        self.reads = [Checkpoints() for _ in range(self.levels)]  # each level's records read (a get's expect)

    @property
    def progress(self):
        return None if self.offsets is None else tuple(self.offsets)

    def positions(self, key):
        if self.offsets is None:
            return {}
        topic, part = key
        return {(level_topic(topic, k), part): (self.offsets[k], self.msg_ids[k]) for k in range(self.levels)}

    def resolve(self):
        if self.offsets is not None:
            return
        offsets = []
        for k in range(self.levels):
            name = level_topic(self.topic, k)
            offset, committed = self.consumer.initial_offset(name, self.partition)
            offsets.append(offset)
            self.committed_levels[k] = committed
            stored = self.consumer.stored_entry(name, self.partition) if committed is not None else None
            stored_id = stored[1] if stored is not None and stored[0] == offset else -1
            kept = self.consumer.reads_kept.take((name, self.partition), offset, stored_id)
            if kept is not None:  # this consumer read the level up to here before a rebalance
                self.reads[k] = kept
            elif stored_id > 0 and offset > 0:
                self.reads[k].add(offset - 1, stored_id)  # the id committed with the offset: its record's
            if stored_id > 0:
                self.msg_ids[k] = stored_id
        self.committed = self.committed_levels[0]
        self.offsets = offsets
        self.offset, self.msg_id = offsets[0], self.msg_ids[0]  # level 0's: the position of the topic itself

    def handover(self):
        """Each level's ``(offset store key, offset, msg_id, Checkpoints)``, as ``PartitionFetcher.handover``."""
        if self.offsets is None or self._thread.is_alive() or not self._stop.is_set():
            return []
        return [((level_topic(self.topic, k), self.partition), self.offsets[k], self.msg_ids[k], self.reads[k])
                for k in range(self.levels)]

    def committed_at(self, key, positions):
        topic, part = key
        for k in range(self.levels):
            entry = positions.get((level_topic(topic, k), part))
            if entry is not None:
                self.committed_levels[k] = entry[0]
        self.committed = self.committed_levels[0]

    def lag(self, key, table):
        """The sum over the levels (each stored as its own topic ``<topic>%P<k>``) of max offset less committed."""
        topic, part = key
        total = 0
        for k in range(self.levels):
            low, high = table.get((level_topic(topic, k), part.partition), (0, 0))
            mine = self.offsets[k] if self.offsets is not None else None
            total += high - next((v for v in (self.committed_levels[k], mine) if v is not None), low)
        return total

    def seek(self, offset):
        raise errors.ClientError("seek is not supported for a priority topic (%s): its levels have offsets of their "
                                 "own; reset them with metaq-admin reset-offsets on <topic>%%P<level>" % self.topic)

    def _fetch(self):
        """One long-polling ``get_prio``: ``(level, [(offset, record)])``, or None when stopped while waiting."""
        consumer = self.consumer
        conn = consumer.connection(self.partition.broker_id, read=True)
        wait_ms = consumer.long_poll_ms
        timeout = wait_ms / 1000.0 + LONG_POLL_MARGIN_S
        self._wake.clear()
        expects = None if self._no_expect else tuple(read.last() for read in self.reads)
        if expects is not None and not any(expects):
            expects = None  # nothing read yet: the line an older broker knows
        request = PriorityGet(self.topic, consumer.group, self.partition.partition, tuple(self.offsets),
                              consumer.max_size, 0, wait_ms or None, expects)
        future = conn.request(request, timeout=timeout)
        future.add_done_callback(lambda _f: self._wake.set())
        while not future.done() and not self._stop.is_set():
            self._wake.wait(timeout + 1.0)
            self._wake.clear()
            if not future.done() and not self._stop.is_set():
                raise errors.RequestTimeout("no reply to a get_prio from %s" % conn.url)
        if self._stop.is_set():
            return None
        reply = future.result(0)
        what = "get_prio %s %s %s" % (self.topic, self.partition, ",".join(map(str, self.offsets)))
        if isinstance(reply, ev.Value):
            level, body = decode_get_prio_body(reply.body)
            if not 0 <= level < self.levels:
                raise errors.RemoteProtocolError("%s: the broker answered level %d" % (what, level))
            start = self.offsets[level]
            return level, [(start + i, rec) for i, (rec, _end) in enumerate(iter_records(body))]
        if reply.code == 301:
            level, to = self._level_of(reply, what, int)
            if to < self.offsets[level] and consumer.is_slave_read(self.partition.broker_id, conn.url):
                self._wait_for_slave(conn.url, self.offsets[level], to)  # as a plain fetcher (fetcher.py)
                return 0, []
            if to < self.offsets[level] and self.reads[level].last() is not None and not self._no_expect:
                log.warning("%s: level %d's offset %d is past its partition's end %d: checking the records read "
                            "below it", what, level, self.offsets[level], to)
                self._differs = (_at_level(errors.Moved(to, "%s: level %d ends at %d" % (what, level, to)), level),
                                 to)  # the position stays until the probes decide (_settle)
                return 0, []
            log.warning("%s: level %d's offset %d is outside its partition; continuing at %d", what, level,
                        self.offsets[level], to)
            self._move(level, to, -1)
            self.reads[level].cut(to)
            return 0, []
        if reply.code == 404:
            return 0, []
        if reply.code == 412:
            level, why = self._level_of(reply, what, lambda text: text)
            raise _at_level(errors.Diverged("%s: level %d %s" % (what, level, why)), level)
        if expects is not None and reply.code == 400 and reply.body.startswith(b"get_prio needs 7 or 8 tokens"):
            log.warning("%s %s: the broker at %s does not check a get_prio's last records (no expects: it is older): "
                        "a failover that rewrites what was read goes unnoticed there", self.topic, self.partition,
                        conn.url)
            self._no_expect = True  # "get_prio needs 7 or 8 tokens": asked again without them
            return 0, []
        try:
            records_of(reply, what)  # raises the mapped error
        except errors.CorruptRecord as exc:  # a level stops there (retried with backoff): not skipped here
            raise errors.BrokerError("%s: %s (a priority level is not skipped past a corrupt record)"
                                     % (what, exc)) from exc
        raise reply_error(reply, what)

    def _level_of(self, reply, what, rest):
        """``(level, rest(the body after it))`` of a 301 or 412 reply (``<level> <...>``)."""
        head, _sep, tail = bytes(reply.body).decode("utf-8", "replace").partition(" ")
        level = int(head) if head.isascii() and head.isdigit() else -1
        if not 0 <= level < self.levels:
            raise errors.RemoteProtocolError("%s: result %d %r names no level of %d" % (what, reply.code,
                                                                                      bytes(reply.body[:64]),
                                                                                      self.levels))
        try:
            return level, rest(tail)
        except ValueError:
            raise errors.RemoteProtocolError("%s: result %d %r: not <level> <offset>" % (
                what, reply.code, bytes(reply.body[:64]))) from None

    def _move(self, level, offset, msg_id):
        self.offsets[level], self.msg_ids[level] = offset, msg_id
        if level == 0:
            self.offset, self.msg_id = offset, msg_id

    def _settle(self):
        """A level's 412, or its 301 below what it read (``_differs``, the error naming the level): that level goes
        back to the last record both logs hold (``_go_back``); the other levels stay."""
        exc, end = self._differs
        level = getattr(exc, "level", 0)  # every error of a level is marked (_at_level); the topic's own if not
        back = self._go_back(level_topic(self.topic, level), self.reads[level], self.offsets[level], exc, end)
        if back is not None:
            self._move(level, *back)
            self._differs = None

    def _deliver(self, level, records):
        for offset, record in records:
            if self._interrupt.is_set():
                return
            try:
                message = Message.from_record(self.topic, self.partition, offset, record)
                message.priority = level
                done = self.consumer.process(self.sub, message, self._interrupt)
            except errors.RemoteProtocolError as exc:
                log.error("%s %s level %d offset %d: %s; parking the raw message", self.topic, self.partition,
                          level, offset, exc)
                message = Message(self.topic, record.data)
                message.id, message.partition, message.offset = record.msg_id, self.partition, offset
                done = self.consumer.parking.park(message, self._interrupt)
            if not done:
                return
            self._move(level, offset + 1, record.msg_id)
            self.reads[level].add(offset, record.msg_id)


def _at_level(exc, level):
    """``exc``, marked with the priority level it concerns (``PriorityFetcher._settle`` reads it)."""
    exc.level = level
    return exc
