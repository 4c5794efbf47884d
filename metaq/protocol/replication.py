"""Our master→slave replication stream, sans-IO (DESIGN §8; not MetaQ's: MetaQ used a consumer).

The slave connects to the master's replication port. The master speaks first:
CHALLENGE (its fresh nonce, and whether it holds a replication secret). The
slave answers PROOF (its own fresh nonce and, when it holds the secret, its
proof over both nonces and its slave id) then HELLO (its log end and its epoch
history). The master checks the proof before anything else: a missing or
wrong proof gets an ERROR and the close, before a byte of its log leaves. It
then answers PROOF (its own proof over the same nonces and slave id, which the
slave checks before acting on anything: a slave never follows a master that
cannot prove the secret) and EPOCHS (where the two logs agree, and the
master's history: the epoch handshake, ``metaq.store.epochs``), then DATA
frames carrying its commit log from the agreed position (chunks of
``MessageStore.read_log``: whole records and blank tails, each chunk inside one
segment), HEARTBEATs, OFFSETS (its committed consumer offsets: the whole table
once per link, then what changed; ``metaq.protocol.replication_offsets``), or
an ERROR before closing. The slave cuts its log to
the agreed position, then appends and answers ACKs as it appends and flushes.
Both directions use the same framing, so one parser serves both ends. (Which
proof a side sends and accepts, and the refusals when only one side holds a
secret: ``metaq.serving.replication.handshake``; the proofs: ``metaq.auth.proofs``.)

Frame (big-endian)::

    FRAME_HEADER  >4sBBHII   16 bytes
      0  4  magic      b"MQRS"
      4  1  version    4 (version 3 had epoch entries without an origin, version 2 no CHALLENGE/PROOF, version 1
                       no epochs: an older peer gets a clear "unsupported replication stream version" error, on
                       both ends)
      5  1  type       HELLO=1 DATA=2 ACK=3 HEARTBEAT=4 ERROR=5 EPOCHS=6 CHALLENGE=7 PROOF=8 OFFSETS=9
                          TOPICS=10 (the topic table: T_TOPICS below) ROUTES=11 RECORDS=12 (a peer broker's
                          MQTT follow: ``metaq.protocol.replication_mqtt``) PEER_CALL=20 PEER_REPLY=21 (one
                          cluster member's call to another: ``metaq.mqttcluster.clientids.calls``)
      6  2  reserved   0
      8  4  length     payload bytes (checked against the limits before buffering)
     12  4  crc        CRC-32 of header bytes [0, 12) followed by the payload

Payloads::

    HELLO      >iiqqI   slave_id int32, broker_id int32, segment_size int64, start_position int64 (the slave's
                        log end), count uint32; then count x EPOCH_ENTRY: the slave's epoch history
    EPOCHS     >qqI     agreed_position int64 (the slave cuts its log there and the DATA starts there),
                        master_end int64 (the master's written end), count uint32; then count x EPOCH_ENTRY:
                        the master's epoch history
    EPOCH_ENTRY >qqq    epoch int64, start int64 (log position where that epoch's records begin), origin int64
                        (the epoch's random identity, drawn when it began; 0 for the root (0, 0) and for entries
                        from before origins existed: ``metaq.store.epochs``)
    DATA       >q       position int64, then the log bytes (at most ``max_data`` of them)
    ACK        >iqq     slave_id int32, written_position int64 (appended), durable_position int64 (flushed)
    HEARTBEAT  >qqq     position int64 (the master's replicable end), written_position int64 (its written end),
                        message_count int64 (messages in its log up to the written end: the sum of every
                        partition's max offset, the same figure on a slave holding the same log)
    ERROR      >i       code int32 (a MetaQ-style status), then UTF-8 text (at most ``max_error_text`` bytes)
    CHALLENGE  >B       flags uint8 (1: this master holds a replication secret and requires the slave's proof;
                        no other bit may be set), then the master's nonce
    PROOF      >BB      nonce length uint8, proof length uint8, then the nonce (the slave's; none in the
                        master's PROOF: its nonce went in the CHALLENGE), then the proof (none: this side holds
                        no secret)
    OFFSETS    >BI      flags uint8, count uint32, then the entries: ``metaq.protocol.replication_offsets``
    TOPICS              the master's topic table as UTF-8 JSON, with its topics' owners when some have one:
                        ``metaq.protocol.replication_topics``
    ROUTES              a peer broker's MQTT filters and resume positions, sent where a slave sends HELLO (and
                        again when they change): ``metaq.protocol.replication_mqtt``
    RECORDS             the records of the followed topics whose MQTT names a peer's filter matches:
                        ``metaq.protocol.replication_mqtt``
    PEER_CALL  >i       broker_id int32 (the calling master's), then the request as UTF-8 JSON: one broker of an
                        MQTT cluster asking another (``metaq.mqttcluster.clientids.calls``), sent in place of a HELLO
                        after the caller's PROOF (bound to its broker id), and again for each further call on the link:
                        ``metaq.protocol.replication_peer``
    PEER_REPLY          the answer to the PEER_CALL before it, UTF-8 JSON; the first one on a link is preceded by
                        the callee's PROOF (a PEER_CALL or PEER_REPLY holds at most MQTT_CLUSTER_MAX_CALL_BYTES)

A nonce is ``MIN_REPLICATION_NONCE_CHARS``..``MAX_REPLICATION_NONCE_CHARS``
lowercase hex characters, a proof at most ``MAX_REPLICATION_PROOF_CHARS`` of
them (nothing but hex: the proofs join their words with spaces).

A history has 1..``MAX_REPLICATION_EPOCHS`` entries, strictly increasing in
epoch and in start, all fields >= 0. Every fixed-size payload must have exactly its
size; a HELLO or EPOCHS exactly its count of entries. Any violation (magic,
version, type, reserved bits, length over the limit, CRC, a field out of
range, EOF inside a frame) raises ``RemoteProtocolError`` with ``fatal=True``:
a binary stream cannot be resynchronised, so the peer closes the connection
and the slave reconnects and resumes from its own end (nothing partial is
ever handed out: a DATA event is a whole, CRC-checked frame).
"""

