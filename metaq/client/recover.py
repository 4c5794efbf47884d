"""A local journal of messages a consumer's handler could not process (MetaQ's recover store, §5.6).

One append-only file per ``(topic, group)``: ``<directory>/<topic>@<group>.recover``.
Every entry is a frame::

    uint32  length    of the payload
    uint32  crc       zlib.crc32(payload)
    byte[length] payload

and a payload is one of::

    PARK  ">BqBiiqqi" kind=1, seq, present bits, broker_id, partition, offset, msg_id, flag,
          then uint16 topic length + topic (UTF-8) and the message data (attribute block + body)
    DONE  ">Bq"       kind=2, seq of a parked message that was processed since

``present`` says which of partition (1), offset (2), msg id (4) and flag (8) are known.
Appends are fsynced before ``append`` returns, so a parked message survives a crash. On open
the file is scanned: a torn or corrupt tail is ignored with a warning, and when anything was
done or ignored the file is rewritten (temp file, fsync, rename) with only the pending
messages. When the last pending message is marked done the file is emptied.
"""

import logging
import os
import struct
import tempfile
import threading
import zlib

from metaq import errors
from metaq.client.message import Message, Partition
from metaq.limits import validate_group, validate_topic
from metaq.protocol.message import Record

log = logging.getLogger(__name__)

__all__ = ["RecoverStore", "ParkingLot"]

#: Frame header: payload length (uint32), crc32 of the payload (uint32).
FRAME = struct.Struct(">II")
assert FRAME.size == 8

#: A parked message: kind, seq, present, broker_id, partition, offset, msg_id, flag.
PARK = struct.Struct(">BqBiiqqi")
assert PARK.size == 38

#: A message processed since it was parked: kind, seq.
DONE = struct.Struct(">Bq")
assert DONE.size == 9

#: Length prefix of the topic inside a PARK payload.
TOPIC_LEN = struct.Struct(">H")
assert TOPIC_LEN.size == 2

KIND_PARK = 1
KIND_DONE = 2
HAS_PARTITION, HAS_OFFSET, HAS_ID, HAS_FLAG = 1, 2, 4, 8

#: Largest payload a frame may announce (a message is at most 4 MiB + a small header).
MAX_FRAME = 64 << 20


