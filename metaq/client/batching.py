"""The producer's batches (``Producer(batch_bytes=...)``): messages of a partition sent together as one ``putb``.

As Kafka's producer does: each ``(topic, partition)`` has one open batch; a message joins its partition's batch,
which is closed when it reaches ``batch_bytes`` or ``linger_ms`` after its first message, whichever is first
(``Producer.flush`` and ``close`` close every open batch at once). A closed batch is sent as one ``putb``
(protocol/putbatch.py), the broker stores it whole or not at all, and its one reply resolves every message's
future with its own id and offset.

Order per partition: a partition has at most one batch on the wire; the next waits until the broker answered
it. A batch that fails for a transient reason (connection lost, timeout, 503, 507) is sent again, to the same
partition, after a backoff, and the partition's later batches wait behind it: retries never reorder a
partition. A batch that fails otherwise (400, 403, ...) fails each of its messages with that error. Several
batches (of different partitions) are on the wire per broker connection at once, at most ``max_in_flight``;
closed batches beyond it wait their turn. At most ``buffer_bytes`` of messages wait in batches: ``send_async``
then waits for room (until the message's deadline, then the send fails with ``RequestTimeout``), so never call
it from a send callback.

An idempotent producer's batches are ``putb_idem`` frames (idempotence/wire.py) of at most
``limits.MAX_IDEMPOTENT_BATCH_MESSAGES``: a batch's messages get their partition's next sequences, in order, at
its first attempt (``Producer.reserve_sequences``, send_many's rule too), and its retries resend that frame, so
the broker answers what it stored as duplicates with the original offsets. A message that cannot share one
(compressed, too large) is a batch of its own, sent as a ``put_idem`` in its turn. After a batch that failed for
good, a producer under an id of its own goes on (``Producer.sequences_answered``, ``Batcher._rebased``): a batch
refused whole to every attempt gives its sequences to the next, and a batch refused as a gap takes the
sequences the broker expects and is sent again, unless an attempt of it has an unknown outcome.

``Producer.send_many`` goes through the same lanes (``add_many``): its payloads, encoded by the C helper into
ready ``putb`` bodies (``protocol.putbatch.encode_sub_records``), queue behind the partition's earlier batches,
and each frame's reply goes to one handle (``ManySend``) rather than to a future per message.

What a message costs: ``add`` appends its body, its message and its future to the open batch under the
batcher's one lock (no lock, Condition or object of its own); the batch is encoded when it closes, by the C
helper in one call for a batch of plain bodies (``encode_sub_records``, the checksums computed there), and its
reply resolves its futures in one pass (``SendFuture``: a Condition is made only for a future something waits
on or adds a callback to).

Linger: as Kafka's, a message waits up to ``linger_ms`` for company even when nothing else is queued, so a
trickle of ``send_async`` calls still goes in batches (the point of the setting); ``linger_ms=0`` sends a
lone message at once (messages that come while its partition has a batch on the wire still gather in the
next one), and ``Producer.send`` and ``flush`` end the linger of what they wait for.
"""

import bisect
import collections
import heapq
import itertools
import logging
import operator
import threading
import time
from concurrent.futures import Future, InvalidStateError
from concurrent.futures._base import CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED, RUNNING

from metaq.errors import BrokerError, ConnectionLost, RequestTimeout
from metaq.client.message import ManyResult, Partition, SendResult
from metaq.client.replies import reply_error
from metaq.protocol import events as ev
from metaq.protocol.checksum import metaq_checksum
from metaq.protocol.putbatch import PutBatch, decode_runs, encode_sub_records, sub_record
from metaq.client.idempotence import frees_sequences, gap_expected, other_content
from metaq.idempotence.wire import (DUPLICATE_MARK, IdempotentBatch, IdempotentPut, decode_idem_runs,
                                    encode_idem_sub_records, idem_sub_record)
from metaq import limits
from metaq.idempotence import limits as idempotence_limits

log = logging.getLogger(__name__)