import struct
from typing import NamedTuple

from metaq import limits
from metaq.server.replication import limits as replication_limits
from metaq.errors import RemoteProtocolError
from metaq.protocol import replication_offsets as offsets_codec
from metaq.protocol import replication_mqtt as mqtt_codec
from metaq.protocol import replication_peer as peer_codec
from metaq.protocol import replication_topics as topics_codec
from metaq.protocol.checksum import crc32
from metaq.protocol.replication_mqtt import Records, Routes
from metaq.protocol.replication_offsets import Offsets
from metaq.protocol.replication_peer import PeerCall, PeerReply
from metaq.protocol.replication_topics import Topics
from metaq.protocol.stream import CLOSED, NEED_DATA

__all__ = ["Hello", "Epochs", "Data", "Ack", "Heartbeat", "ErrorFrame", "Challenge", "Proof", "Offsets", "Topics",
           "Routes", "Records", "PeerCall", "PeerReply", "ReplicationParser",
           "serialize", "joined",
           "frame_parts", "history_problem", "MAGIC", "VERSION"]

MAGIC = b"MQRS"
VERSION = 4

#: magic, version, type, reserved, length, crc.
FRAME_HEADER = struct.Struct(">4sBBHII")
assert FRAME_HEADER.size == 16
_CRC_COVERS = 12  # header bytes covered by the crc (everything before it)
_CRC = struct.Struct(">I")  # the crc, after them
_NO_HEADER = bytes(FRAME_HEADER.size)  # where ``joined`` writes the header once the payload is in place

#: slave_id, broker_id, segment_size, start_position, count of epoch entries.
HELLO = struct.Struct(">iiqqI")
assert HELLO.size == 28
#: agreed_position, master_end, count of epoch entries.
EPOCHS = struct.Struct(">qqI")
assert EPOCHS.size == 20
#: epoch, start, origin.
EPOCH_ENTRY = struct.Struct(">qqq")
assert EPOCH_ENTRY.size == 24
#: position of the first log byte of a DATA frame.
DATA_HEAD = struct.Struct(">q")
assert DATA_HEAD.size == 8
#: slave_id, written_position, durable_position.
ACK = struct.Struct(">iqq")
assert ACK.size == 20
#: replicable end, written end, message count.
HEARTBEAT = struct.Struct(">qqq")
assert HEARTBEAT.size == 24
#: error code.
ERROR_HEAD = struct.Struct(">i")
assert ERROR_HEAD.size == 4
#: flags (CHALLENGE_SECRET).
CHALLENGE_HEAD = struct.Struct(">B")
assert CHALLENGE_HEAD.size == 1
CHALLENGE_SECRET = 1
#: nonce length, proof length.
PROOF_HEAD = struct.Struct(">BB")
assert PROOF_HEAD.size == 2

