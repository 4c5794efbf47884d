"""Record-level reads for the RocketMQ remoting protocol (``MessageStore``'s helpers, given its log and indexes).

A MetaQ ``get`` sends records' MetaQ form straight from the maps; a RocketMQ
pull needs more of each record (its commit-log position, which is the
physical offset in RocketMQ's message id, and its store and born times), and
CONSUMER_SEND_MSG_BACK / VIEW_MESSAGE_BY_ID look a record up by that position.
``MessageStore.read_records``, ``record_at`` and ``offset_by_time`` delegate here,
passing the commit log and the partition's index (or the written position).
``TimeSearch`` is ``offset_by_time`` one map read at a time, so that the text
port's ``offset_at`` can bring each cold page in off its event loop.
No sockets, threads or clock.
"""

import struct

from metaq.errors import CorruptRecord, Moved, NotFound
from metaq.limits import MAX_NAME_BYTES
from metaq.store.limits import ID_SCAN_STEP_BYTES
from metaq.store.index import UNIT, UNIT_SIZE
from metaq.store.record import TOPIC_START, check_record, decode_record, record_is, record_ok

#: store_ts_ms of a record (PREFIX field at byte 24).
_STORE_TS = struct.Struct(">q")
assert _STORE_TS.size == 8
_STORE_TS_AT = 24
#: topic_len (PREFIX field at byte 40) and the msgId's place in MetaQ's HEADER (msgLen, checksum, msgId, flag).
_TOPIC_LEN, _TOPIC_LEN_AT = struct.Struct(">h"), 40
_MSG_ID, _MSG_ID_IN_HEADER = struct.Struct(">q"), 8


def read_records(log, p, offset, max_count, max_bytes):
    """``(records, next_offset)``: up to ``max_count`` whole records (``LogRecord`` with ``position``) of
    partition ``p`` (None: a legal one without data) of ``log`` from ``offset``, at most ``max_bytes`` of
    them but at least one.

    Same bounds as ``MessageStore.read``: Moved below the minimum or past the
    visible maximum; ``([], offset)`` at the visible end. Each record is checked (``check_record``, its CRC
    included) before it is decoded: the records before a corrupt one are returned, and a read that starts at
    it raises ``CorruptRecord`` (never a corrupt record served).
    """
    if p is None:
        if offset == 0:
            return [], 0
        raise _moved(0)
    vis = p.visible
    if offset >= vis:
        if offset == vis:
            return [], offset
        raise _moved(vis)
    if offset < p.min:
        raise _moved(p.min)
    records = []
    nbytes = 0
    hi = min(vis, offset + max(1, max_count))
    for n, phys, size, _tag in p.units(offset, hi):
        if records and nbytes + size > max_bytes:
            break
        seg = log.segment_at(phys)
        rel = phys - seg.start if seg is not None else 0
        if (seg is None or size <= 0 or not record_ok(seg.view, rel, size)
                or not record_is(seg.view, rel, size, p.topic_bytes, p.partition, n)):
            if records:  # never a corrupt record, nor one its (damaged) unit does not name
                break
            raise CorruptRecord(p.topic, p.partition, n, n + 1, phys)
        records.append(decode_record(seg.view, rel, position=phys))
        nbytes += size
    return records, offset + len(records)


def record_at(log, written, position):
    """The ``LogRecord`` starting at ``position`` of ``log`` (written up to ``written``); NotFound when no valid
    record starts there."""
    seg = log.segment_at(position) if position >= 0 else None
    if seg is None or position >= written:
        raise NotFound("no message at commit-log offset %d" % position)
    rel = position - seg.start
    limit = min(seg.end, written) - seg.start
    if not check_record(seg.view, rel, limit):
        raise NotFound("no message starts at commit-log offset %d" % position)
    return decode_record(seg.view, rel, position=position)