class RecoverStore:
    """Messages parked for a later retry, kept in a local journal that survives restarts.

    ``append(message)`` parks a message and returns its sequence number; ``pending()`` lists
    ``(seq, Message)`` still to process, oldest first; ``mark_done(seq)`` removes one. Safe to
    use from several threads.
    """

    def __init__(self, directory, topic, group):
        self.topic = validate_topic(topic)
        self.group = validate_group(group)
        self.directory = os.path.abspath(os.path.expanduser(str(directory)))
        os.makedirs(self.directory, exist_ok=True)
        self.path = os.path.join(self.directory, "%s@%s.recover" % (topic, group))
        self._lock = threading.Lock()
        self._pending = {}  # seq -> Message, in insertion (= seq) order
        self._next_seq = 1
        self._file = None
        self._open()

    # -- public -----------------------------------------------------------------------------

    def append(self, message):
        """Park ``message`` (fsynced before returning) and return its sequence number."""
        with self._lock:
            self._check_open()
            seq = self._next_seq
            self._next_seq += 1
            self._write(_encode_park(seq, message))
            self._pending[seq] = _copy_message(message)
            return seq

    def pending(self):
        """``[(seq, Message), ...]`` of the parked messages not yet done, oldest first."""
        with self._lock:
            return list(self._pending.items())

    def __iter__(self):
        return iter(self.pending())

    def __len__(self):
        with self._lock:
            return len(self._pending)

    def mark_done(self, seq):
        """Record that parked message ``seq`` was processed; unknown or already done seqs are ignored."""
        with self._lock:
            self._check_open()
            if self._pending.pop(seq, None) is None:
                return
            if self._pending:
                self._write(DONE.pack(KIND_DONE, seq))
            else:
                self._rewrite()  # nothing pending: start again from an empty file

    def close(self):
        """Close the journal file (pending messages stay in it for the next open)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "RecoverStore(%r, pending=%d)" % (self.path, len(self._pending))

    # -- internals --------------------------------------------------------------------------

    def _check_open(self):
        if self._file is None:
            raise ValueError("recover store %s is closed" % self.path)

    def _open(self):
        try:
            with open(self.path, "rb") as f:
                buf = f.read()
        except FileNotFoundError:
            buf = b""
        parked, done, end = _scan(buf, self.topic)
        if end < len(buf):
            self._keep_damaged(buf, end)
        self._pending = {seq: msg for seq, msg in parked.items() if seq not in done}
        self._next_seq = max(list(parked) + list(done) + [0]) + 1
        if done or end < len(buf):
            self._rewrite()
        else:
            self._file = open(self.path, "ab")
        if self._pending:
            log.info("recover store %s: %d parked message(s) pending", self.path, len(self._pending))

    def _keep_damaged(self, buf, end):
        """Warn about bytes the scan could not read; keep a copy when more than a torn last frame is lost."""
        torn = len(buf) - end < FRAME.size or end + FRAME.size + FRAME.unpack_from(buf, end)[0] >= len(buf)
        if torn:
            log.warning("recover store %s: ignored a torn tail of %d bytes at position %d (an append cut short)",
                        self.path, len(buf) - end, end)
            return
        copy = "%s.damaged-%d" % (self.path, end)
        with open(copy, "wb") as f:
            f.write(buf)
        log.warning("recover store %s: unreadable record at position %d, %d bytes ignored; the original file "
                    "was kept as %s", self.path, end, len(buf) - end, copy)

    def _write(self, payload):
        f = self._file
        f.write(FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
        f.flush()
        os.fsync(f.fileno())

    def _rewrite(self):
        """Replace the journal with one holding only the pending messages (atomic rename)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(self.path) + ".", suffix=".tmp", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                for seq, msg in self._pending.items():
                    payload = _encode_park(seq, msg)
                    f.write(FRAME.pack(len(payload), zlib.crc32(payload)) + payload)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        self._file = open(self.path, "ab")


def _copy_message(message):
    msg = Message(message.topic, message.body, message.attribute, message.key)
    msg.id, msg.partition, msg.offset = message.id, message.partition, message.offset
    msg.flag = message.flag
    return msg


def _encode_park(seq, message):
    flag, data = message.encode()
    present = 0
    part = message.partition
    if part is not None:
        present |= HAS_PARTITION
    if message.offset is not None:
        present |= HAS_OFFSET
    if message.id is not None:
        present |= HAS_ID
    if message.flag is not None:
        present |= HAS_FLAG
        flag = message.flag  # keep every flag bit the message came with
    topic = message.topic.encode("utf-8")
    head = PARK.pack(KIND_PARK, seq, present, part.broker_id if part else -1, part.partition if part else -1,
                     message.offset if message.offset is not None else -1,
                     message.id if message.id is not None else -1, flag)
    return b"".join((head, TOPIC_LEN.pack(len(topic)), topic, data))


def _decode_park(payload, default_topic):
    _kind, seq, present, broker_id, partition, offset, msg_id, flag = PARK.unpack_from(payload, 0)
    pos = PARK.size
    (topic_len,) = TOPIC_LEN.unpack_from(payload, pos)
    pos += TOPIC_LEN.size
    topic = bytes(payload[pos : pos + topic_len]).decode("utf-8") or default_topic
    data = bytes(payload[pos + topic_len :])
    msg = Message.from_record(topic, None, None, Record(msg_id, flag, data, 0))
    msg.partition = Partition(broker_id, partition) if present & HAS_PARTITION else None
    msg.offset = offset if present & HAS_OFFSET else None
    msg.id = msg_id if present & HAS_ID else None
    msg.flag = flag if present & HAS_FLAG else None
    return seq, msg


