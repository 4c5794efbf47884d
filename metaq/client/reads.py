"""What a consumer reads on demand, without :meth:`Consumer.start`: ``fetch`` (a pull), ``offset_at`` (a time's
offset) and ``lookup`` (the messages of a key, README "Key index"). A mixin of ``Consumer``: it uses the
consumer's connections (``connection``), partitions (``_partitions_of``), group and settings."""

import logging

from metaq import errors
from metaq.limits import MAX_WAIT_MS, validate_topic
from metaq.protocol import events as ev
from metaq.client import keys, replay
from metaq.client.fetcher import LONG_POLL_MARGIN_S, log_skipped, records_of
from metaq.client.message import Message, Partition
from metaq.client.subscription import as_partition

__all__ = ["ConsumerReads"]

log = logging.getLogger(__name__)

#: 301 replies one ``fetch`` follows before it gives up.
MAX_MOVES = 3


class ConsumerReads:
    def fetch(self, topic, partition, offset, max_size=None, max_wait_ms=0):
        """Pull: the messages of ``partition`` (a Partition or ``"b-p"``) from ``offset`` on, ``[]`` if none.

        Works without :meth:`start`. A 301 reply (offset outside the partition) is followed to the
        offset the broker names (logged). ``max_wait_ms`` > 0 makes the broker wait that long for a
        message. Messages carry ``offset``, ``id``, ``partition`` and ``attribute``.
        """
        topic = validate_topic(topic)
        part = as_partition(partition)
        if not 0 <= max_wait_ms <= MAX_WAIT_MS:
            raise ValueError("max_wait_ms must be 0..%d" % MAX_WAIT_MS)
        max_size = max_size or self.max_size
        moves = 0
        while moves <= MAX_MOVES:
            conn = self.connection(part.broker_id, read=True)
            request = ev.Get(topic, self.group, part.partition, offset, max_size, 0, max_wait_ms or None)
            reply = conn.call(request, timeout=max_wait_ms / 1000.0 + LONG_POLL_MARGIN_S)
            try:
                records = records_of(reply, "get %s %s %d" % (topic, part, offset))
            except errors.Moved as exc:
                log.info("fetch %s %s: offset %d is outside the partition; following to %d",
                         topic, part, offset, exc.offset)
                offset = exc.offset
                moves += 1
                continue
            except errors.CorruptRecord as exc:
                if not self.skip_corrupt or exc.next_offset <= offset:
                    raise
                log_skipped(exc)
                offset = exc.next_offset
                continue
            return [Message.from_record(topic, part, offset + i, rec) for i, rec in enumerate(records)]
        raise errors.Moved(offset, "fetch %s %s: moved more than %d times" % (topic, part, MAX_MOVES))

    def offset_at(self, topic, partition, when):
        """The first offset of ``partition`` (a Partition or ``"b-p"``) of ``topic`` the broker stored at or after
        ``when`` (a datetime or ms since the Unix epoch; a naive datetime is local time); the partition's end
        when nothing was stored since, its first kept offset when ``when`` is older. Works without :meth:`start`."""
        part = as_partition(partition)
        return replay.offset_at(self.connection(part.broker_id, read=True), validate_topic(topic), part.partition,
                                replay.to_timestamp_ms(when))

    def lookup(self, topic, key, since=None, until=None):
        """Every message of ``topic`` whose keys hold ``key`` (the RocketMQ ``KEYS`` words, ``UNIQ_KEY``, or a
        metaq ``Message(key=...)``), stored within ``[since, until]`` (datetimes or ms since the Unix epoch; None:
        no bound), from every broker of the topic, newest first; each page of the broker's answer is bounded
        (``limits.MAX_KEY_QUERY_RESULTS``). Works without :meth:`start`."""
        topic = validate_topic(topic)
        found = []
        for broker_id in sorted({p.broker_id for p in self._partitions_of(topic)}):
            for m in keys.lookup(self.connection(broker_id, read=True), topic, key, since, until):
                m.partition = Partition(broker_id, m.partition)
                found.append(m)
        found.sort(key=lambda m: m.id, reverse=True)  # a message id starts with its store time
        return found