_MAX_BACKOFF_S = 1.0
#: More than a sub-record's line takes besides its topic ("put ", the numbers, spaces and CRLF).
_LINE = 64
#: More than a sub-record's line takes besides its head ("put <topic> <partition> "): the length, flag, checksum
#: and sequence, their spaces and CRLF.
_TAIL = 40
_DONE_STATES = (CANCELLED, CANCELLED_AND_NOTIFIED, FINISHED)
_MAKE_LOCK = threading.Lock()


class SendFuture(Future):
    """A ``concurrent.futures.Future`` of one send's result that costs no Condition, lock or list until something
    waits on it (``result`` before it is done, ``concurrent.futures.wait``) or adds a callback: a batch's reply
    resolves its thousands of futures with ``settle``, a few assignments each. Created running (``cancel`` is
    False), as every send's future is. A full Future otherwise (``asyncio.wrap_future`` takes it)."""

    __slots__ = ("_state", "_result", "_exception", "_cond", "_callbacks", "_wlist")

    def __init__(self):  # noqa: D107 - not Future's: its Condition is made by _condition when first needed
        self._state = RUNNING
        self._result = None
        self._exception = None
        self._cond = None

    @property
    def _condition(self):
        return self._made()

    def _made(self):
        """The Condition, made on first use together with the waiter and callback lists it guards."""
        cond = self._cond
        if cond is None:
            with _MAKE_LOCK:
                cond = self._cond
                if cond is None:
                    self._callbacks = []
                    self._wlist = []
                    cond = self._cond = threading.Condition()  # published last: settle reads it after _state
        return cond

    @property
    def _waiters(self):
        self._made()
        return self._wlist

    @property
    def _done_callbacks(self):
        self._made()
        return self._callbacks

    def done(self):
        return self._state in _DONE_STATES

    def result(self, timeout=None):
        if self._state == FINISHED and self._exception is None:
            return self._result
        return super().result(timeout)

    def set_result(self, result):
        if self._state in _DONE_STATES:
            raise InvalidStateError("%s: already done" % self._state)
        self.settle(result)

    def settle(self, result):
        """Resolve this running future with ``result``: its state first, then (when it has made its Condition:
        someone waits, or it has callbacks) the waiters woken and the callbacks run, as Future does."""
        self._result = result
        self._state = FINISHED
        cond = self._cond  # read after _state is set: a waiter making it now finds the state FINISHED
        if cond is not None:
            with cond:
                for waiter in self._wlist:
                    waiter.add_result(self)
                cond.notify_all()
            for callback in self._callbacks:
                try:
                    callback(self)
                except Exception:
                    log.exception("exception calling callback for %r", self)


#: What a put_idem sub-record's line takes more (the word, the producer id and sequence).
_IDEM_LINE = 48


class _Batch:
    __slots__ = ("key", "topic", "line", "messages", "futures", "parts", "flags", "nbytes", "due", "deadline",
                 "body", "attempts", "error", "count", "data", "many", "first", "seq0", "single", "unsure")

    def __init__(self, key, due):
        self.key = key  # (topic, Partition)
        self.topic = key[0]
        self.line = len(key[0].encode("utf-8")) + 16 + _TAIL  # at most a sub-record's line: "put <topic> <part> ..."
        self.messages = []  # send_async's: each message, its future, its data (parts) in order
        self.futures = []
        self.parts = []
        self.flags = None  # {index: flag} of its messages with an attribute block (the rest: flag 0)
        self.nbytes = 0
        self.due = due  # when lingering ends
        self.deadline = None  # the earliest deadline of its messages
        self.body = None  # joined when closed
        self.attempts = 0
        self.error = None  # why its last attempt failed (a retry's)
        self.count = 0  # its messages
        self.data = 0  # bytes of their data (counted in the buffer)
        self.many = None  # a send_many's ManySend (then messages is empty and body set at once)
        self.first = 0  # send_many: the index of its first payload in the call's
        self.seq0 = None  # an idempotent batch's: -1 until its first attempt gives it its first sequence
        self.single = False  # an idempotent message that cannot share a putb_idem: sent alone as a put_idem
        self.unsure = False  # an attempt's outcome is unknown (no reply, 503, 507): a copy of it may be stored