def _scan(buf, topic):
    """``(parked {seq: Message}, done {seq}, end)``: every valid frame of ``buf`` up to the first bad one at ``end``."""
    parked, done = {}, set()
    pos, size = 0, len(buf)
    while size - pos >= FRAME.size:
        length, crc = FRAME.unpack_from(buf, pos)
        start = pos + FRAME.size
        if length > MAX_FRAME or start + length > size:
            break
        payload = buf[start : start + length]
        if zlib.crc32(payload) != crc or not payload:
            break
        try:
            if payload[0] == KIND_PARK:
                seq, msg = _decode_park(payload, topic)
                parked[seq] = msg
            elif payload[0] == KIND_DONE and len(payload) == DONE.size:
                done.add(DONE.unpack(payload)[1])
            else:
                break
        except (struct.error, ValueError, errors.MetaqError) as exc:  # a valid CRC over a payload we cannot read
            log.warning("unreadable recover record at position %d: %s", pos, exc)
            break
        pos = start + length
    return parked, done, pos


class ParkingLot:
    """Where a consumer puts the messages its handler gave up on, and replays them from.

    With ``dead_letter_topic`` a parked message is first handed to ``put_dead_letter(message,
    topic)`` (which raises on failure); otherwise, or when that fails, it is appended to the
    topic's :class:`RecoverStore` under ``directory`` (created on first use). ``replay`` gives
    the stored ones to their handlers again and removes those that succeed.
    """

    def __init__(self, directory, group, dead_letter_topic=None, put_dead_letter=None):
        self.directory = directory
        self.group = group
        self.dead_letter_topic = dead_letter_topic
        self.put_dead_letter = put_dead_letter
        self._stores = {}
        self._lock = threading.Lock()

    def store(self, topic):
        """The recover store of ``topic``, opened on first use."""
        with self._lock:
            store = self._stores.get(topic)
            if store is None:
                store = self._stores[topic] = RecoverStore(self.directory, topic, self.group)
            return store

    def open_existing(self, topics):
        """Open the stores of ``topics`` that have a journal from an earlier run (so replay finds them)."""
        for topic in topics:
            if os.path.exists(os.path.join(self.directory, "%s@%s.recover" % (topic, self.group))):
                self.store(topic)

    def park(self, message, stop):
        """Park ``message``; True once it is safe somewhere, False if ``stop`` (an Event) was set first.

        A failing local append (disk full...) is retried with a backoff: a message is never dropped.
        """
        if self.dead_letter_topic and self._to_dead_letter(message):
            return True
        delay = 0.05
        while True:
            try:
                self.store(message.topic).append(message)
                log.warning("parked %s in the recover store", message)
                return True
            except (OSError, ValueError, errors.MetaqError) as exc:
                log.error("cannot park %s in the recover store: %s; retrying", message, exc)
                if stop.wait(delay):
                    return False
                delay = min(delay * 2, 5.0)

    def _to_dead_letter(self, message):
        try:
            where = self.put_dead_letter(message, self.dead_letter_topic)
        except (errors.MetaqError, OSError) as exc:
            log.error("could not put %s to dead-letter topic %s: %s; using the recover store",
                      message, self.dead_letter_topic, exc)
            return False
        log.warning("parked %s in dead-letter topic %s (%s)", message, self.dead_letter_topic, where)
        return True

    def replay(self, handlers, stopping):
        """Give every stored message to ``handlers[topic]`` once; remove the ones that succeed; their count."""
        done = 0
        with self._lock:
            stores = list(self._stores.items())
        for topic, store in stores:
            handler = handlers.get(topic)
            for seq, message in store.pending() if handler else ():
                if stopping.is_set():
                    return done
                try:
                    handler(message)
                except Exception as exc:
                    log.info("parked %s still fails: %r", message, exc)
                    continue
                store.mark_done(seq)
                done += 1
        return done

    def pending(self):
        """``{topic: [Message, ...]}`` of the messages stored and not yet replayed successfully."""
        with self._lock:
            stores = list(self._stores.items())
        return {topic: [m for _seq, m in store.pending()] for topic, store in stores}

    def close(self):
        """Close every store (their pending messages stay on disk)."""
        with self._lock:
            stores, self._stores = list(self._stores.values()), {}
        for store in stores:
            store.close()
