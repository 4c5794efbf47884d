"""Fetching for the consumer: one thread per owned partition, long-polling ``get`` and in-order delivery.

A ``PartitionFetcher`` asks its broker for the next records with a long-polling
``get`` (so an idle consumer burns no CPU and sees a new message as soon as it
is stored), hands them to the consumer one at a time in offset order, and moves
its offset past a message only once the consumer has processed it (handled,
filtered out or parked). Errors back off and retry; a 301 moves to the offset
the broker names. A record the broker reports corrupt (``result 512``, never
served) is skipped with a WARNING line when the consumer has ``skip_corrupt``;
otherwise the partition stops there, with an ERROR line naming it, retried at
the longest backoff (the records after it are not delivered out of order).

``seek(offset)`` (the consumer's ``seek``) moves the fetcher: the fetch thread
drops what it fetched and did not hand over yet (and a long poll in flight),
interrupts the retries of a message whose handler failed (the message stays
unconsumed, like at a stop), and fetches from ``offset`` next. The one message
being handed over when ``seek`` is called (its handler running, or about to
start) may still complete; no other message from before the seek is delivered.
"""

import logging
import threading
import time

from metaq import errors
from metaq.client import limits as client_limits
from metaq.client.divergence import MATCH, MISMATCH, Checkpoints, probe_verdict, rewind_time_ms
from metaq.client.message import Message
from metaq.client.replies import reply_error
from metaq.filters.wire import decode_tagged_reply
from metaq.protocol import events as ev
from metaq.protocol.message import iter_records

log = logging.getLogger(__name__)

#: Seconds added to a long poll's wait for the request timeout.
LONG_POLL_MARGIN_S = 5.0
#: Fetch errors back off from this delay, doubling up to FETCH_BACKOFF_MAX_S.
FETCH_BACKOFF_MIN_S, FETCH_BACKOFF_MAX_S = 0.05, 5.0
#: Seconds between two gets to a slave that ends before the offset already read from its master.
SLAVE_BEHIND_WAIT_S = 0.3
#: Seconds close()/revoke wait for a fetch thread whose handler is still running.
STOP_TIMEOUT_S = 30.0


def records_of(reply, what="get"):
    """Records of a ``get`` reply: a list (empty for 404); raises Moved for 301, the mapped error otherwise."""
    if isinstance(reply, ev.Value):
        return [record for record, _end in iter_records(reply.body)]
    if reply.code == 404:
        return []
    if reply.code == 301:
        raise errors.Moved(int(reply.body), "%s: moved to offset %s" % (what, reply.body.decode()))
    raise reply_error(reply, what)


def tagged_records_of(reply, offset, what="get_tags", passed=False):
    """``([(offset, record)], next offset, passed id)`` of a ``get_tags`` reply (``filters.wire.decode_tagged_reply``;
    ``passed``: the request asked for the id of the record before the next offset, else it is None): none,
    ``offset`` and None for 404; raises Moved for 301, the mapped error otherwise."""
    if isinstance(reply, ev.Value):
        next_offset, passed_id, records = decode_tagged_reply(reply.body, passed)
        return records, next_offset, passed_id
    records_of(reply, what)  # 404: nothing; else raises
    return [], offset, None


def log_skipped(exc):
    """The WARNING line of a corrupt record a consumer skips (``skip_corrupt``)."""
    log.warning("skipping corrupt record: topic %s partition %d offset %d (the broker does not serve it); "
                "continuing at offset %d", exc.topic, exc.partition, exc.offset, exc.next_offset)