class _Lane:
    """One partition's batches: the open one, the full ones waiting their turn, whether one is on the wire (or
    waiting for its retry)."""

    __slots__ = ("key", "broker", "open", "full", "busy")

    def __init__(self, key):
        self.key = key
        self.broker = key[1].broker_id
        self.open = None
        self.full = collections.deque()
        self.busy = False

    def next_batch(self, now):
        """The batch this idle lane sends now (a full one, else its open one once its linger is over), or None."""
        if self.full:
            return self.full.popleft()
        b = self.open
        if b is not None and b.due <= now:
            self.open = None
            _encode(b)
            return b
        return None


def _encode(b):
    """A send_async batch's ``putb`` body, from its messages' data: by the C helper in one call when every one is
    a plain body (flag 0), else each sub-record here. An idempotent batch is encoded at its first attempt
    (``_encode_idem``), once it has its sequences."""
    if b.seq0 is not None:
        return
    partition = b.key[1].partition
    topic = b.topic.encode("utf-8")
    if b.flags is None:
        b.body = encode_sub_records(topic, partition, b.parts, 0)
    else:
        flags = b.flags
        b.body = b"".join(sub_record(topic, partition, flags.get(k, 0), data, metaq_checksum(data), k)
                          for k, data in enumerate(b.parts))
    b.parts = None


def _encode_idem(b, pid):
    """An idempotent batch's request (``b.seq0`` given): its messages' put_idem frames as a ``putb_idem`` body,
    sequences ``seq0, seq0 + 1, ...`` in send order (``b.parts`` is kept: a batch refused as a gap is encoded
    again under other sequences, ``Batcher._replied``), or a message sent alone's ``put_idem``."""
    partition = b.key[1].partition
    topic = b.topic.encode("utf-8")
    if b.single:
        data = b.parts[0]
        flag = b.flags.get(0, 0) if b.flags else 0
        b.body = IdempotentPut(b.topic, partition, flag, data, 0, metaq_checksum(data), pid, b.seq0)
    elif b.many is not None or b.flags is None:
        b.body = encode_idem_sub_records(topic, partition, b.parts, pid, b.seq0)
    else:
        flags, seq0 = b.flags, b.seq0
        b.body = b"".join(idem_sub_record(topic, partition, flags.get(k, 0), data, metaq_checksum(data), pid, seq0 + k)
                          for k, data in enumerate(b.parts))


def _single_runs(body):
    """A put_idem reply's body (``<id> <partition> <offset>[ dup]``) as ``decode_idem_runs`` gives a batch's."""
    words = bytes(body).split()
    dup = len(words) == 4 and words[3] == DUPLICATE_MARK
    if len(words) != 3 and not dup:
        raise ValueError("not a put reply")
    first_id, partition, offset = (int(x) for x in words[:3])
    return [(first_id, partition, offset, 1, dup)]


class ManySend:
    """One ``send_many``'s handle: its frames' outcomes gathered into one ``ManyResult`` for its one future.
    ``expect(n)`` once, then ``chunk_done`` once per frame (on whichever thread answers it)."""

    __slots__ = ("future", "partition", "count", "left", "runs", "error", "lock", "on_done", "duplicates")

    def __init__(self, future, partition, count, on_done):
        self.future = future
        self.partition = partition
        self.count = count
        self.left = 0
        self.runs = []
        self.error = None
        self.lock = threading.Lock()
        self.on_done = on_done  # called once the result is set (the producer's count of sends in progress)
        self.duplicates = 0  # payloads an idempotent batch found already stored (answered with the originals)

    def expect(self, frames):
        self.left = frames

    def chunk_done(self, first, count, runs, error):
        """Payloads ``first .. first + count - 1`` were stored as ``runs`` (a reply's; an idempotent batch's with a
        fifth field, True for a run of duplicates), or not (``error``)."""
        with self.lock:
            if runs is not None:
                k = first
                for run in runs:
                    first_id, part, offset, n = run[:4]
                    self.runs.append((k, first_id, part, offset, n))
                    if len(run) > 4 and run[4]:
                        self.duplicates += n
                    k += n
            elif self.error is None:
                self.error = error
            self.left -= 1
            last = self.left == 0
        if last:
            self.runs.sort()
            self.future.set_result(ManyResult(self.error is None, self.partition, self.count, self.runs, self.error,
                                              self.duplicates))
            self.on_done()