def _record_view(log, p, n):
    """``(segment view, position in it)`` of partition ``p``'s record ``n`` by its index unit, or None."""
    f = p.file_for(n)
    if f is None:
        return None
    phys = UNIT.unpack_from(f.mm, (n - f.start) * UNIT_SIZE)[0]
    seg = log.segment_at(phys)
    if seg is None:
        return None
    return seg.view, phys - seg.start


def head_ranges(log, p, n):
    """``[(MappedFile, start, end)]``: what ``msg_id_at`` reads for partition ``p``'s record ``n``, to bring in
    first when cold: its index unit when that is not resident, else its header in the log up to the message id (a
    topic of the longest name assumed); [] when ``n`` is not held. So two rounds of bringing in cover both."""
    if p is None or not p.min <= n < p.visible:
        return []
    f = p.file_for(n)
    if f is None:
        return []
    unit = (n - f.start) * UNIT_SIZE
    if not f.file.resident(unit):
        return [(f.file, unit, unit + UNIT_SIZE)]
    phys = UNIT.unpack_from(f.mm, unit)[0]
    seg = log.segment_at(phys)
    if seg is None:
        return []
    rel = phys - seg.start
    return [(seg.file, rel, min(seg.size, rel + TOPIC_START + MAX_NAME_BYTES + _MSG_ID_IN_HEADER + _MSG_ID.size))]


def msg_id_at(log, p, n):
    """The message id of partition ``p``'s (None: one without data) visible record ``n``, read from its header
    alone (no CRC check: a get's ``expect`` compares it, events.Get); None when ``n`` is not held."""
    if p is None or not p.min <= n < p.visible:
        return None
    found = _record_view(log, p, n)
    if found is None:
        return None
    view, rel = found
    if rel + TOPIC_START > len(view):
        return None
    at = rel + TOPIC_START + _TOPIC_LEN.unpack_from(view, rel + _TOPIC_LEN_AT)[0] + _MSG_ID_IN_HEADER
    return _MSG_ID.unpack_from(view, at)[0] if at + _MSG_ID.size <= len(view) else None


def store_ts_at(log, p, n):
    """The store time (ms) of partition ``p``'s visible record ``n``, read from its header alone (no CRC check, no
    copy: a ``get_prio`` compares its levels' heads by it), or None when ``n`` is not held; ``head_ranges`` names
    what it reads."""
    if p is None or not p.min <= n < p.visible:  # deleted, cut or retained while its pages were brought in
        return None
    found = _record_view(log, p, n)
    if found is None:
        return None
    view, rel = found
    return _STORE_TS.unpack_from(view, rel + _STORE_TS_AT)[0]


def offset_by_time(log, p, timestamp_ms, upper=False):
    """The offset of partition ``p`` (None: one without data) of ``log`` of the first message stored at or
    after ``timestamp_ms`` (the visible maximum if none); with ``upper``, the last one stored at or before it
    (the minimum if none).

    Store times grow with offsets within a partition, so this is a binary search over the index.
    """
    if not upper:
        search = TimeSearch(log, p, timestamp_ms)
        while not search.done:
            search.step()
        return search.result
    if p is None:
        return 0
    lo, hi = p.min, p.visible
    while lo < hi:  # first offset stored after timestamp_ms
        mid = (lo + hi) // 2
        ts = store_ts_at(log, p, mid)
        if ts is not None and ts > timestamp_ms:
            hi = mid
        else:
            lo = mid + 1
    return max(p.min, lo - 1)


