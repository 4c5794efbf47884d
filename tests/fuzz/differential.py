"""Differential checks of the C helper's byte readers: each target feeds one input to the C function and to its
Python definition (the twin ``metaq.speedups.load`` falls back to) and raises ``Difference`` when their answers
differ (a result, or the type of the exception raised). The fuzzers (``python -m tests.fuzz``) and the seed-corpus
test (tests/fuzz/test_corpus.py) both run these checks.

An input is raw bytes: its first bytes choose the call's other arguments (a position, a limit, a version), the rest
is the buffer read. The C function gets that buffer at the end of its allocation (``exact``), so a read past it is a
read past the allocation (a sanitizer build reports it). Nothing of ``metaq`` is imported at module level: the
fuzzer imports the targets' modules first, under atheris's instrumentation.
"""

import ctypes
import importlib
import struct
import zlib


class Difference(AssertionError):
    """The C function and its Python definition answered one input differently."""


class NotBuilt(RuntimeError):
    """The C helper is not built (or not wanted): the target's name resolves to its Python definition."""


def exact(data):
    """``data`` at the very end of its allocation, so that reading one byte past it reads past the allocation: a
    ctypes array (its own malloc'd block under ``PYTHONMALLOC=malloc``), after a pad (ctypes keeps an array of up to
    16 bytes inside its object), seen through a memoryview from the data on."""
    block = (ctypes.c_char * (_PAD + len(data))).from_buffer_copy(bytes(_PAD) + bytes(data))
    return memoryview(block).cast("B")[_PAD:]


_PAD = 17


def plain(value):
    """An answer with its packets as their types and fields (the dataclasses made without __init__ compare so)."""
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        return type(value)(plain(v) for v in value)
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return type(value).__name__, sorted((k, plain(v)) for k, v in value.__dict__.items())
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return value


def answer(fn, *args):
    try:
        return plain(fn(*args))
    except Exception as exc:  # noqa: BLE001 - the two must fail alike
        return "raised", type(exc).__name__


def _pair(module, native, twin):
    mod = importlib.import_module(module)
    c, py = getattr(mod, native), getattr(mod, twin)
    if c is py:
        raise NotBuilt("%s.%s is its Python definition: metaq.native._bytes was not built" % (module, native))
    return c, py


def _same(name, c_answer, py_answer, args):
    if c_answer != py_answer:
        raise Difference("%s%r:\n  C:      %r\n  Python: %r" % (name, args, c_answer, py_answer))
    ANSWERED[name] = ANSWERED.get(name, 0) + (c_answer[:1] != ("raised",) if isinstance(c_answer, tuple) else 1)


#: Function name -> how many inputs both definitions answered with a value (not an exception): a harness whose
#: every input raises alike (arguments that no longer fit the function) compares nothing, and the corpus test says so.
ANSWERED = {}


def _compare(module, native, twin, buf, *args):
    """The C ``module.native`` on ``buf`` in an exact buffer and ``module.twin`` on it as bytes, with ``args``."""
    c, py = _pair(module, native, twin)
    _same(native, answer(c, exact(buf), *args), answer(py, bytes(buf), *args), (bytes(buf),) + args)


def _head(data, n):
    """The first ``n`` bytes of ``data`` (zeros past its end) and the rest."""
    return data[:n].ljust(n, b"\0"), data[n:]


def _pick(byte, choices):
    return choices[byte % len(choices)]


# -- the targets: each ``check(data)`` and ``seeds()``, the valid examples its corpus starts from --------------

TARGETS = {}


def target(name, modules):
    """Register ``check`` as fuzzer ``name``, whose twins are in ``modules`` (imported first when fuzzing)."""
    def register(check):
        check.modules = modules
        TARGETS[name] = check
        return check
    return register


MQTT_LIMITS = (268435460, 2, 5, 20, 128, 0, -1)


@target("mqtt_split", ["metaq.mqtt.wire"])
def mqtt_split(data):
    """``wire.split``: a packet's fixed header and length, a plain PUBLISH or PUBACK decoded in one step."""
    (p, m, v), buf = _head(data, 3)
    names = {b"a/b": "a/b", b"": "", b"s/t": "s/t", b"x" * 300: "x" * 300}
    _compare("metaq.mqtt.wire", "split", "split_py", buf, p % (len(buf) + 1) if p >= 128 else 0,
             _pick(m, MQTT_LIMITS), _pick(v, (5, 4, None, 3)), names)