T_HELLO, T_DATA, T_ACK, T_HEARTBEAT, T_ERROR, T_EPOCHS, T_CHALLENGE, T_PROOF, T_OFFSETS = 1, 2, 3, 4, 5, 6, 7, 8, 9
#: TOPICS: the master's topic table (topics/table.py) as its JSON file, with the owners of its topics when some have
#: one (``metaq.protocol.replication_topics``), at most MAX_TOPIC_TABLE_BYTES; sent once per link and again when
#: either changes. A slave from before the table ends the link at it ("unknown frame type 10").
T_TOPICS = 10
#: ROUTES and RECORDS: a peer broker following this one for its MQTT sessions (``metaq.protocol.replication_mqtt``).
T_ROUTES, T_RECORDS = 11, 12
#: PEER_CALL / PEER_REPLY: one MQTT cluster member's request to another and its answer
#: (``metaq.protocol.replication_peer``).
T_PEER_CALL, T_PEER_REPLY = 20, 21
_HEX = frozenset(b"0123456789abcdef")
INT64_MAX = 2**63 - 1


def history_problem(entries):
    """Why ``entries`` is not a valid epoch history (see the module docstring), or None."""
    if not 1 <= len(entries) <= replication_limits.MAX_REPLICATION_EPOCHS:
        return "an epoch history has 1..%d entries, not %d (limit MAX_REPLICATION_EPOCHS)" % (
            replication_limits.MAX_REPLICATION_EPOCHS, len(entries))
    prev = None
    for entry in entries:
        if len(entry) != 3:
            return "an epoch entry is (epoch, start, origin), not %r" % (entry,)
        epoch, start, origin = entry
        if not (0 <= epoch <= INT64_MAX and 0 <= start <= INT64_MAX and 0 <= origin <= INT64_MAX):
            return "epoch entry (%d, %d, %d) out of range" % (epoch, start, origin)
        if prev is not None and not (epoch > prev[0] and start > prev[1]):
            return "epoch entries must increase in epoch and start: (%d, %d) after (%d, %d)" % (
                epoch, start, prev[0], prev[1])
        prev = (epoch, start)
    return None


def _entries(epochs):
    return [EPOCH_ENTRY.pack(e, s, o) for e, s, o in epochs]


class Hello(NamedTuple):
    slave_id: int
    broker_id: int
    segment_size: int
    start_position: int
    epochs: tuple = ((0, 0, 0),)


class Epochs(NamedTuple):
    agreed_position: int
    master_end: int
    epochs: tuple


class Data(NamedTuple):
    position: int
    data: bytes


class Ack(NamedTuple):
    slave_id: int
    written_position: int
    durable_position: int


class Heartbeat(NamedTuple):
    position: int
    written_position: int = 0
    message_count: int = 0


class ErrorFrame(NamedTuple):
    code: int
    text: str


class Challenge(NamedTuple):
    """The master's first frame: ``secret`` True when it holds a replication secret (the slave must prove it)."""

    secret: bool
    nonce: str


class Proof(NamedTuple):
    """A side's proof of the replication secret (``proof`` "" when it holds none); ``nonce``: the slave's
    (the master's PROOF has none: its nonce went in the CHALLENGE)."""

    nonce: str
    proof: str


def nonce_problem(nonce, optional=False):
    """Why ``nonce`` (text) cannot be a handshake nonce, or None. ``optional``: "" is allowed."""
    if optional and not nonce:
        return None
    if (not replication_limits.MIN_REPLICATION_NONCE_CHARS <= len(nonce)
        <= replication_limits.MAX_REPLICATION_NONCE_CHARS):
        return "a nonce has %d..%d characters, not %d (limits MIN/MAX_REPLICATION_NONCE_CHARS)" % (
            replication_limits.MIN_REPLICATION_NONCE_CHARS, replication_limits.MAX_REPLICATION_NONCE_CHARS, len(nonce))
    if not _is_hex(nonce):
        return "a nonce is lowercase hex text"
    return None