class PartitionFetcher:
    """One owned partition: a thread that long-polls the broker and hands messages to the handler in order."""

    def __init__(self, consumer, sub, partition):
        self.consumer = consumer
        self.sub = sub
        self.topic = sub.topic
        self.partition = partition
        self.offset = None  # next offset to read; None until resolved
        self.msg_id = -1  # id of the last consumed message
        self.committed = None  # offset last committed (or loaded)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._interrupt = threading.Event()  # stop or seek: ends a message's retries and parking
        self._gate = threading.Lock()  # a seek and the fetch thread taking it
        self._seek_to = None  # the offset a seek asked for, until the fetch thread takes it
        self._client_filters = False  # True once the broker turned get_tags down as unknown: plain gets
        self._no_expect = False  # True once the broker turned a get's expect down (older than it): gets without
        self._no_passed = False  # True once the broker turned a get_tags' ":passed" down (older than it)
        self._passed_over = None  # (offset, msg_id) of the last record a get_tags reply passed over, until handed
        self._differs = None  # (error, end or None): a 412, or a 301 below what was read, until its probes decide
        self._read = Checkpoints()  # records read, for a get's expect and a divergence (client/divergence.py)
        self._behind = None  # (slave url, offset) while a slave behind this fetcher's offset is waited for
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="metaq-fetch-%s-%s" % (self.topic, partition))

    @property
    def position(self):
        """``(offset, msg_id)`` to commit, or None before the starting offset is known."""
        offset, msg_id = self.offset, self.msg_id
        return None if offset is None else (offset, msg_id)

    def positions(self, key):
        """``{offset store key: (offset, msg_id)}`` to commit for this fetcher's ``key`` (a priority topic's fetcher
        has one per level: client/priorities.py)."""
        position = self.position
        return {} if position is None else {key: position}

    def committed_at(self, key, positions):
        """``positions`` (``positions``' form) were committed: note this fetcher's."""
        entry = positions.get(key)
        if entry is not None:
            self.committed = entry[0]

    def lag(self, key, table):
        """Messages not yet consumed by the group: ``table``'s max offset less the committed offset (before the first
        commit, the position; before that is known, the min offset). ``table``: ``{(topic, partition number): (min,
        max)}`` of this fetcher's broker."""
        low, high = table.get((key[0], key[1].partition), (0, 0))
        return high - next((v for v in (self.committed, self.offset) if v is not None), low)

    @property
    def progress(self):
        """What moves when a fetch delivered something (the fast-miss guard compares it)."""
        return self.offset

    def resolve(self):
        """Load the starting offset, once (with the id of the record before it, when the group committed one)."""
        if self.offset is None:
            self.offset, self.committed = self.consumer.initial_offset(self.topic, self.partition)
            stored = self.consumer.stored_entry(self.topic, self.partition) if self.committed is not None else None
            stored_id = stored[1] if stored is not None and stored[0] == self.offset else -1
            kept = self.consumer.reads_kept.take((self.topic, self.partition), self.offset, stored_id)
            if kept is not None:  # this consumer read up to here before a rebalance: all it remembered, again
                self._read = kept
            elif stored_id > 0 and self.offset > 0:
                self._read.add(self.offset - 1, stored_id)  # the id of the record before the offset (_deliver)
            if stored_id > 0:
                self.msg_id = stored_id  # committed again as it was (a revoke before any delivery keeps it)

    def handover(self):
        """``[(offset store key, offset, msg_id, Checkpoints)]``: where this fetcher stopped and what it had read
        (consumer ``_revoke``: for the next fetcher of this partition, ``divergence.ReadsKept``; a priority topic's
        has one per level), empty before its offset is known or while its thread still runs (a handler that
        outlived the stop)."""
        if self.offset is None or self._thread.is_alive() or not self._stop.is_set():
            return []  # not a clean stop: what it read may not match its position
        return [((self.topic, self.partition), self.offset, self.msg_id, self._read)]

    def start(self):
        self._thread.start()

    def request_stop(self):
        self._stop.set()
        self._interrupt.set()
        self._wake.set()

    def seek(self, offset):
        """Fetch from ``offset`` next (see the module docstring); returns at once."""
        with self._gate:
            self._seek_to = offset
            self._interrupt.set()
        self._wake.set()

    def _apply_seek(self):
        """Take a pending seek: the offset moves there (before the next get)."""
        with self._gate:
            offset, self._seek_to = self._seek_to, None
            if offset is None:
                return
            self._interrupt.clear()
            if self._stop.is_set():
                self._interrupt.set()
        log.info("%s %s: seek from offset %s to %d", self.topic, self.partition, self.offset, offset)
        self.offset, self.msg_id = offset, -1
        self._differs = None
        self._read.clear()

    def join(self, timeout=STOP_TIMEOUT_S):
        if self._thread is threading.current_thread() or not self._thread.is_alive():
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("fetcher %s %s: handler still running after %.0f s; its offset may be committed late",
                        self.topic, self.partition, timeout)

    def _run(self):
        backoff, fast_misses = 0.0, 0
        while not self._stop.is_set():
            try:
                self._apply_seek()
                self.resolve()
                if self._differs is not None:  # probes that failed (a connection lost mid-failover): again
                    self._settle()
                    continue
                started, asked = time.monotonic(), self.progress
                fetched = self._fetch()
                if fetched is None:  # stopped while waiting
                    return
                if self._seek_to is not None:  # fetched from before a seek: dropped
                    continue
                records, next_offset = fetched
                self._deliver(records, next_offset)
                backoff = 0.0
            except errors.Moved as exc:
                if exc.offset == self.offset:  # should not happen; do not spin on it
                    self._stop.wait(FETCH_BACKOFF_MAX_S)
                self._moved(exc)
                continue
            except errors.Diverged as exc:
                self._differs = (exc, None)  # settled at the top of the loop, where an error backs off
                continue
            except errors.CorruptRecord as exc:
                if self.consumer.skip_corrupt and exc.next_offset > self.offset:
                    log_skipped(exc)
                    self.offset, self.msg_id = exc.next_offset, -1
                    continue
                log.error("%s; this partition stops here (consumer option skip_corrupt=True goes past it); "
                          "retrying in %.0f s", exc, FETCH_BACKOFF_MAX_S)
                self._stop.wait(FETCH_BACKOFF_MAX_S)
                continue
            except (errors.Unauthenticated, errors.Forbidden) as exc:  # not transient: said loudly, retried slowly
                log.error("fetch %s %s: %s; retrying in %.0f s", self.topic, self.partition, exc, FETCH_BACKOFF_MAX_S)
                self._stop.wait(FETCH_BACKOFF_MAX_S)
                continue
            except Exception as exc:  # broker down, timeouts, a failing offset store: back off and retry
                backoff = min(FETCH_BACKOFF_MAX_S, max(FETCH_BACKOFF_MIN_S, backoff * 2))
                expected = isinstance(exc, (errors.MetaqError, OSError))
                log.log(logging.INFO if expected else logging.ERROR, "fetch %s %s at %s failed (%r); retrying in "
                        "%.2f s", self.topic, self.partition, self.offset, exc, backoff, exc_info=not expected)
                self._stop.wait(backoff)
                continue
            # a 404 ends a long poll that saw nothing; guard against a broker that answers 404 at once
            quick = self.progress == asked and time.monotonic() - started < self.consumer.long_poll_ms / 2000.0
            fast_misses = fast_misses + 1 if quick else 0
            if fast_misses > 1:
                self._stop.wait(min(1.0, 0.05 * 2 ** min(fast_misses, 5)))

    def _fetch(self):
        """One long-polling get (``get_tags`` when the broker filters for the subscription); ``([(offset, record)],
        next offset)`` (none on 404), or None when stopped while waiting."""
        consumer = self.consumer
        conn = consumer.connection(self.partition.broker_id, read=True)
        wait_ms = consumer.long_poll_ms
        timeout = wait_ms / 1000.0 + LONG_POLL_MARGIN_S
        self._wake.clear()
        sql = None if self._client_filters else self.sub.sql
        tags, offset = (None if self._client_filters else self.sub.tags), self.offset
        filtered = tags is not None or sql is not None  # the broker filters: get_tags or get_sql
        expect = None if self._no_expect else self._read.last()
        passed = filtered and not self._no_expect and not self._no_passed
        self._passed_over = None
        if sql is not None:  # replied as get_tags (docs/messaging.md "SQL92 filters")
            request = ev.GetSql(self.topic, consumer.group, self.partition.partition, offset, consumer.max_size,
                                sql.expression, 0, wait_ms or None, sql, expect=expect, passed=passed)
        elif tags is None:
            request = ev.Get(self.topic, consumer.group, self.partition.partition, offset, consumer.max_size, 0,
                             wait_ms or None, expect)
        else:  # passed: the reply names the last record passed over, the next expect names it (filters/text.py)
            request = ev.GetTags(self.topic, consumer.group, self.partition.partition, offset, consumer.max_size,
                                 tags, 0, wait_ms or None, expect=expect, passed=passed)
        future = conn.request(request, timeout=timeout)
        future.add_done_callback(lambda _f: self._wake.set())
        deadline = time.monotonic() + timeout + 1.0
        while True:  # the reply, a stop or a seek (the wake of an abandoned get's reply may come any time)
            self._wake.clear()
            left = deadline - time.monotonic()
            if future.done() or self._stop.is_set() or self._seek_to is not None or left <= 0:
                break
            self._wake.wait(left)
        if self._stop.is_set():
            return None
        if self._seek_to is not None:
            return [], offset
        if not future.done():
            raise errors.RequestTimeout("no reply to a get from %s" % conn.url)
        what = "get %s %s %d" % (self.topic, self.partition, offset)
        reply = future.result(0)
        if isinstance(reply, ev.Result) and reply.code == 301 and reply.body.isdigit() \
                and int(reply.body) < offset and consumer.is_slave_read(self.partition.broker_id, conn.url):
            self._wait_for_slave(conn.url, offset, int(reply.body))
            return [], offset
        if passed and isinstance(reply, ev.Result) and reply.code == 400 and b"invalid expect" in reply.body:
            log.warning("%s %s: the broker at %s does not name the records a get_tags passed over (it is older): a "
                        "failover that rewrites those goes unnoticed there", self.topic, self.partition, conn.url)
            self._no_passed = True  # asked again with the plain expect
            return [], offset
        if (expect is not None or passed) and isinstance(reply, ev.Result) and reply.code == 400 \
                and b" needs " in reply.body:
            log.warning("%s %s: the broker at %s does not check a get's last record (no expect: it is older): a "
                        "failover that rewrites what was read goes unnoticed there", self.topic, self.partition,
                        conn.url)
            self._no_expect = True  # "get needs 7 or 8 tokens": asked again without it
            return [], offset
        if not filtered:
            records = records_of(reply, what)
            return [(offset + k, r) for k, r in enumerate(records)], offset + len(records)
        if isinstance(reply, ev.Result) and reply.code == 400 and reply.body.startswith(b"unknown command"):
            log.warning("%s %s: the broker at %s does not filter (no %s): filtering here", self.topic,
                        self.partition, conn.url, "get_sql" if sql is not None else "get_tags")
            self._client_filters = True  # a broker older than the extension: every record read, filtered here
            return [], offset
        records, next_offset, passed_id = tagged_records_of(reply, offset, what, passed)
        if passed_id is not None and passed_id != -1 and next_offset > offset:
            self._passed_over = (next_offset - 1, passed_id)
        return records, next_offset

    def _wait_for_slave(self, url, offset, end):
        """Reads failed over to a slave that has not copied what this fetcher read from the master (async
        replication lags): the offset stays, and the slave is asked again (it catches up, the master returns, or
        it is promoted: then a master's own "outside the partition" moves the offset). Going back to the slave's end
        would deliver again, once the master is back, every message read past it."""
        if self._behind != (url, offset):
            self._behind = (url, offset)
            log.warning("%s %s: the slave %s ends at offset %d, before %d already read from the master: waiting for "
                        "it to catch up or for the master", self.topic, self.partition, url, end, offset)
        self._stop.wait(SLAVE_BEHIND_WAIT_S)

    def _deliver(self, records, next_offset):
        """Hand ``records`` (``(offset, record)``) over in order; once all are done, move on to ``next_offset``
        (past the records the broker passed over for a ``get_tags``). Each one handed over is remembered
        (client/divergence.py)."""
        remember = self._read.add
        for offset, record in records:
            if self._interrupt.is_set():  # a stop, or a seek: the rest of these records is dropped
                return
            try:
                message = Message.from_record(self.topic, self.partition, offset, record)
                done = self.consumer.process(self.sub, message, self._interrupt)
            except errors.RemoteProtocolError as exc:  # a malformed attribute block: park the raw data
                log.error("%s %s offset %d: %s; parking the raw message", self.topic, self.partition, offset, exc)
                message = Message(self.topic, record.data)
                message.id, message.partition, message.offset = record.msg_id, self.partition, offset
                done = self.consumer.parking.park(message, self._interrupt)
            if not done:
                return  # stopped (or a seek) during retries: the message stays unconsumed
            self.offset, self.msg_id = offset + 1, record.msg_id
            remember(offset, record.msg_id)
        if self._interrupt.is_set():
            return
        passed = self._passed_over
        if passed is not None and passed[0] == max(self.offset, next_offset) - 1:
            # get_tags: the last record passed over, named by the next expect, and committed with the offset (so a
            # restart checks it as a plain get's commit is checked: the id of the record before the offset)
            remember(*passed)
            self.offset, self.msg_id = passed[0] + 1, passed[1]
        elif next_offset > self.offset:  # passed over records it cannot name (a broker before ":passed")
            self.offset, self.msg_id = next_offset, -1

    def _moved(self, exc):
        """A 301 (``errors.Moved``): the offset is outside the partition. Below its minimum: on from there. Past
        the end of a log that no longer holds what was read there (an async master died with it, and the promoted
        slave may since have written new messages below that end): reading on from the end would skip those, so
        the fetcher goes back to the newest record read that this log holds as read, as after a 412 (``_rewind``,
        by time when it holds none of them). With no record read known (an offset committed without its id), on
        from the end."""
        if exc.offset < self.offset and self._read.last() is not None and not self._no_expect:
            log.warning("%s %s: offset %s is past the partition's end %d: checking the records read below it",
                        self.topic, self.partition, self.offset, exc.offset)
            self._differs = (exc, exc.offset)  # the position stays until the probes decide (_settle)
            return
        log.warning("%s %s: offset %s is outside the partition; continuing at %d",
                    self.topic, self.partition, self.offset, exc.offset)
        self.offset, self.msg_id = exc.offset, -1
        self._read.cut(exc.offset)  # what was read past the end is checked no more

    def _settle(self):
        """Decide where to read on after a 412 or a 301 below what was read (``_rewind``). Until it has, the
        position stays where it was: a commit meanwhile, or a stop, keeps it, and the next get meets the same
        answer; an error (the probes' connection lost) backs off in ``_run`` and the probes run again."""
        exc, end = self._differs
        if self._rewind(exc, end):
            self._differs = None

    def _rewind(self, exc, end=None):
        """A get's expect failed (``errors.Diverged``), or the broker's log ends at ``end``, before records read:
        move to where ``_go_back`` says. False when a stop or a seek came first (nothing moved)."""
        back = self._go_back(self.topic, self._read, self.offset, exc, end)
        if back is None:
            return False
        self.offset, self.msg_id = back
        return True

    def _go_back(self, topic, read, offset, exc, end=None):
        """The broker's log of ``topic`` (this fetcher's partition; a priority level's own name) differs from the
        one read (``read``: its Checkpoints; ``offset``: the next offset there). ``(offset, msg_id)`` to read on
        from: after the newest record read (below ``end``) that it holds as read (client/divergence.py); the
        messages after it are read (again, for those both logs hold). When it holds none, from the first message
        stored ``limits.DIVERGENCE_REWIND_MS`` before the oldest of the records read that it does not hold as
        read. ``read`` is cut to match. None when a stop or a seek came first (nothing moved)."""
        conn = self.consumer.connection(self.partition.broker_id, read=True)
        tried, candidates = [], []
        for cp_offset, cp_id in read.newest_first():
            if end is None or cp_offset < end:
                candidates.append((cp_offset, cp_id))
            else:
                tried.append(cp_id)  # read past the end: not held
        for cp_offset, cp_id in candidates:
            if self._stop.is_set() or self._seek_to is not None:
                return None
            verdict, moved_to = self._probe(conn, topic, cp_offset, cp_id)
            if verdict == MATCH:
                resume = cp_offset + 1 if moved_to is None else moved_to
                log.warning("%s %s: the log at %s differs from the one read before (%s); reading again from offset "
                            "%d, after the last record both hold (was at %d)", topic, self.partition, conn.url,
                            exc, resume, offset)
                read.cut(cp_offset + 1)
                return resume, cp_id if moved_to is None else -1
            if verdict == MISMATCH:
                tried.append(cp_id)
        if self._stop.is_set() or self._seek_to is not None:
            return None
        since_ms = rewind_time_ms(tried) if tried else int(time.time() * 1000) - client_limits.DIVERGENCE_REWIND_MS
        resume = min(self.consumer.offset_at(topic, self.partition, since_ms), offset if end is None else end)
        log.warning("%s %s: the log at %s differs from every record read before (%s); reading again from offset %d, "
                    "the first stored since %d ms (was at %d)", topic, self.partition, conn.url, exc, resume,
                    since_ms, offset)
        read.clear()
        return resume, -1

    def _probe(self, conn, topic, cp_offset, cp_id):
        """``(verdict, moved_to)`` for the record of ``topic`` read at ``cp_offset`` (``divergence.probe_verdict``)."""
        request = ev.Get(topic, self.consumer.group, self.partition.partition, cp_offset + 1, 1, 0, 0,
                         (cp_offset, cp_id))
        reply = conn.call(request)
        if isinstance(reply, ev.Value):
            return probe_verdict(cp_offset, "value"), None
        if reply.code == 512:  # the record after it is corrupt: the expect was checked first, so it is held
            return probe_verdict(cp_offset, "value"), None
        if reply.code in (404, 412):
            return probe_verdict(cp_offset, str(reply.code)), None
        if reply.code == 301:
            moved_to = int(reply.body)
            verdict = probe_verdict(cp_offset, "301", moved_to)
            return verdict, (moved_to if verdict == MATCH else None)
        raise reply_error(reply, "get %s %s %d (a divergence probe)" % (topic, self.partition, cp_offset + 1))