def _mqtt_seeds(header):
    from metaq.mqtt.wire import MQTT_5, MQTT_311, PubAck, Publish, encode
    out = []
    for version, v in ((MQTT_5, 0), (MQTT_311, 1)):
        out.append(header(v) + encode(Publish("a/b", b"hello", 1, packet_id=7), version)
                   + encode(Publish("s/t", b"", 0), version))
        out.append(header(v) + encode(PubAck(9), version) + encode(Publish("a/b", b"x" * 40, 1, packet_id=1),
                                                                    version))
    # near misses: a packet cut short, a Remaining Length cut inside
    out.append(header(0) + encode(Publish("a/b", b"cut", 1, packet_id=3), MQTT_5)[:-1])
    out.append(header(1) + b"\x30\x80")
    return out


mqtt_split.seeds = lambda: _mqtt_seeds(lambda v: bytes((0, 0, v)))

@target("mqtt_pubacks", ["metaq.mqtt.wire"])
def mqtt_pubacks(data):
    """``wire.plain_pubacks``: a subscriber's plain PUBACKs read, their packet ids and the next position."""
    (p, v, m), buf = _head(data, 3)
    _compare("metaq.mqtt.wire", "plain_pubacks", "plain_pubacks_py", buf, p % (len(buf) + 1) if p >= 128 else 0,
             not v & 1, _pick(m, MQTT_LIMITS))


PUBACKS = b"@\x02\x00\x01" b"@\x02\x00\x07" b"@\x03\x00\x09\x10" b"@\x04\x01\x2c\x00\x00"  # ids 1, 7, 9, 300
mqtt_pubacks.seeds = lambda: [bytes((0, v, 0)) + PUBACKS for v in (0, 1)] + [b"\0\0\0" + PUBACKS[:-1]]

@target("ws_frames", ["metaq.protocol.wsframe"])
def ws_frames(data):
    """``wsframe.frames``: a WebSocket client's common frames unmasked, and the header and length of the frame after."""
    (p, m), buf = _head(data, 2)
    _compare("metaq.protocol.wsframe", "frames", "frames_py", buf, p % (len(buf) + 1) if p >= 128 else 0,
             _pick(m, (1000, 0, 125, 126, 65535, 65536, -1, 2 ** 62)))


def _ws_seeds():
    def masked(payload, key):
        n = len(payload)
        size = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n)
        return b"\x82" + size + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    run = masked(b"\x30\x05\x00\x03a/bx", b"\x01\x02\x03\x04") + masked(b"y" * 300, b"\0\0\0\0")
    return [b"\0\0" + run, b"\0\0" + run + b"\x89\x82abcdhi", b"\0\x02" + run[:-3],
            b"\0\0" + masked(b"z", b"k" * 4) + b"\x82\xff" + b"\xff" * 8 + b"\0" * 4]


ws_frames.seeds = _ws_seeds

PLANS = {b"a/b": ("a/b", "t1", 12345, 1, b"P0", b"P1"), b"s/t": ("s/t", "t2", 2 ** 32 - 1, 0, b"", b"Q"),
         b"z": ("z", "t3", 7, 0, b"", b"")}
DECIDED = {"t1": 4, "t2": 1, "t3": 0}


@target("mqtt_publishes", ["metaq.mqtt.wire"])
def mqtt_publishes(data):
    """``wire.plain_publishes`` and ``wire.read_publishes``: a device's plain PUBLISHes split and staged."""
    (p, v, m, room, count, nbytes), buf = _head(data, 6)
    args = (p % (len(buf) + 1) if p >= 128 else 0, not v & 1, _pick(m, MQTT_LIMITS), PLANS, DECIDED,
            _pick(room, (100, 0, 1, 5)), _pick(count, (100, 0, 1, 3)), _pick(nbytes, (10 ** 9, 0, 1, 10)))
    _compare("metaq.mqtt.wire", "plain_publishes", "plain_publishes_py", buf, *args)
    _compare("metaq.mqtt.wire", "read_publishes", "read_publishes_py", buf, *args)