def proof_problem(proof):
    """Why ``proof`` (text) cannot be a proof ("" is: none), or None."""
    if len(proof) > replication_limits.MAX_REPLICATION_PROOF_CHARS:
        return "a proof has at most %d characters, not %d (limit MAX_REPLICATION_PROOF_CHARS)" % (
            replication_limits.MAX_REPLICATION_PROOF_CHARS, len(proof))
    if not _is_hex(proof):
        return "a proof is lowercase hex text"
    return None


def _is_hex(text):
    if isinstance(text, str):
        text = text.encode("ascii", "replace")
    return _HEX.issuperset(text)


def _ascii(text, problem):
    """``text`` as bytes once ``problem(text)`` is None (a ValueError naming it otherwise)."""
    why = problem(text)
    if why is not None:
        raise ValueError(why)
    return text.encode("ascii")


def _frame(ftype, payload_parts):
    length = sum(len(p) for p in payload_parts)
    head = FRAME_HEADER.pack(MAGIC, VERSION, ftype, 0, length, 0)
    crc = crc32(head[:_CRC_COVERS])
    for part in payload_parts:
        crc = crc32(part, crc)
    return [head[:_CRC_COVERS] + struct.pack(">I", crc)] + list(payload_parts)


def frame_parts(event, max_data=replication_limits.MAX_REPLICATION_DATA_BYTES,
                max_error_text=replication_limits.MAX_REPLICATION_ERROR_TEXT):
    """The frame as a list of buffers to send in order (a DATA's log bytes are not copied)."""
    if isinstance(event, Data):
        if len(event.data) > max_data:
            raise ValueError("DATA of %d bytes exceeds the %d-byte limit" % (len(event.data), max_data))
        _check_position(event.position, ValueError)
        return _frame(T_DATA, [DATA_HEAD.pack(event.position), event.data])
    if isinstance(event, Hello):
        return _frame(T_HELLO, [HELLO.pack(*event[:4], len(event.epochs))] + _entries(event.epochs))
    if isinstance(event, Epochs):
        return _frame(T_EPOCHS, [EPOCHS.pack(event.agreed_position, event.master_end, len(event.epochs))]
                      + _entries(event.epochs))
    if isinstance(event, Ack):
        return _frame(T_ACK, [ACK.pack(*event)])
    if isinstance(event, Heartbeat):
        return _frame(T_HEARTBEAT, [HEARTBEAT.pack(*event)])
    if isinstance(event, Challenge):
        return _frame(T_CHALLENGE, [CHALLENGE_HEAD.pack(CHALLENGE_SECRET if event.secret else 0),
                                    _ascii(event.nonce, nonce_problem)])
    if isinstance(event, Proof):
        nonce = _ascii(event.nonce, lambda n: nonce_problem(n, optional=True))
        proof = _ascii(event.proof, proof_problem)
        return _frame(T_PROOF, [PROOF_HEAD.pack(len(nonce), len(proof)), nonce, proof])
    ftype = _CODEC_TYPES.get(type(event))
    if ftype is not None:
        return _frame(ftype, _CODECS[ftype][0](event))
    if isinstance(event, ErrorFrame):
        text = event.text.encode("utf-8")
        if len(text) > max_error_text:
            text = text[:max_error_text].decode("utf-8", "ignore").encode("utf-8")
        return _frame(T_ERROR, [ERROR_HEAD.pack(event.code), text])
    raise TypeError("not a replication event: %r" % (event,))


def serialize(event, **kw):
    """The frame as one bytes object."""
    return b"".join(bytes(p) for p in frame_parts(event, **kw))


def joined(event):
    """The frame of ``event``, one of the frames a codec encodes (``_CODEC_TYPES``: a RECORDS), as ``serialize``
    gives it, in one buffer written once: its parts joined behind room for the header, the CRC taken over the
    payload whole (two CRC steps however many entries it holds), for a sender that writes it in one call."""
    ftype = _CODEC_TYPES[type(event)]
    buf = bytearray().join([_NO_HEADER] + _CODECS[ftype][0](event))
    view = memoryview(buf)
    FRAME_HEADER.pack_into(buf, 0, MAGIC, VERSION, ftype, 0, len(buf) - FRAME_HEADER.size, 0)
    _CRC.pack_into(buf, _CRC_COVERS, crc32(view[FRAME_HEADER.size:], crc32(view[:_CRC_COVERS])))
    view.release()
    return buf