class Batcher:
    """One per batching Producer. ``add`` takes a message whose partition is chosen; the rest runs on the
    connections' reader threads and the batcher's own thread (lingering, retries)."""

    def __init__(self, producer, batch_bytes, linger_ms, max_in_flight, buffer_bytes):
        for name, value, low in (("batch_bytes", batch_bytes, 1), ("linger_ms", linger_ms, 0),
                                 ("max_in_flight", max_in_flight, 1), ("buffer_bytes", buffer_bytes, 1)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
                raise ValueError("%s must be a number >= %d, got %r" % (name, low, value))
        if batch_bytes > buffer_bytes:
            raise ValueError("batch_bytes (%d) must be at most buffer_bytes (%d)" % (batch_bytes, buffer_bytes))
        self.producer = producer
        self.idempotent = bool(getattr(producer, "idempotent", False))  # add's batches are putb_idem
        self._line = _LINE + (_IDEM_LINE if self.idempotent else 0)
        self._most = idempotence_limits.MAX_IDEMPOTENT_BATCH_MESSAGES if self.idempotent else limits.MAX_BATCH_MESSAGES
        self.batch_bytes = int(batch_bytes)
        self.linger_s = linger_ms / 1000.0
        self.max_in_flight = int(max_in_flight)
        self.buffer_bytes = int(buffer_bytes)
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)  # the batcher's thread: lingering and retries
        self._room = threading.Condition(self._lock)  # senders waiting for buffer room
        self._lanes = {}  # (topic, Partition) -> its _Lane
        self._in_flight = collections.Counter()  # broker id -> batches on the wire
        self._retries = []  # heap of (due, n, _Batch)
        self._n = itertools.count()
        self._buffered = 0  # bytes of messages in batches not yet answered
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="metaq-producer-batches", daemon=True)
        self._thread.start()

    def fits(self, topic, size):
        """True when a message of ``size`` bytes (its data) for ``topic`` fits in a batch with its sub-record's line
        (larger ones go alone)."""
        return size + self._line + len(topic) <= self.batch_bytes

    def largest(self, topic):
        """The largest data of a message of ``topic`` that fits in a batch (``fits``)."""
        return self.batch_bytes - self._line - len(topic)

    def add(self, message, future, partition, flag, data, deadline, alone=False):
        """Put ``message`` (its ``data`` and ``flag`` as a put sends them; its partition chosen, >= 0) in its
        partition's batch; ``future`` gets its ``SendResult``. Waits for buffer room until ``deadline``
        (RequestTimeout, nothing queued).

        An idempotent producer's batches are ``putb_idem`` of at most ``limits.MAX_IDEMPOTENT_BATCH_MESSAGES``,
        given their sequences at their first attempt as send_many's are (``_attempt``); ``alone``: a message that
        cannot share one (compressed, or too large) goes in its partition's lane in its turn as a batch of its
        own, sent as a ``put_idem``, so its sequence too is given in lane order."""
        key = (message.topic, partition)
        n = len(data)
        ready = None
        with self._lock:
            if self._buffered + n > self.buffer_bytes and self._buffered:
                self._wait_room(deadline, n)
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = _Lane(key)
            b = lane.open
            if b is not None and (alone or b.nbytes + n + b.line > self.batch_bytes):
                ready = self._full(lane)
                b = None
            if b is None:
                b = lane.open = _Batch(key, time.monotonic() + self.linger_s)
                b.deadline = deadline
                if self.idempotent:
                    b.seq0 = -1
                    b.line += _IDEM_LINE
                    b.single = alone
                self._cond.notify()
            if flag:
                if b.flags is None:
                    b.flags = {}
                b.flags[b.count] = flag
            b.parts.append(data)
            b.messages.append(message)
            b.futures.append(future)
            b.nbytes += n + b.line
            b.count += 1
            b.data += n
            self._buffered += n
            if deadline < b.deadline:
                b.deadline = deadline
            if b.nbytes >= self.batch_bytes or b.count >= self._most or alone:
                more = self._full(lane)
                ready = more if ready is None else ready + more
        if ready:
            self._send(ready)

    def add_many(self, topic, partition, payloads, deadline, many, idempotent=False):
        """Queue ``payloads`` (bytes) for ``partition`` (>= 0) of ``topic`` as ready batches of at most
        ``batch_bytes`` and ``limits.MAX_BATCH_MESSAGES`` messages each, behind the partition's earlier batches;
        ``many`` (a ``ManySend``) hears each one's outcome. Waits for buffer room as ``add`` does (RequestTimeout
        past ``deadline``: the batches queued so far still go).

        ``idempotent``: ``putb_idem`` batches of at most ``limits.MAX_IDEMPOTENT_BATCH_MESSAGES``, each given its
        partition's next sequences at its first attempt (``_attempt``), when every batch before it in the lane
        is answered; its retries resend the same frame, so the same sequences."""
        key = (topic, partition)
        tb = topic.encode("utf-8")
        line = _LINE + len(tb)
        chunks = []
        n = len(payloads)
        most_messages = idempotence_limits.MAX_IDEMPOTENT_BATCH_MESSAGES if idempotent else limits.MAX_BATCH_MESSAGES
        if idempotent:
            line += _IDEM_LINE
        if sum(map(len, payloads)) + n * line <= self.batch_bytes and n <= most_messages:
            chunks.append((0, n))
        else:  # cut where the running size (data and lines) passes batch_bytes: bisected, no loop per message
            ends = list(itertools.accumulate(map(operator.add, map(len, payloads), itertools.repeat(line))))
            start = 0
            while start < n:
                base = ends[start - 1] if start else 0
                most = min(n, start + most_messages)
                stop = bisect.bisect_right(ends, base + self.batch_bytes, start, most)
                stop = max(stop, start + 1)  # one larger than a batch goes alone
                chunks.append((start, stop))
                start = stop
        many.expect(len(chunks))
        for done, (i, j) in enumerate(chunks):
            part = payloads[i:j] if (i, j) != (0, n) else payloads
            b = _Batch(key, 0)
            if idempotent:  # encoded at its first attempt, with the sequences it gets then
                b.parts = part
                b.seq0 = -1
            else:
                b.body = encode_sub_records(tb, partition.partition, part, 0)
                b.parts = None
            b.count = j - i
            b.data = sum(map(len, part))
            b.deadline = deadline
            b.many = many
            b.first = i
            with self._lock:
                if self._buffered + b.data > self.buffer_bytes and self._buffered:
                    try:
                        self._wait_room(deadline, b.data)
                    except RequestTimeout as exc:
                        for i2, j2 in chunks[done:]:
                            many.chunk_done(i2, j2 - i2, None, exc)
                        ready = None
                        break
                lane = self._lanes.get(key)
                if lane is None:
                    lane = self._lanes[key] = _Lane(key)
                if lane.open is not None:  # earlier send_async messages of the partition go first
                    ready = self._full(lane)
                else:
                    ready = []
                lane.full.append(b)
                self._buffered += b.data
                ready += self._sendable(lane.broker)
            if ready:
                self._send(ready)

    def flush_now(self):
        """End every open batch's linger (``Producer.flush``): each goes as soon as its partition may send."""
        with self._lock:
            ready = []
            for lane in self._lanes.values():
                if lane.open is not None:
                    lane.open.due = 0
                    ready += self._sendable(lane.broker)
        if ready:
            self._send(ready)

    def close(self):
        """Stop the thread; batches not answered by now fail (the producer is closing)."""
        with self._lock:
            self._closed = True
            self._cond.notify_all()
            self._room.notify_all()
            left = [r[2] for r in self._retries]
            for lane in self._lanes.values():
                left += list(lane.full) + ([lane.open] if lane.open is not None else [])
                lane.full.clear()
                lane.open = None
            self._retries = []
        self._thread.join(5)
        for b in left:
            self._fail(b, ConnectionLost("producer closed"))

    # -- under the lock ---------------------------------------------------------------------------------

    def _wait_room(self, deadline, n):
        while self._buffered + n > self.buffer_bytes and self._buffered and not self._closed:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RequestTimeout("%d bytes of messages wait in batches (buffer_bytes): no room for another "
                                     "before the deadline" % self._buffered)
            self._room.wait(min(left, 1.0))

    def _full(self, lane):
        """Close ``lane``'s open batch (full): the batches now sendable (it, or none if its turn has not come)."""
        b = lane.open
        lane.open = None
        _encode(b)
        lane.full.append(b)
        return self._sendable(lane.broker)

    def _sendable(self, broker):
        """Take the batches of ``broker``'s idle lanes that may go on the wire now, while it has fewer than
        ``max_in_flight`` on the wire: their lanes busy from now."""
        out = []
        room = self.max_in_flight - self._in_flight[broker]
        if room <= 0:
            return out
        now = time.monotonic()
        for lane in self._lanes.values():
            if lane.busy or lane.broker != broker:
                continue
            b = lane.next_batch(now)
            if b is not None:
                lane.busy = True
                out.append(b)
                room -= 1
                if not room:
                    break
        self._in_flight[broker] += len(out)
        return out

    # -- the wire ---------------------------------------------------------------------------------------

    def _send(self, batches):
        for b in batches:
            self._attempt(b)

    def _attempt(self, b):
        """Put ``b`` on the wire (its key busy, counted in its broker's in-flight); the reply goes to ``_replied``."""
        b.attempts += 1
        partition = b.key[1]
        producer = self.producer
        url = producer.discovery.url(partition.broker_id)
        if url is None:
            self._replied(b, None, ConnectionLost("broker %d is not registered" % partition.broker_id))
            return
        try:
            conn = producer.connection(url)
        except ConnectionLost as exc:
            self._replied(b, None, exc)
            return
        remaining = b.deadline - time.monotonic()
        if b.seq0 is not None:
            if b.seq0 < 0:  # its first attempt: the lane's batches before it are answered, so it goes in order
                b.seq0 = producer.reserve_sequences(b.key, b.count)
                _encode_idem(b, producer.producer_id)
            event = b.body if b.single else IdempotentBatch(b.topic, b.count, b.body, 0)
        else:
            event = PutBatch(b.topic, b.count, b.body, 0)
        conn.request_callback(event,
                              lambda reply, error: self._replied(b, reply, error),
                              timeout=max(0.001, min(producer.send_timeout, remaining)))

    def _replied(self, b, reply, error):
        """On a reader thread: resolve the batch's messages, or retry it, or fail them; then send what waits."""
        partition = b.key[1]
        if error is None:
            if isinstance(reply, ev.Result) and reply.code == 200:
                try:
                    runs = (decode_runs(reply.body) if b.seq0 is None else _single_runs(reply.body) if b.single
                            else decode_idem_runs(reply.body))
                    stored = sum(run[3] for run in runs)
                    if stored != b.count:
                        raise ValueError("%d places for %d messages" % (stored, b.count))
                except ValueError as exc:
                    self._done(b, error=BrokerError("bad putb reply %r: %s" % (reply.body[:200], exc)))
                    return
                self._done(b, runs=runs)
                return
            error = reply_error(reply)
            if error.code == 400 and b.seq0 is not None and not b.unsure and self._rebased(b, error):
                return
        if isinstance(error, (ConnectionLost, RequestTimeout)) or error.code in (503, 507):
            self.producer.mark_suspect(partition.broker_id)
            now = time.monotonic()
            b.error = error
            b.unsure = True
            if not self._closed and now < b.deadline:
                delay = min(_MAX_BACKOFF_S, 0.05 * 2 ** min(b.attempts - 1, 10))
                with self._lock:
                    self._in_flight[partition.broker_id] -= 1  # the lane stays busy: nothing overtakes the retry
                    heapq.heappush(self._retries, (min(now + delay, b.deadline), next(self._n), b))
                    self._cond.notify()
                    ready = self._sendable(partition.broker_id)
                self._send(ready)
                return
        self._done(b, error=error)

    def _rebased(self, b, error):
        """An idempotent batch, no attempt of it of unknown outcome, refused whole because of its sequences: as a
        gap (``idempotence.client.gap_expected``: the batches of its partition that failed for good before it
        were never stored), or for other content (``other_content``: a copy of such a batch was stored after
        all, under the sequences this one took again). When the producer may (``Producer.rebase_sequences``) it
        takes the sequences the broker expects (after other content: those above every one given, which the
        broker stores or refuses as a gap naming its next) and is sent again at once (True): still on the wire,
        its lane busy. Never for a batch with an attempt of unknown outcome (``unsure``): a copy of it under the
        old sequences may still be stored."""
        text = str(error)
        expected = gap_expected(text)
        if (expected is None and not other_content(text)) or b.seq0 < 0:
            return False
        first = self.producer.rebase_sequences(b.key, b.seq0, b.count, expected)
        if first is None:
            return False
        log.info("idempotent batch of %d messages for %s-%s refused (%s) at sequence %d: sent again from sequence "
                 "%d", b.count, b.topic, b.key[1], "a gap" if expected is not None else "other content", b.seq0,
                 first)
        b.seq0 = first
        _encode_idem(b, self.producer.producer_id)
        self._attempt(b)
        return True

    def _done(self, b, runs=None, error=None):
        """The batch is over: each message's result, then its partition and broker free for the next."""
        broker = b.key[1].broker_id
        if b.seq0 is not None and b.seq0 >= 0:  # before its lane is free: the lane's next batch reserves after it
            self.producer.sequences_answered(b.key, b.seq0, b.count, runs is None and not b.unsure
                                             and frees_sequences(getattr(error, "code", 500), str(error)))
        with self._lock:
            self._lanes[b.key].busy = False
            self._in_flight[broker] -= 1
            self._buffered -= b.data
            self._room.notify_all()
            ready = self._sendable(broker)
            if not self._lanes[b.key].busy and self._lanes[b.key].open is not None:
                self._cond.notify()  # its open batch lingers on: the thread's next wake-up may be it
        if runs is None:
            self._fail(b, error)
        elif b.many is not None:
            b.many.chunk_done(b.first, b.count, runs, None)
        elif b.seq0 is None:
            self.producer.finish_stored(b.messages, b.futures, [(first_id, Partition(broker, part), offset, count)
                                                                for first_id, part, offset, count in runs])
        else:
            self.producer.finish_stored(b.messages, b.futures, [(first_id, Partition(broker, part), offset, count,
                                                                 dup) for first_id, part, offset, count, dup in runs])
        self._send(ready)

    def _fail(self, b, error):
        if b.many is not None:
            b.many.chunk_done(b.first, b.count, None, error)
            return
        self.producer.finish_failed(b.futures, SendResult(False, b.key[1], error=error))

    # -- the batcher's thread ---------------------------------------------------------------------------

    def _run(self):
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                retries = []
                while self._retries and self._retries[0][0] <= now:
                    retries.append(heapq.heappop(self._retries)[2])
                for b in retries:
                    self._in_flight[b.key[1].broker_id] += 1
                ready = []
                wake = self._retries[0][0] if self._retries else None
                for broker in {lane.broker for lane in self._lanes.values() if not lane.busy and lane.open}:
                    ready += self._sendable(broker)
                for lane in self._lanes.values():  # lingering batches of idle lanes: the next due
                    if (not lane.busy and lane.open is not None and (wake is None or lane.open.due < wake)
                            and self._in_flight[lane.broker] < self.max_in_flight):  # else a reply sends it
                        wake = lane.open.due
                if not ready and not retries:
                    self._cond.wait(None if wake is None else max(0.0005, wake - now))
                    continue
            for b in retries:
                if time.monotonic() >= b.deadline:
                    self._done(b, error=b.error or RequestTimeout("batch not stored before the deadline"))
                else:
                    self._attempt(b)
            self._send(ready)