mqtt_publishes.seeds = lambda: _mqtt_seeds(lambda v: bytes((0, v, 0, 0, 0, 0)))

TEXT_BODY, TEXT_LINE = (300, 0, 10, 1 << 20), (120, 20, 0, 4096)


@target("scan_puts", ["metaq.protocol.burst"])
def scan_puts(data):
    """``burst.scan_puts``: a burst of text puts split into frames."""
    (p, e, b, line, frames), buf = _head(data, 5)
    end = len(buf) - e % (len(buf) + 1) if e >= 128 else len(buf)
    _compare("metaq.protocol.burst", "scan_puts", "scan_puts_py", buf, p % (end + 1) if p >= 128 else 0, end,
             _pick(b, TEXT_BODY), _pick(line, TEXT_LINE), *_pick(frames, ((), (0,), (1,), (3,))))


def _scan_puts_seeds():
    from metaq.protocol.checksum import metaq_checksum
    from metaq.protocol.message import encode_payload

    def put(topic, partition, flag, body, opaque):  # put topic partition len flag checksum opaque
        return b"put %s %d %d %d %d %d\r\n%s" % (topic, partition, len(body), flag, metaq_checksum(body), opaque,
                                                  body)
    flag, data = encode_payload(b"body", "tags\x02k\x01v\x02")
    return [b"\0" * 5 + put(b"t", 0, 0, b"hello", 7) + put(b"t", 3, 0, b"", 8),
            b"\0" * 5 + put(b"topic-b", 1, flag, data, -5) + b"version 3\r\n",
            b"\0" * 5 + b"put a 0 1 0 5\r\nXput a 0 3 0 -1 6\r\nab"]


scan_puts.seeds = _scan_puts_seeds


@target("idem_burst", ["metaq.idempotence.burst"])
def idem_burst(data):
    """``idempotence.burst.scan_idem_burst``: a burst of put_idem frames split and their stored data made."""
    (p, e, b, line, frames, owner), buf = _head(data, 6)
    end = len(buf) - e % (len(buf) + 1) if e >= 128 else len(buf)
    _compare("metaq.idempotence.burst", "scan_idem_burst", "scan_idem_burst_py", buf,
             p % (end + 1) if p >= 128 else 0, end, _pick(b, TEXT_BODY), _pick(line, (160, 20, 0, 4096)),
             _pick(frames, (1 << 20, 0, 1, 3)), _pick(owner, (None, b"alice", b"", b"\xc3\xa9")))


def _idem_seeds():
    from metaq.protocol.checksum import metaq_checksum
    from metaq.protocol.message import encode_payload

    def put_idem(topic, partition, flag, body, pid, seq, opaque):  # ... len flag checksum pid seq opaque
        return b"put_idem %s %d %d %d %d %d %d %d\r\n%s" % (topic, partition, len(body), flag, metaq_checksum(body),
                                                           pid, seq, opaque, body)
    flag, data = encode_payload(b"body", "color=red")
    return [b"\0" * 6 + put_idem(b"t", 0, 0, b"hello", 1, 0, 7) + put_idem(b"t", 2, 0, b"x", 1, 1, 8),
            b"\0\0\0\0\0\1" + put_idem(b"topic", 1, flag, data, 5, 2, -3)]


idem_burst.seeds = _idem_seeds


@target("put_ats", ["metaq.timers.burst"])
def put_ats(data):
    """``timers.burst.scan_put_ats``: a burst of put_at frames split and their timer entries made."""
    from metaq.timers.records import TIMER_TOPIC, TimerEntry
    (p, e, b, frames, owner), buf = _head(data, 5)
    end = len(buf) - e % (len(buf) + 1) if e >= 128 else len(buf)
    _compare("metaq.timers.burst", "scan_put_ats", "scan_put_ats_py", buf, p % (end + 1) if p >= 128 else 0, end,
             _pick(b, TEXT_BODY), _pick(frames, (100, 0, 1, 3)), 1_790_000_000_000, TIMER_TOPIC.encode(),
             TimerEntry, _pick(owner, (None, "alice", "", "\u00e9")))