class TimeSearch:
    """``offset_by_time`` (not ``upper``) one map read at a time.

    Each ``step()`` reads one thing: the index unit of the probe, then the store time of its record.
    ``need()`` names what the next step reads, ``(MappedFile, start, end)`` (None when it reads no map), so a
    caller can bring a cold page in first (``MappedFile.populate`` in a worker thread) and keep the disk read
    off its event loop. Between steps the partition may change (appends, retention, a cut): a unit or record
    that is gone counts as older than the time, and ``result`` stays within the partition as it is then.
    """

    def __init__(self, log, p, timestamp_ms):
        self._log, self._p, self._ts = log, p, timestamp_ms
        self.lo, self.hi = (0, 0) if p is None else (p.min, p.visible)
        self._record = None  # (segment, position in it) of the probe's record, once its unit is read

    @property
    def done(self):
        return self.lo >= self.hi

    @property
    def result(self):
        """The answer once ``done``."""
        p = self._p
        return self.lo if p is None else max(p.min, min(self.lo, p.visible))

    def need(self):
        """``(MappedFile, start, end)``: the bytes the next ``step`` reads; None when it reads no map."""
        if self.done:
            return None
        if self._record is not None:
            seg, rel = self._record
            return seg.file, rel + _STORE_TS_AT, rel + _STORE_TS_AT + _STORE_TS.size
        mid = (self.lo + self.hi) // 2
        f = self._p.file_for(mid)
        if f is None:
            return None
        at = (mid - f.start) * UNIT_SIZE
        return f.file, at, at + UNIT_SIZE

    def step(self):
        """One read: the probe's index unit, or the store time of its record (which decides the probe)."""
        mid = (self.lo + self.hi) // 2
        if self._record is None:
            f = self._p.file_for(mid)
            seg = None
            if f is not None:
                phys = UNIT.unpack_from(f.mm, (mid - f.start) * UNIT_SIZE)[0]
                seg = self._log.segment_at(phys)
            if seg is None:
                self._decide(mid, None)
            else:
                self._record = (seg, phys - seg.start)
            return
        seg, rel = self._record
        self._record = None
        self._decide(mid, _STORE_TS.unpack_from(seg.view, rel + _STORE_TS_AT)[0])

    def _decide(self, mid, ts):
        if ts is not None and ts >= self._ts:
            self.hi = mid
        else:
            self.lo = mid + 1


def _moved(offset):
    return Moved(offset, "offset out of range: go to %d" % offset)


def msg_ids_since(log, written, position, skip_topic=None, among=None):
    """Ids of every record from log ``position`` to ``written`` (see ``MessageStore.msg_ids_since``)."""
    return IdScan(log, written, position, skip_topic, among).run()


class IdScan:
    """``msg_ids_since`` a step at a time (at most ``limits.ID_SCAN_STEP_BYTES`` of log a step), so that a caller on
    an event loop can yield between steps and bring each step's cold pages in off it first (``need``, as
    ``TimeSearch``). ``found``: the ids so far (all of them once ``done``)."""

    def __init__(self, log, written, position, skip_topic=None, among=None):
        self._log, self._written, self._skip, self._among = log, written, skip_topic, among
        first = log.start
        self.pos = max(position, first if first is not None else written)
        self.found = set()

    @property
    def done(self):
        return self.pos >= self._written or self._log.segment_at(self.pos) is None

    def need(self):
        """``(MappedFile, start, end)``: the bytes the next ``step`` reads; None when done."""
        seg = None if self.done else self._log.segment_at(self.pos)
        if seg is None:
            return None
        rel = self.pos - seg.start
        return seg.file, rel, min(seg.end, self._written, self.pos + ID_SCAN_STEP_BYTES) - seg.start

    def run(self):
        """Every step at once: the ids."""
        while not self.done:
            self.step()
        return self.found

    def step(self):
        """Scan on from ``pos`` up to ``ID_SCAN_STEP_BYTES`` further (or the segment's end)."""
        seg = self._log.segment_at(self.pos)
        if seg is None:
            return
        limit = min(seg.end, self._written) - seg.start
        stop = min(limit, self.pos - seg.start + ID_SCAN_STEP_BYTES)
        rel = self.pos - seg.start
        skip, among, found = self._skip, self._among, self.found
        while rel < stop:
            total = check_record(seg.view, rel, limit)
            if not total:  # a blank tail: continue in the next segment
                rel = seg.end - seg.start
                break
            rec = decode_record(seg.view, rel)
            if rec.topic != skip and (among is None or rec.msg_id in among):
                found.add(rec.msg_id)
            rel += total
        self.pos = seg.start + rel