def _check_position(value, exc=RemoteProtocolError):
    if not 0 <= value <= INT64_MAX:
        raise exc("position %d out of range" % value)


def _fail(reason):
    return RemoteProtocolError(reason, fatal=True)


#: The frames whose payloads a codec module of their own encodes, checks and decodes: frame type -> (parts of an
#: event, check of a payload length, decode of a payload).
_CODECS = {
    T_OFFSETS: (offsets_codec.payload_parts, offsets_codec.check_length, offsets_codec.decode),
    T_TOPICS: (topics_codec.payload_parts, topics_codec.check_length, topics_codec.decode),
    T_ROUTES: (mqtt_codec.routes_parts, mqtt_codec.check_routes_length, mqtt_codec.decode_routes),
    T_RECORDS: (mqtt_codec.records_parts, mqtt_codec.check_records_length, mqtt_codec.decode_records),
    T_PEER_CALL: (peer_codec.call_parts, peer_codec.check_call_length, peer_codec.decode_call),
    T_PEER_REPLY: (peer_codec.reply_parts, peer_codec.check_reply_length, peer_codec.decode_reply),
}
#: The event class of each of those frames -> its frame type.
_CODEC_TYPES = {Offsets: T_OFFSETS, Topics: T_TOPICS, Routes: T_ROUTES, Records: T_RECORDS, PeerCall: T_PEER_CALL,
                PeerReply: T_PEER_REPLY}