def _put_ats_seeds():
    from metaq.protocol.checksum import metaq_checksum

    def frame(topic, partition, body, when, opaque):
        return b"put_at %s %d %d 0 %d %s %d\r\n%s" % (topic, partition, len(body), metaq_checksum(body), when,
                                                       opaque, body)
    return [b"\0" * 5 + frame(b"t", 0, b"hello", b"+1000", 7) + frame(b"t", 1, b"", b"+0", 8),
            b"\0\0\0\0\1" + frame(b"orders", 2, b"due", b"1790000005000", 9) + b"put_at t 0 1 0 -1 +5 1\r\nx"]


put_ats.seeds = _put_ats_seeds


def fix_crcs(buf):
    """``buf`` with the CRC field of each record in a run rewritten to match (walking by their size fields), so
    the fuzzer gets past the CRC check to the fields behind it."""
    buf = bytearray(buf)
    pos = 0
    while len(buf) - pos >= 12:
        (total,) = struct.unpack_from(">i", buf, pos)
        if total < 12 or total > len(buf) - pos:
            break
        struct.pack_into(">I", buf, pos + 8, zlib.crc32(buf[pos + 12:pos + total]))
        pos += total
    return bytes(buf)


@target("records", ["metaq.store.record"])
def records(data):
    """``record.scan_records`` and ``record.record_ok``: the log's records checked (size fields, magic, CRC)."""
    (crc, p, e, s), buf = _head(data, 4)
    if not crc & 1:
        buf = fix_crcs(buf)
    pos = p % (len(buf) + 1) if p >= 128 else 0
    end = _pick(e, (len(buf), len(buf) + 1, len(buf) // 2, 0, -1, 1 << 40))
    _compare("metaq.store.record", "scan_records", "scan_records_py", buf, -1 if p == 1 else pos, end)
    size = _pick(s, (len(buf) - pos, 0, -1, len(buf) - pos + 1, 1 << 40, (len(buf) - pos) // 2))
    _compare("metaq.store.record", "record_ok", "record_ok_py", buf, -1 if p == 1 else pos, size)


def _log_seeds(header):
    from metaq.store.record import encode_record
    from metaq.protocol.message import encode_payload
    flag, data = encode_payload(b"body", "tags\x02k\x01v\x02")
    a = encode_record("t", 0, 0, 1_790_000_000_000, 1_790_000_000_000, 1, 0, b"hello")
    b = encode_record("t", 0, 1, 1_790_000_000_001, 1_790_000_000_000, 2, flag, data)
    c = encode_record("orders", 3, 9, 1_790_000_000_002, 1_790_000_000_000, 3, 0, b"")
    return [header + a + b + c, header + c + a[:-3], header + b + b"\0" * 40]


records.seeds = lambda: _log_seeds(b"\0" * 4)


@target("keyed_records", ["metaq.keys.index"])
def keyed_records(data):
    """``keys.index.keyed_records``: the log's records walked by their size fields, those with a key found."""
    (crc, r, st, e), buf = _head(data, 4)
    if not crc & 1:
        buf = fix_crcs(buf)
    end = _pick(e, (len(buf), len(buf) // 2, 0, len(buf) + 1))
    rel = r % (len(buf) + 1) if r >= 128 else (-1 if r == 1 else 0)
    _compare("metaq.keys.index", "keyed_records", "keyed_records_py", buf, rel,
             _pick(st, (len(buf), len(buf) // 2, 0, 1 << 40)), end)


keyed_records.seeds = lambda: _log_seeds(b"\0" * 4)


@target("scan_log", ["metaq.store.recovery_scan"])
def scan_log(data):
    """``recovery_scan.scan_log``: recovery's scan of a segment: records checked, index units and runs made."""
    (crc, r, s, m), buf = _head(data, 4)
    if not crc & 1:
        buf = fix_crcs(buf)
    size = _pick(s, (len(buf), len(buf) // 2, 0, len(buf) + 1))
    rel = r % (size + 1) if r >= 128 else (-1 if r == 1 else 0)
    _compare("metaq.store.recovery_scan", "scan_log", "scan_log_py", buf, rel, size,
             _pick(m, (0, 1 << 30, (1 << 63) - 100)), _pick(m >> 2, (1 << 20, 1, 2, 0)))


scan_log.seeds = lambda: _log_seeds(b"\0" * 4)


@target("grpc_frames", ["metaq.rmq5.wire"])
def grpc_frames(data):
    """``rmq5.wire.frames``: messages length-prefixed and joined (the parts split at a NUL)."""
    (kinds,), buf = _head(data, 1)
    parts = buf.split(b"\0") if buf else []
    made = [(bytes, bytearray, memoryview, str, exact)[(kinds >> (i % 4)) % 5 if kinds & 0x80 else 0](
        p.decode("latin-1") if (kinds >> (i % 4)) % 5 == 3 and kinds & 0x80 else p) for i, p in enumerate(parts)]
    c, py = _pair("metaq.rmq5.wire", "frames", "frames_py")
    _same("frames", answer(c, made), answer(py, made), (made,))
    if kinds == 0x7F:
        _same("frames", answer(c, tuple(made)), answer(py, tuple(made)), (tuple(made),))


grpc_frames.seeds = lambda: [b"\0hello\0\0" + b"x" * 100, b"\0a", b"\x81one\0two\0three\0four"]

SERVED = (None, ("t-from", 3, 99, "1 2 3 4", 2, 30_000), ("t", 0, 0, "h", 0, 0))
INTS = (2, 0, -1, 2 ** 63 - 1, -2 ** 63, 2 ** 63, 253402300799999, 253402300800000)


@target("served_record", ["metaq.rmq5.messagebytes"])
def served_record(data):
    """``messagebytes.served_record``: a log record's attribute block and properties read into a served message's
    protobuf fields."""
    from metaq.rmq5 import messagebytes
    (f, s, i, t), buf = _head(data, 4)
    served = _pick(s, SERVED)
    served = None if served is None else messagebytes.Served(*served)
    args = (_pick(f, (1, 0, 3, -1)), "t", _pick(i, INTS), 77, 1700000000123, 1700000000456,
            _pick(t, (0xABCDEF,) + INTS), "192.0.2.7:8081", served, messagebytes._CONTEXT)
    _compare("metaq.rmq5.messagebytes", "served_record", "served_record_py", buf, *args)


def _served_seeds():
    def record(items, tags=b""):
        attribute = tags + b"\x02" + b"\x02".join(items)
        return struct.pack(">i", len(attribute)) + attribute + b"body"
    return [b"\0" * 4 + record([b"UNIQ_KEY\x01ABC", b"KEYS\x01k1 k2", b"TAGS\x01red", b"u\x01v"]),
            b"\0\1\0\0" + record([b"TIMER_DELIVER_MS\x011700000000999", b"@BORNHOST\x011.2.3.4:5"], b"t"),
            b"\0\2\0\0" + record([b"__SHARDINGKEY\x01s", b"DELAY\x013", b"k\x01"])]


served_record.seeds = _served_seeds


@target("pop_handles", ["metaq.pop.records"])
def pop_handles(data):
    """``pop.records.parse_handles``: an ack's receipt handles read (the texts split at a NUL)."""
    (kinds,), buf = _head(data, 1)
    texts = [p.decode("utf-8", "replace") if not kinds & 1 else p.decode("latin-1") for p in buf.split(b"\0")]
    if kinds & 2:
        texts.append(bytes(buf[:8]))
    if kinds & 4:
        texts.append(len(buf))
    c, py = _pair("metaq.pop.records", "parse_handles", "parse_handles_py")
    _same("parse_handles", answer(c, texts), answer(py, texts), (texts,))


pop_handles.seeds = lambda: [b"\0" + b"0:0:1:1764300000000\x003:1099511627776:17:4611686018427387904",
                             b"\0" + b"007:08:09:010\0" + b"1:2:3:" + b"9" * 18, b"\x06" + b"1:2:3"]


def seeds(name):
    """The seed corpus of fuzzer ``name``: valid examples (with a few near misses) of what its function reads."""
    return TARGETS[name].seeds()
