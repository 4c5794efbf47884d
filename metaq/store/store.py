"""``MessageStore``: the facade the server uses (commit log + indexes + recovery + retention).

Threading: every method runs on the event-loop thread except the ones marked BLOCKING (``flush_log``, ``checkpoint``
(which also gives cold maps' pages back: coldmaps.py), ``prepare_ahead``), which the server runs in a worker thread
while the loop keeps appending. They work on snapshots (``layout`` tuples, ints) and never close a map; retention
only deletes segments that are flushed and covered by a checkpoint, so a running flush never meets them.
``prepare_ahead`` publishes with single attribute assignments (``ahead.py``). ``close`` must not run while a BLOCKING
call runs in a worker. The derived indexes follow the log through one ``LogFollower`` (follower.py), stepped at one
point, ``follow_log``. Time comes as ``now_ms``."""

import logging
import random
import struct
from operator import attrgetter

from metaq.errors import ClientError, CorruptRecord, DiskFull, InvalidTopic, Moved, NotFound, UnknownTopic
from metaq.limits import validate_partition
from metaq.filters.limits import MAX_FILTER_SCAN_UNITS
from metaq.keys.limits import KEY_INDEX_STEP_BYTES
from metaq.store import batch, gather, lookup, recovery, replica, unitcheck
from metaq.store.ahead import AheadWork
from metaq.store.coldmaps import ColdMaps
from metaq.store.commitlog import CommitLog
from metaq.store.config import TopicTable
from metaq.store.epochs import EpochHistory
from metaq.store.files import (CHECKPOINT_MAGIC, CLEAN_MAGIC, DISK_FULL_ERRNOS, TOPIC_OWNERS_MAGIC, DataDir,
                               disk_usage)
from metaq.protocol.journaltopic import MQTT_INBOX_TOPIC, MQTT_SESSIONS_TOPIC, POP_TOPIC, TX_TOPIC
from metaq.store.index import TAG_FORMAT, UNIT, UNIT_SIZE, PartitionIndex
from metaq.store.partitions import Partitions
from metaq.store.follower import LogFollower
from metaq.store.msgid import IdGenerator
from metaq.store.positions import LogPositions
from metaq.store.quota import TopicQuota
from metaq.store.readcount import ReadCounts
from metaq.store.record import FIXED_OVERHEAD, TOPIC_START, RecordTooLarge, tag_hash, write_record
from metaq.store.results import DiskState, PartitionStats, PutResult, ReadResult
from metaq.store.retention import apply_retention

_new_tuple = tuple.__new__

log = logging.getLogger(__name__)