class ReplicationParser:
    """Bytes in, events out. ``receive_data(b"")`` means EOF; errors are fatal and sticky. ``max_frame``: the most
    bytes any frame may carry besides each type's own bound (None: those alone), checked at its header, before its
    body is buffered: the replication port's ``REPLICATION_HANDSHAKE_FRAME_BYTES`` until its peer proved the secret
    (then the port sets it to None)."""

    def __init__(self, max_data=replication_limits.MAX_REPLICATION_DATA_BYTES,
                 max_error_text=replication_limits.MAX_REPLICATION_ERROR_TEXT, max_frame=None):
        self.max_data = max_data
        self.max_error_text = max_error_text
        self.max_frame = max_frame
        self._buf = bytearray()
        self._eof = False
        self._error = None

    def receive_data(self, data):
        """``data`` received (b"": EOF). Bytes that begin a frame with nothing buffered are kept as they came, not
        copied: a RECORDS frame they hold whole is decoded as views of them (``_hand_over``)."""
        if self._eof and data:
            raise RuntimeError("receive_data after EOF")
        if not data:
            self._eof = True
        elif not self._buf and type(data) is bytes:
            self._buf = data
        else:
            if type(self._buf) is bytes:
                self._buf = bytearray(self._buf)
            self._buf += data

    @property
    def buffered(self):
        """Bytes received and not yet turned into events."""
        return len(self._buf)

    def next_event(self):
        if self._error is not None:
            raise self._error
        try:
            return self._next()
        except RemoteProtocolError as exc:
            self._error = exc
            raise

    def _next(self):
        buf = self._buf
        if len(buf) < FRAME_HEADER.size:
            if self._eof:
                if buf:
                    raise _fail("stream closed inside a frame header (%d of %d bytes)"
                                % (len(buf), FRAME_HEADER.size))
                return CLOSED
            if len(buf) >= 4 and bytes(buf[:4]) != MAGIC:
                raise _fail("bad frame magic %r (expected %r)" % (bytes(buf[:4]), MAGIC))
            return NEED_DATA
        magic, version, ftype, reserved, length, crc = FRAME_HEADER.unpack_from(buf)
        if magic != MAGIC:
            raise _fail("bad frame magic %r (expected %r)" % (magic, MAGIC))
        if version != VERSION:
            raise _fail("unsupported replication stream version %d (this side speaks %d)" % (version, VERSION))
        if reserved:
            raise _fail("reserved header bits set (%#06x)" % reserved)
        self._check_length(ftype, length)
        end = FRAME_HEADER.size + length
        if len(buf) < end:
            if self._eof:
                raise _fail("stream closed inside a frame (%d of %d bytes)" % (len(buf), end))
            return NEED_DATA
        view = memoryview(buf)
        try:
            if crc32(view[FRAME_HEADER.size:end], crc32(view[:_CRC_COVERS])) != crc:
                raise _fail("frame CRC mismatch (type %d, %d bytes)" % (ftype, length))
            if ftype != T_RECORDS:
                event = self._decode(ftype, view[FRAME_HEADER.size:end])
        finally:
            view.release()
        if ftype == T_RECORDS:
            return self._decode(ftype, self._hand_over(end))
        self._consume(end)
        return event

    def _consume(self, end):
        """The frame ending at ``end`` read: dropped from the buffer (received bytes kept as they came are made a
        buffer once, so the frames after it are dropped in place too)."""
        buf = self._buf
        if type(buf) is bytes:
            buf = self._buf = bytearray(buf) if end < len(buf) else bytearray()
            del buf[:end]
        else:
            del buf[:end]

    def _hand_over(self, end):
        """The payload of the frame ending at ``end``, as a view of a buffer the parser no longer changes: its
        entries are read in place (a RECORDS frame's records are copied where they are written, not here). The
        buffer itself when the bytes after the frame are fewer than its own (they are copied out instead), else
        the frame copied once."""
        buf = self._buf
        if len(buf) - end <= end:
            with memoryview(buf) as view:
                self._buf = bytearray(view[end:])
            return memoryview(buf)[FRAME_HEADER.size:end]
        with memoryview(buf) as view:
            frame = bytes(view[FRAME_HEADER.size:end])
        self._consume(end)
        return memoryview(frame)

    def _check_length(self, ftype, length):
        if self.max_frame is not None and length > self.max_frame:
            raise _fail("frame type %d of %d bytes before the replication secret was proved: at most %d then "
                        "(limit REPLICATION_HANDSHAKE_FRAME_BYTES)" % (ftype, length, self.max_frame))
        fixed = {T_ACK: ACK.size, T_HEARTBEAT: HEARTBEAT.size}.get(ftype)
        if fixed is not None:
            if length != fixed:
                raise _fail("frame type %d must carry %d bytes, not %d" % (ftype, fixed, length))
        elif ftype in (T_HELLO, T_EPOCHS):
            head = HELLO.size if ftype == T_HELLO else EPOCHS.size
            most = head + EPOCH_ENTRY.size * replication_limits.MAX_REPLICATION_EPOCHS
            if not head + EPOCH_ENTRY.size <= length <= most or (length - head) % EPOCH_ENTRY.size:
                raise _fail("frame type %d of %d bytes: must be %d + %d x (1..%d epoch entries) "
                            "(limit MAX_REPLICATION_EPOCHS)" % (ftype, length, head, EPOCH_ENTRY.size,
                                                                 replication_limits.MAX_REPLICATION_EPOCHS))
        elif ftype == T_DATA:
            if not DATA_HEAD.size <= length <= DATA_HEAD.size + self.max_data:
                raise _fail("DATA frame of %d bytes: must be %d..%d (limit MAX_REPLICATION_DATA_BYTES)"
                            % (length, DATA_HEAD.size, DATA_HEAD.size + self.max_data))
        elif ftype == T_ERROR:
            if not ERROR_HEAD.size <= length <= ERROR_HEAD.size + self.max_error_text:
                raise _fail("ERROR frame of %d bytes: must be %d..%d (limit MAX_REPLICATION_ERROR_TEXT)"
                            % (length, ERROR_HEAD.size, ERROR_HEAD.size + self.max_error_text))
        elif ftype == T_CHALLENGE:
            low, high = (CHALLENGE_HEAD.size + replication_limits.MIN_REPLICATION_NONCE_CHARS,
                         CHALLENGE_HEAD.size + replication_limits.MAX_REPLICATION_NONCE_CHARS)
            if not low <= length <= high:
                raise _fail("CHALLENGE frame of %d bytes: must be %d..%d (limits MIN/MAX_REPLICATION_NONCE_CHARS)"
                            % (length, low, high))
        elif ftype == T_PROOF:
            high = (PROOF_HEAD.size + replication_limits.MAX_REPLICATION_NONCE_CHARS
                    + replication_limits.MAX_REPLICATION_PROOF_CHARS)
            if not PROOF_HEAD.size <= length <= high:
                raise _fail("PROOF frame of %d bytes: must be %d..%d (limits MAX_REPLICATION_NONCE_CHARS, "
                            "MAX_REPLICATION_PROOF_CHARS)" % (length, PROOF_HEAD.size, high))
        elif ftype in _CODECS:
            _CODECS[ftype][1](length)
        else:
            raise _fail("unknown frame type %d" % ftype)

    def _decode(self, ftype, payload):
        if ftype == T_DATA:
            (position,) = DATA_HEAD.unpack_from(payload)
            _check_position(position, _fail)
            return Data(position, bytes(payload[DATA_HEAD.size:]))
        if ftype == T_HELLO:
            slave_id, broker_id, segment_size, start, count = HELLO.unpack_from(payload)
            if slave_id < 0 or not 0 <= broker_id <= limits.MAX_BROKER_ID or segment_size <= 0:
                raise _fail("bad HELLO: slave id %d, broker id %d, segment size %d"
                            % (slave_id, broker_id, segment_size))
            _check_position(start, _fail)
            return Hello(slave_id, broker_id, segment_size, start, self._history(payload, HELLO.size, count))
        if ftype == T_EPOCHS:
            agreed, master_end, count = EPOCHS.unpack_from(payload)
            _check_position(agreed, _fail)
            _check_position(master_end, _fail)
            return Epochs(agreed, master_end, self._history(payload, EPOCHS.size, count))
        if ftype == T_ACK:
            ev = Ack(*ACK.unpack_from(payload))
            if ev.slave_id < 0 or ev.durable_position > ev.written_position:
                raise _fail("bad ACK: slave id %d, written %d, durable %d" % ev)
            _check_position(ev.durable_position, _fail)
            return ev
        if ftype == T_HEARTBEAT:
            ev = Heartbeat(*HEARTBEAT.unpack_from(payload))
            for value in ev:
                _check_position(value, _fail)
            return ev
        if ftype == T_CHALLENGE:
            return self._challenge(payload)
        if ftype == T_PROOF:
            return self._proof(payload)
        if ftype in _CODECS:
            return _CODECS[ftype][2](payload)
        (code,) = ERROR_HEAD.unpack_from(payload)
        try:
            text = bytes(payload[ERROR_HEAD.size:]).decode("utf-8")
        except UnicodeDecodeError:
            raise _fail("ERROR frame text is not UTF-8") from None
        return ErrorFrame(code, text)

    @staticmethod
    def _challenge(payload):
        (flags,) = CHALLENGE_HEAD.unpack_from(payload)
        if flags & ~CHALLENGE_SECRET:
            raise _fail("bad CHALLENGE: unknown flags %#04x" % flags)
        nonce = bytes(payload[CHALLENGE_HEAD.size:]).decode("ascii", "replace")
        problem = nonce_problem(nonce)
        if problem is not None:
            raise _fail("bad CHALLENGE: %s" % problem)
        return Challenge(bool(flags), nonce)

    @staticmethod
    def _proof(payload):
        nonce_len, proof_len = PROOF_HEAD.unpack_from(payload)
        if PROOF_HEAD.size + nonce_len + proof_len != len(payload):
            raise _fail("bad PROOF: a %d-character nonce and a %d-character proof do not fill its %d bytes"
                        % (nonce_len, proof_len, len(payload) - PROOF_HEAD.size))
        start = PROOF_HEAD.size
        nonce = bytes(payload[start:start + nonce_len]).decode("ascii", "replace")
        proof = bytes(payload[start + nonce_len:]).decode("ascii", "replace")
        problem = nonce_problem(nonce, optional=True) or proof_problem(proof)
        if problem is not None:
            raise _fail("bad PROOF: %s" % problem)
        return Proof(nonce, proof)

    @staticmethod
    def _history(payload, head, count):
        if head + count * EPOCH_ENTRY.size != len(payload):
            raise _fail("epoch count %d does not match the frame's %d bytes of entries" % (count, len(payload) - head))
        entries = tuple(EPOCH_ENTRY.unpack_from(payload, head + i * EPOCH_ENTRY.size) for i in range(count))
        problem = history_problem(entries)
        if problem is not None:
            raise _fail("bad epoch history: %s" % problem)
        return entries