class MessageStore:
    """Open with ``MessageStore.open(config, now_ms, features)`` (``metaq.storestate.open_store``); see DESIGN §4."""

    def __init__(self, config, features, producer_quota=None, offsets_quota=None):
        """``features``: a ``FeatureState``, the makers of the features' state the store holds (features.py);
        ``producer_quota(user)``: the idempotent producer windows a user may hold (``idempotence.window``; None: no
        quota per user); ``offsets_quota(user, held)``: raises when a user may not own one more committed offset
        (``offsets.table``)."""
        self.config = config
        self._features = features
        self.dirs = DataDir(config.data_dir)
        configured = TopicTable(config.topics)  # the config file's names; the table wins (topics/table.py)
        self._topics = features.topic_catalog(configured, config.data_dir)
        self._quota = TopicQuota(config.max_topics, config.max_partitions, configured.exact_names,
                                 uncounted=(TX_TOPIC, POP_TOPIC, MQTT_SESSIONS_TOPIC, MQTT_INBOX_TOPIC))
        self._owners_saved = 0  # the topic owners' version last written (quota.py)
        self._log = CommitLog(self.dirs, config.segment_size)
        self._parts = Partitions(self.dirs, config.index_file_units, self._quota)  # every index, and which take puts
        self._last_writer = None  # the PartitionIndex of the last put
        self._async = config.flush == "async"
        self._max_record = config.segment_size
        self._pos = LogPositions(self._async)  # written / flushed / checkpointed (positions.py)
        self._checkpoint_serial = self._checkpointed = self._ids = self._index_problem = None
        #: the burst path's writer; its ``refusal`` is the store's: why writes are refused now (``check_disk``)
        self._burst = batch.BurstWriter(self._log, self._parts.writer, self._pos)
        self._last_flush_ms = 0
        self.disk_state = None  # the latest check_disk() result (a roll's check or the broker's loop)
        self._closed = True
        self._ahead = AheadWork(self._log, lambda: self._pos.written, self.dirs.root, config.disk_danger_ratio)
        self._replica = replica.LogAccess(self._log, self._pos, self._parts, self._index_tail,
                                          self.check_disk, config.segment_size)
        self.recovery = None
        self.topics = features.topic_ops(self.dirs, self._topics, self._parts, self._quota,
                                        self._forget_writers)  # create/alter/delete (topics/state.py)
        self.consumer_offsets = features.consumer_offsets(self.dirs, quota=offsets_quota)
        self.groups = features.group_table(config.data_dir)  # per-group settings (groups/table.py)
        self.epochs = EpochHistory(self.dirs)
        self.reads = ReadCounts()  # log bytes read, corrupt reads (readcount.py; stats)
        self.cold_maps = ColdMaps(self.reads)  # when the maps of cold pages give them back (coldmaps.py)
        self.keys = features.key_index(self.dirs, config.key_index_slots, config.key_index_entries)  # keys/index.py
        self.follower = LogFollower(self._log)  # the derived indexes' one way to follow the log (follower.py)
        self.idempotence = features.idempotence(self.dirs.root, self._log, self._parts.get, self.put,
                                                lambda: self._pos.written, int(config.producer_ttl_s * 1000),
                                                producer_quota)  # put_idem's windows (idempotence.py)

    # -- open / close --------------------------------------------------------

    @classmethod
    def open(cls, config, now_ms, features, producer_quota=None, offsets_quota=None):
        """Lock the data dir, recover, write a fresh checkpoint; raises CorruptLog, StoreError, DiskFull. ``features``
        is a ``FeatureState`` (``metaq.storestate.open_store`` passes the features' own)."""
        self = cls(config, features, producer_quota, offsets_quota)
        self.dirs.create()
        self.dirs.acquire_lock()
        self._closed = False
        try:
            self._topics.table.load()
            self.groups.load()
            self._log.load()
            self._load_partitions()
            self.recovery, last_id = self._recover()
            self.topics.finish_open()
            self._topic_retention(now_ms, {})
            self._ids = self._burst.ids = IdGenerator(config.broker_id, last_id)
            self.follower.add(self.keys, self._pos.written)
            self.follower.add(self.idempotence, self._pos.written)
            self.follower.step(self._pos.flushed, self._pos.written)  # the tail the saved states do not cover
            self.idempotence.live = self.idempotence.position >= self._pos.written  # its replay is done
            self._last_flush_ms = now_ms
            self.consumer_offsets.load()
            owners = self.dirs.read_state(self.dirs.topic_owners, TOPIC_OWNERS_MAGIC)
            self._quota.load_owners(owners.get("owners") if owners else None)
            self._owners_saved = self._quota.owners_version
            self.epochs.load(self._pos.written)
            self._first_checkpoint(now_ms)
        except BaseException:
            self._release()
            raise
        return self

    def _first_checkpoint(self, now_ms):
        """The checkpoint after recovery. On a full disk (a broker that crashed or stopped with its disk full) the
        last checkpoint stays in its place when it claims nothing recovery took back (its position is within the
        recovered log): a crash now recovers from it again, as the last one did; the broker starts, so that
        retention can free its oldest segments (docs/operating.md "Disk"), and the next checkpoint tries again.
        Anything else (another error, or a checkpoint past the recovered end) fails the start as before."""
        try:
            self.checkpoint(now_ms)
        except OSError as exc:
            if exc.errno not in DISK_FULL_ERRNOS:
                raise
            cp = recovery.read_checkpoint(self.dirs)
            kept = cp.position if cp is not None else (self._log.start or 0)
            if kept > self._pos.written:
                raise DiskFull("disk full: cannot write the checkpoint after recovery (%s), and the last one claims "
                               "log the recovery cut; free space and start again" % exc.strerror) from None
            self._pos.checkpointed_at(min(self._pos.checkpointed, kept))
            self._checkpointed = None  # the next checkpoint writes, whatever it would say
            log.warning("disk full: the checkpoint after recovery was not written (%s); the last one (position %d) "
                        "stays and the next checkpoint tries again", exc.strerror, kept)

    def close(self, now_ms, clean=True):
        """Flush log and indexes, checkpoint, mark a clean shutdown (if ``clean``), unmap, unlock."""
        if self._closed:
            return
        try:
            self.mark_flushed(self.flush_log())
            self.follower.step(self._pos.flushed, self._pos.written)  # the whole tail: the checkpoint covers it
            self.checkpoint(now_ms)
            if clean:
                self.dirs.write_state(self.dirs.clean_shutdown, CLEAN_MAGIC,
                                      {"end": self._pos.written, "last_msg_id": self._last_id(),
                                       "checkpoint_serial": self._checkpoint_serial})
        finally:
            self._release()

    def abandon(self):
        """Let go of everything without flushing or marking (tests and tools: as after a kill -9)."""
        self._release(discard_prepared=False)

    def _release(self, discard_prepared=True):
        self._closed = True
        self._parts.close_all(discard_prepared)
        self._log.close(discard_prepared)
        self.follower.close()
        self._ahead.hot.clear()
        self._last_writer = None
        self.dirs.release_lock()

    def _load_partitions(self):
        for topic, partition in self.dirs.list_partitions():
            p = PartitionIndex(self.dirs, topic, partition, self.config.index_file_units)
            problem = p.load()
            if problem and self._index_problem is None:
                self._index_problem = problem
            self._parts.add(p)

    def _forget_writers(self, topic):
        self._last_writer = None
        for key in [k for k in self._ahead.hot if k[0] == topic]:
            del self._ahead.hot[key]

    # -- recovery ------------------------------------------------------------

    def _recover(self):
        """Run recovery (``recovery.recover``); returns ``(RecoveryReport, last message id or None)``."""
        report, last_id, end = recovery.recover(self.dirs, self._log, self._parts, self._parts.make,
                                                self._index_problem, self.config.force_recovery)
        self._pos.start_at(end)  # durable and checkpointed there too: open() writes a checkpoint next
        return report, last_id

    # -- topics --------------------------------------------------------------

    def partitions_of(self, topic):
        """Partition count of ``topic``; raises InvalidTopic or UnknownTopic."""
        return self._topics.partitions_of(topic)

    def known_topics(self):
        """Configured exact names, the table's and every topic that has data (a priority topic's levels are its own,
        not topics: docs/messaging.md "Priorities")."""
        names = set(self._topics.config.exact_names) - set(self._topics.table.deleted) | set(self._topics.table.entries)
        return sorted(names | {t for t, _p in self.partition_keys() if self._topics.level_owner(t) is None})

    def partitions_made(self):
        """A count that moves whenever a partition appears here (a topic or a partition written for the first time,
        a topic an admin created) or a topic's partitions go (a topic deleted): a reader of topics that may not exist
        yet, or may be gone, looks again when it moved (``on_partitions_made`` tells of each move as it happens)."""
        return self._parts.made

    def on_partitions_made(self, fn):
        """``fn()`` whenever ``partitions_made`` moves, as it moves (``PartitionWaiters.partitions_made``: the next
        wake names ``NEW_PARTITION``, with no look at the count per wake)."""
        self._parts.made_listeners.append(fn)

    def partition_keys(self):
        """``[(topic, partition)]`` that have received messages."""
        return sorted(k for k, p in self._parts.items() if p.max > 0)

    def _writer(self, topic, partition):
        self.check_creatable(topic, partition)
        return self._parts.hold_writer(topic, partition)

    def hold_partition(self, topic, partition):
        """Make ``topic``-``partition`` writable now (raising what a put would), so a later append meets no limit."""
        if self._parts.writer((topic, partition)) is None:
            self._writer(topic, partition)

    def claim_topic(self, topic, user, check):
        """``user``'s put is about to go to ``topic``: when the store does not hold it yet, count it as the
        user's, or raise QuotaExceeded past the user's ``topics`` / ``partitions`` quota (quota.py)."""
        if self._quota.settled(topic):
            return
        try:
            partitions = self._topics.partitions_of(topic)
        except (UnknownTopic, InvalidTopic):
            return  # the put itself is refused, naming why
        self._quota.claim(topic, user, partitions, check)

    def topic_owners(self):
        """``{user: (topics, partitions)}`` its puts created (quota.py; stats)."""
        return self._quota.held()

    def owned_topics(self):
        """``(version, [(topic, user, partitions)])``: each topic a user's put created, and the version of the owners
        they reflect (it moves with every change: replication sends them again then)."""
        return self._quota.owners_version, self._quota.owned()

    def replace_topic_owners(self, rows):
        """A slave: the master's ``[(topic, user, partitions)]`` become our owners (saved by the next checkpoint)."""
        self._quota.replace_owners(rows)

    def check_creatable(self, topic, partition):
        """Raise what a put to ``topic``-``partition`` would (see quota.py) before anything is stored."""
        validate_partition(partition, self._topics.partitions_of(topic))
        self._topics.check_writable(topic)
        if (topic, partition) not in self._parts:
            self._quota.check(topic, partition)

    def _reader(self, topic, partition):
        """The partition to read, or None for a legal one without data; raises NotFound."""
        p = self._parts.get((topic, partition))
        if p is not None:
            return p
        try:
            count = self._topics.partitions_of(topic)
        except UnknownTopic:
            count = 0
        if not isinstance(partition, int) or not 0 <= partition < count:
            raise NotFound("The topic `%s` in partition `%s` is not exists" % (topic, partition))
        return None

    # -- put -----------------------------------------------------------------

    def put(self, topic, partition, flag, data, now_ms, born_ms=None, checksum=None, msg_id=None):
        """Append one message; returns PutResult. partition -1 lets the store pick one at random. ``checksum``:
        ``metaq_checksum(data)`` if the caller verified it (stored as given); None/negative: computed. ``msg_id``: an
        id from ``new_msg_id`` (transaction commits record ids before appending); None: a new one. Raises
        InvalidTopic, UnknownTopic, InvalidPartition, TopicLimit, RecordTooLarge, DiskFull."""
        if self._burst.refusal is not None:
            self._recheck_disk()
        if partition == -1:
            partition = random.randrange(self._topics.partitions_of(topic))
        p = self._last_writer  # most puts go where the previous one went: no tuple, no hashing
        if p is None or partition != p.partition or topic != p.topic:
            p = self._parts.writer((topic, partition))
            if p is None:
                p = self._writer(topic, partition)
            self._last_writer = p
        tb = p.topic_bytes
        total = FIXED_OVERHEAD + len(tb) + len(data)
        if total > self._max_record:
            raise _too_large(total, self._max_record)
        off = p.max
        if off < p.fast_end:
            t = p.tail
        else:
            t = self._index_tail(p, off)  # before the record: a full disk never leaves a record without its unit
        seg = self._log.active
        pos = self._pos.written
        if seg is None or pos - seg.start + total > seg.ready:
            seg = self._make_room(pos, total, now_ms)
            if pos < seg.start:
                pos = seg.start
        if msg_id is None:
            msg_id = self._ids.next_id(now_ms)
        try:
            write_record(seg.view, pos - seg.start, tb, partition, off, now_ms,
                         now_ms if born_ms is None else born_ms, msg_id, flag, data, p.head, checksum)
        except (struct.error, TypeError, ValueError) as exc:
            seg.file.zero(pos - seg.start, min(seg.size, pos - seg.start + total))
            raise ClientError("cannot store the message: %s" % exc) from None
        UNIT.pack_into(t.mm, (off - t.start) * UNIT_SIZE, pos, total, tag_hash(flag, data) if flag & 1 else 0)
        end = self._pos.advance(p, off, pos + total, total)
        return _new_tuple(PutResult, (msg_id, partition, off, end))

    def put_idempotent(self, topic, partition, flag, data, now_ms, pid, seq, born_ms=None, owner=None):
        """``put_idem`` by user ``owner``: ``(PutResult, record position, duplicate)`` (a duplicate's: the
        original's)."""
        return self.idempotence.put(topic, partition, flag, data, now_ms, pid, seq, born_ms, owner)

    def put_idempotent_prepared(self, topic, partition, flag, data, now_ms, pid, seq, checksum, owner=None):
        return self.idempotence.put_prepared(topic, partition, flag, data, now_ms, pid, seq, checksum,
                                             owner)  # the burst path

    def check_idempotent_batch(self, topic, frames, owner=None):
        """Raise unless a ``putb_idem`` batch may be stored (``Idempotence.check_batch``)."""
        self.idempotence.check_batch(topic, frames, owner)

    def put_idempotent_run(self, frames, src, now_ms, owner=None):
        """``put_burst`` of one producer's next sequences (``Idempotence.put_run``); ``(0, [])`` if not next."""
        return self.idempotence.put_run(frames, src, now_ms, self.put_burst, owner)

    def put_burst(self, frames, src, now_ms):
        """Append a scanned burst's leading puts in one pass: ``(taken, runs)`` (``batch.BurstWriter.append``); the
        rest is for ``put``."""
        return self._burst.append(frames, src, now_ms)

    def _index_tail(self, p, off):
        """The index file for unit ``off`` (creating it if needed); sets ``p.fast_end`` for the next puts."""
        t = p.tail
        if t is None or not t.start <= off < t.end:
            t = p.reserve(off)
        mid = (t.start + t.end) // 2
        if off < mid:
            p.fast_end = mid
        else:  # past the middle: time to prepare the next file
            p.fast_end = t.end
            self._ahead.hot[p.key] = p
        return t

    def _make_room(self, pos, total, now_ms):
        seg = self._log.active
        if seg is None or pos - seg.start + total > seg.size:  # a new segment is needed
            state = self.check_disk()
            if state.refusing_writes:
                raise DiskFull(state.reason)
        seg = self._log.make_room(pos, total, now_ms)
        if self._log.stale_next() is not None:  # a roll went on without the prepared segment (not ready yet):
            self._ahead.check_at = 0  # the worker is asked again at once, and deletes it rather than hold its disk
        return seg

    def check_room(self, nbytes, units, largest):
        """DiskFull unless ``nbytes`` of records (``units``: partition key -> how many; none over ``largest``) fit now,
        segments and index files included: a transaction's commit asks before its first append (refused whole)."""
        need = self._log.bytes_to_allocate(self._pos.written, nbytes, largest)
        need += sum(self._parts[k].bytes_to_hold(n) for k, n in units.items() if k in self._parts)
        state = self.check_disk() if need else None
        if state is not None and (state.refusing_writes or state.free_bytes < need):
            raise DiskFull(state.reason or "%d bytes of disk are needed, %d free" % (need, state.free_bytes))

    def _recheck_disk(self):
        state = self.check_disk()
        if state.refusing_writes:
            raise DiskFull(state.reason)

    def check_disk(self):
        """Measure the data dir's filesystem (``files.disk_usage``: df's fraction); above the danger mark puts are
        refused. The result is also kept as ``disk_state``, the latest measurement whoever asked for it."""
        cfg = self.config
        self.disk_state = DiskState.of(disk_usage(self.dirs.root), cfg.disk_danger_ratio, cfg.disk_warn_ratio,
                                       cfg.segment_size)
        self._burst.refusal = self.disk_state.reason or None
        return self.disk_state

    def prepare_ahead(self):
        """BLOCKING (in a worker thread, one call at a time): prefault the active segment ahead of the write
        position, build the next segment once the active one is half full and the next index file of partitions past
        the middle of theirs. Safe while the loop keeps calling put and read. True if it did any work."""
        if self._closed:
            return False
        did = self._ahead.run()
        if self._closed:  # close() did not wait for us (it should): do not leave what we built
            self._log.close()
            self._parts.close_all()
        return did

    def wants_preparation(self):
        """Loop thread, cheap (one comparison in the common case): True when ``prepare_ahead`` has work."""
        ahead = self._ahead
        if self._pos.written < ahead.check_at and not ahead.hot:
            return False
        return not self._closed and ahead.wanted()

    # -- read ----------------------------------------------------------------

    def read(self, topic, partition, offset, max_size):
        """Whole records from ``offset`` totalling at most ``max_size`` bytes (at least one record). Raises Moved(min)
        below the minimum, Moved(max) past the visible maximum, NotFound for an unknown topic or partition."""
        if topic in self.topics.guarded:  # read-protected or deleted (topics/table.py)
            self._topics.check_readable(topic)
        p = self._parts.get((topic, partition))
        if p is None:
            p = self._reader(topic, partition)
            if p is None:
                if offset == 0:
                    return ReadResult([], 0, 0, 0)
                raise _moved(0)
        vis = p.visible
        if offset >= vis:
            if offset == vis:
                return ReadResult([], 0, 0, offset)
            raise _moved(vis)
        if offset < p.min:
            raise _moved(p.min)
        views, nbytes = self._repairing(p, lambda: gather.collect_views(
            self._log, p, offset, vis, min(max_size, self.config.max_transfer_size)))
        self.reads.log_read_bytes += nbytes + len(views) * (len(p.topic_bytes) + TOPIC_START)
        return ReadResult(views, nbytes, len(views), offset + len(views))

    def _repairing(self, p, read):
        """``read()``; when it meets a unit that does not name its record and ``unitcheck.repair_resident`` rebuilds it
        from the log on the spot (nothing read from the disk), ``read()`` once more. A corrupt record is counted and
        raised (never served)."""
        try:
            return read()
        except CorruptRecord as exc:
            if p is None or not unitcheck.repair_resident(self._log, p, exc.offset, self._pos.written):
                raise self.reads.corrupt(exc) from None
        try:
            return read()
        except CorruptRecord as exc:
            raise self.reads.corrupt(exc) from None

    def read_joined(self, topic, partition, offset, max_size, mapped=False):
        """As ``read``, but ``views`` holds the records' MetaQ forms joined (one bytes per segment): for the wire.
        ``mapped``: one ``gather.MappedRecords`` per segment instead (checked in place, sent from the map)."""
        p = self._parts.get((topic, partition))
        if p is None or not p.min <= offset < p.visible or topic in self.topics.guarded:
            return self.read(topic, partition, offset, max_size)  # nothing to gather: the same answer or error
        buffers, nbytes, count = self._repairing(p, lambda: gather.collect_joined(
            self._log, p, offset, p.visible, min(max_size, self.config.max_transfer_size), mapped=mapped))
        self.reads.log_read_bytes += nbytes + count * (len(p.topic_bytes) + TOPIC_START)  # whole records
        return ReadResult(buffers, nbytes, count, offset + count)

    def min_offset(self, topic, partition):
        return getattr(self._reader(topic, partition), "min", 0)

    def record_spans(self, topic, partition, position, end, most):
        """``[(offset, position, size)]`` of the partition's records that start in log ``[position, end)``, in log
        order, at most ``most``: read from its index alone (no log read; loop thread). What a derived index that
        follows one topic uses to find its records without walking the log (timers/follow.py)."""
        p = self._parts.get((topic, partition))
        out = []
        if p is None or most <= 0:
            return out
        for n, phys, size, _tag in p.units(p.first_at_or_after(position, max(p.min, p.first_start), p.max), p.max):
            if phys >= end or len(out) >= most:
                break
            if size:
                out.append((n, phys, size))
        return out

    def record_position(self, topic, partition, offset):
        """The log position of the partition's record ``offset`` (from its index), or None when it holds none."""
        p = self._parts.get((topic, partition))
        if p is None or not p.min <= offset < p.max:
            return None
        unit = p.unit(offset)
        return unit[0] if unit is not None and unit[1] else None

    def max_offset(self, topic, partition):
        """The visible maximum: the offset the next visible message gets."""
        p = self._parts.get((topic, partition))  # a partition with data: no ``_reader`` call (a delivery asks each)
        if p is not None:
            return p.visible
        return getattr(self._reader(topic, partition), "visible", 0)

    def written_offset(self, topic, partition):
        """The written maximum: the offset the next message appended gets (``max_offset`` and beyond it the records
        written and not visible yet: ``sync`` flush, or a slave's copies not flushed)."""
        p = self._parts.get((topic, partition))
        if p is not None:
            return p.max
        return getattr(self._reader(topic, partition), "max", 0)

    def nearest_offset(self, topic, partition, offset):
        p = self._reader(topic, partition)
        return 0 if p is None else max(p.min, min(offset, p.visible))

    def msg_id_at(self, topic, partition, offset, ranges=False, stored_at=False):
        """``lookup.msg_id_at`` at ``offset`` (``stored_at``: ``lookup.store_ts_at``; ``ranges``: ``head_ranges``)."""
        p = self._parts.get((topic, partition))
        return lookup.head_ranges(self._log, p, offset) if ranges else (
            lookup.store_ts_at if stored_at else lookup.msg_id_at)(self._log, p, offset)

    # read through C getters (no Python frame: a writer reads ``log_cuts`` once a turn)
    written_position = property(attrgetter("_pos.written"))
    flushed_position = property(attrgetter("_pos.flushed"))
    log_cuts = property(attrgetter("_pos.cuts"))  # truncations so far (``cut_below``)

    @property
    def log_start(self):
        """The position of the oldest byte the log still holds (the written position when it holds none): no reader
        reaches a record below it."""
        start = self._log.start
        return self._pos.written if start is None else start

    def cut_below(self, seen, pos):
        """Whether the log was cut back before ``pos`` since ``log_cuts`` read ``seen``: a write ending at ``pos``
        that a wait began for is gone (a deposed master's tail), whatever is written there later."""
        return self._pos.cut_below(seen, pos)

    # -- flushing ------------------------------------------------------------

    def flush_log(self):
        """BLOCKING: make the log durable up to the written position at call start; returns it."""
        end = self._pos.written
        start = self._pos.flushed
        if end > start:
            self._log.flush_range(start, end, self._log.segments)
        return end

    def flush_plan(self):
        """``(end, fds)``: fdatasync every fd (the store's own: do not close them) to make the log durable up
        to ``end`` (then ``mark_flushed``); ``(end, [])`` when nothing is to flush; None when ``flush_log``
        must do it (a directory fsync is due). Loop thread; an OSError (EMFILE) is a transient failure."""
        end, start = self._pos.flush_begins()  # a round begins: later appends stay counted as unflushed
        if end <= start:
            return end, []
        fds = self._log.fds_to_flush(start, end, self._log.segments)
        return None if fds is None else (end, fds)

    def mark_flushed(self, pos):
        """Record that the log is durable up to ``pos`` (loop thread, no flush running: the fds of flushed
        segments are closed here); returns the partitions whose visible max advanced."""
        changed = self._pos.flushed_to(pos)
        self._log.release_flushed(self._pos.flushed)
        return changed

    def follow_log(self, max_bytes=KEY_INDEX_STEP_BYTES):
        """A step of the log follower's subscribers (the key index, the timer index, the idempotent producers' state)
        behind the log (loop thread; None: the whole tail); True while more is left and they move."""
        idem, written = self.idempotence, self._pos.written
        if idem.live:  # every append since came through a put path or a replicated chunk, each of which teaches it
            idem.advance(written)  # its own records: nothing to search for (a plain record carries no identity)
        more = self.follower.step(self._pos.flushed, written, max_bytes)
        if not idem.live and idem.position >= written:
            idem.live = True  # caught up with the log it opened (its replay done)
        return more

    def should_flush(self, now_ms):
        """Async policy: flush every ``flush_every_messages`` or ``flush_interval_ms``, whichever first (``sync``:
        whenever the log is written past its flushed end). Asked after every write that became visible
        (``BrokerWrites.visible``); ``_last_flush_ms`` moves to ``now_ms`` whenever it says yes or nothing is left
        to flush."""
        pos = self._pos
        if pos.written <= pos.flushed:
            self._last_flush_ms = now_ms
            return False
        if not self._async:
            return True
        cfg = self.config
        if (pos.unflushed_msgs >= cfg.flush_every_messages
                or now_ms - self._last_flush_ms >= cfg.flush_interval_ms):
            self._last_flush_ms = now_ms
            return True
        return False

    def prepare_checkpoint(self):
        """Loop thread, right before ``checkpoint`` runs in a worker: copy what only the loop changes (the
        idempotent producers' table: idempotence.py), so that the worker writes a consistent snapshot."""
        self.idempotence.capture()

    def checkpoint(self, now_ms, if_changed=False):
        """BLOCKING: msync dirty index files, then record the flushed position as durable for log and index.
        ``if_changed`` (the periodic one): no file rewritten to say what it says already (an idle broker writes
        none)."""
        pos = self._pos.flushed
        floors, dirty = [], False
        for p in list(self._parts.values()):
            floors.append([p.topic, p.partition, p.first_at_or_after(pos, max(p.min, p.first_start), p.max)])
            if p.dirty:
                p.dirty, dirty = False, True
                try:
                    p.flush()
                except BaseException:
                    p.dirty = True  # the next checkpoint tries again; this one claims nothing
                    raise
        last_id = self._last_id()  # ids handed out without an append yet (a commit refused) move it too
        if not if_changed or dirty or self._checkpointed != (pos, last_id, floors):
            serial = random.getrandbits(62)
            self.dirs.write_state(self.dirs.checkpoint, CHECKPOINT_MAGIC,
                                  {"position": pos, "last_msg_id": last_id, "partitions": floors,
                                   "now_ms": now_ms, "serial": serial, "tag_format": TAG_FORMAT})
            self._checkpoint_serial, self._checkpointed = serial, (pos, last_id, floors)
        self._pos.checkpointed_at(pos)
        self.consumer_offsets.save()
        version = self._quota.owners_version
        if version != self._owners_saved:
            self.dirs.write_state(self.dirs.topic_owners, TOPIC_OWNERS_MAGIC, {"owners": self._quota.owners()})
            self._owners_saved = version
        self.follower.checkpoint(if_changed)
        self.drop_cold_pages()
        return pos

    def drop_cold_pages(self):
        """BLOCKING (a worker thread): the maps of the cold log and of each partition's older index files give their
        pages back (coldmaps.py), at each checkpoint, every disk check and whenever ``cold_reads_due``; returns how
        many maps had pages dropped."""
        return self.cold_maps.drop(self._log.segments, list(self._parts.values()), self._pos.flushed)

    def cold_reads_due(self):
        """True once reads took ``COLD_READ_DROP_BYTES`` of records from the log since the cold maps last gave their
        pages back."""
        return self.cold_maps.due()

    def new_msg_id(self, now_ms):
        """A fresh message id, for a caller that must know it before the append (see ``put``)."""
        return self._ids.next_id(now_ms)

    def msg_ids_since(self, position, skip_topic=None, among=None, stepwise=False):
        """Ids of every record from log ``position`` to the written end (BLOCKING: reads the maps): transaction
        recovery's (which commits reached the log), the delay scheduler's (``skip_topic`` its own, ``among`` the
        ids it may have delivered: which were delivered before a crash). ``stepwise``: a ``lookup.IdScan``."""
        scan = lookup.IdScan(self._log, self._pos.written, position, skip_topic, among)
        return scan if stepwise else scan.run()

    # -- replication (the logic and its contract: replica.py) ---------------

    def check_units(self):
        """BLOCKING (a worker thread; no append meanwhile): rebuild from the log the index units at risk that do not
        name their records (unitcheck.py), as recovery does: a slave before each catch-up. Returns how many."""
        return unitcheck.check_units(self._log, list(self._parts.values()), self._pos.written)

    def read_log(self, position, max_bytes, upto="flushed"):
        """Master: ``(memoryview, next_position)``, whole records/blank tails of one segment from ``position``."""
        return replica.read_log(self._replica, position, max_bytes, upto)

    def append_replicated(self, position, data, now_ms, master_segment_size=None):
        """Slave: check, then append a chunk of the master's log at the same positions; returns the new end."""
        end, last_id = self.idempotence.follow(  # the producers' state learns them at once (idempotence/state.py)
            lambda: replica.append_replicated(self._replica, position, data, now_ms, master_segment_size),
            self._follow_idempotence)
        if last_id is not None:
            self._ids.seed(last_id)
        return end

    def truncate_log(self, position, now_ms):
        """Cut the log (and index units) back to the record boundary ``position``; returns a TruncateReport."""
        report = replica.truncate_log(self._replica, position)
        if report.old_end != position:
            self.follower.cut(position)
            self._follow_idempotence()  # the producers' state current at once, as after an append
            self.epochs.truncate(position)  # before the checkpoint: its entries past the cut go even when a full
            self.checkpoint(now_ms)  # disk fails the checkpoint (none is left then: recovery scans the whole log)
        return report

    def follow_now(self, sub):
        """The follower's subscriber ``sub`` learns the log up to its written end now, the others left to the steps
        (a promotion: the transaction journal's branches current before the first request)."""
        while sub.position < self._pos.written:
            before = sub.position
            self.follower.step(self._pos.flushed, self._pos.written, only=sub)
            if sub.position == before:
                break

    def _follow_idempotence(self):
        """The idempotent producers' state learns the log up to its written end now (a slave's apply and cut:
        a promotion may take puts at once), the other subscribers left to the follower's steps."""
        self.follower.step(self._pos.flushed, self._pos.written, only=self.idempotence)

    # -- record lookups for RocketMQ pulls (see lookup.py) -------------------

    def read_records(self, topic, partition, offset, max_count, max_bytes):
        """``(LogRecords with positions, next_offset)`` from ``offset``; bounds as ``read``."""
        if topic in self.topics.guarded:
            self._topics.check_readable(topic)
        p = self._parts.get((topic, partition))
        if p is None:
            p = self._reader(topic, partition)
        records, nxt = self._repairing(p, lambda: lookup.read_records(self._log, p, offset, max_count, max_bytes))
        self.reads.log_read_bytes += sum(r.total_size for r in records)
        return records, nxt

    def read_tagged(self, topic, partition, offset, filt, max_count, max_bytes):
        """A ``TaggedRead`` (filters/reads.py): the records ``filt`` (a TagFilter or a SqlFilter) wants from
        ``offset``; as ``read_records``."""
        if topic in self.topics.guarded:
            self._topics.check_readable(topic)
        p = self._parts.get((topic, partition)) or self._reader(topic, partition)
        read = self._features.read_tagged
        r = self._repairing(p, lambda: read(self._log, p, offset, filt, max_count, max_bytes, MAX_FILTER_SCAN_UNITS))
        self.reads.log_read_bytes += r.log_bytes
        return r

    def tagged_index_ranges(self, topic, partition, offset):
        """``[(MappedFile, start, end)]``: the index bytes ``read_tagged`` from ``offset`` reads (filters/reads.py)."""
        return self._features.index_ranges(self._parts.get((topic, partition)), offset, MAX_FILTER_SCAN_UNITS)

    def record_at(self, position):
        """The record at commit-log ``position``, or NotFound."""
        return lookup.record_at(self._log, self._pos.written, position)

    def offset_by_time(self, topic, partition, timestamp_ms, upper=False):
        """First offset stored at/after ``timestamp_ms`` (``upper``: last at/before it)."""
        return lookup.offset_by_time(self._log, self._reader(topic, partition), timestamp_ms, upper)

    def time_search(self, topic, partition, timestamp_ms):
        """``offset_by_time`` one read at a time (``lookup.TimeSearch``); raises NotFound as it does."""
        return lookup.TimeSearch(self._log, self._reader(topic, partition), timestamp_ms)

    def key_search(self, topic, key, since_ms, until_ms, max_count, cursor=None):
        """A ``keys.index.KeySearch``: one page of the messages of ``topic`` with ``key`` stored in the time window."""
        return self.keys.search(self._log, self._pos.written, topic, key, since_ms, until_ms, max_count, cursor)

    # -- figures (stats and the admin views) -----------------------------------

    def partition_stats(self, topic, partition):
        p = self._reader(topic, partition)
        if p is None:
            return PartitionStats(topic, partition, 0, 0, 0, 0, 0)
        return PartitionStats(topic, partition, p.min, p.visible, p.visible - p.min, self._log_bytes(p),
                              p.size_on_disk())

    def _log_bytes(self, p):
        if p.log_bytes is None:
            p.log_bytes = sum(u[2] for u in p.units(p.min, p.max))
        return p.log_bytes

    def topic_bytes(self, topic):
        """Bytes of the topic's records in the commit log."""
        return sum(self._log_bytes(p) for p in self._parts.of(topic).values())

    def total_messages(self):
        return sum(p.visible - p.min for p in self._parts.values())

    def appended_messages(self):
        """Messages ever appended up to the written end (the sum of the partitions' max offsets; unlike
        ``total_messages`` it ignores retention, so a slave holding the same log has the same figure)."""
        return sum(p.max for p in self._parts.values())

    def log_bytes_on_disk(self):
        return sum(s.size for s in self._log.segments)

    # -- consumer offsets (the broker-side store; see offsets/table.py) -----

    def commit_offset(self, group, topic, partition, offset, now_ms, owner=None):
        """Store a group's next read offset, committed by user ``owner``; InvalidTopic/UnknownTopic/InvalidPartition/
        ClientError on bad input, QuotaExceeded past the user's quota of offsets (``offsets.table``)."""
        validate_partition(partition, self._topics.partitions_of(topic))
        self.consumer_offsets.commit(group, topic, partition, offset, now_ms, self.max_offset(topic, partition),
                                     owner)

    def query_offset(self, group, topic, partition):
        """The group's committed offset for the partition, or None; never past the partition's end (an offset
        copied from a master ahead of this log, or kept across a cut: nothing written there later is skipped)."""
        validate_partition(partition, self._topics.partitions_of(topic))
        offset = self.consumer_offsets.query(group, topic, partition)
        return offset if offset is None else min(offset, self.max_offset(topic, partition))

    def _last_id(self):
        return self._ids.last_id if self._ids is not None else None

    # -- retention -----------------------------------------------------------

    def retention(self, now_ms, disk_usage_ratio=None, floor=None):
        """Delete old (or, under disk pressure, the oldest) sealed segments below ``floor`` and below what the log
        follower's subscribers need kept (``LogFollower.retention_floor``), and their index files."""
        kept = self.follower.retention_floor()
        floor = kept if floor is None else (floor if kept is None else min(floor, kept))
        report = apply_retention(self._log, self._parts.values(), min(self._pos.flushed, self._pos.checkpointed),
                                 self._pos.written, self.dirs.root, self.config, now_ms, disk_usage_ratio, floor)
        report.deleted_index_files.extend(self.follower.log_starts(self._log.start or self._pos.written))
        report.deleted_index_files.extend(self._topic_retention(now_ms, report.raised_min_offsets))
        return report

    def _topic_retention(self, now_ms, raised):
        """Per-topic retention (topics/retention.py): the first offsets of topics with their own retention."""
        return self._features.topic_retention(self._log, self._parts, self._topics.with_levels(), now_ms, raised)


def _too_large(total, limit):
    return RecordTooLarge("message of %d bytes cannot be stored: a record must fit in a %d-byte segment"
                          % (total, limit))


def _moved(offset):
    return Moved(offset, "offset out of range: go to %d" % offset)

