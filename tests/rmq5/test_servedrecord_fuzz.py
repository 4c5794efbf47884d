"""``served_record`` (the C helper's, and its twin ``messagebytes.served_record_py``) on records an attacker or a
disk may hand it: property names and values are what producers sent, and a torn or corrupted record may reach it.
Random, truncated and bit-flipped records, extreme ints and extreme property lists: the two give the same bytes,
the same None or the same error, and any record the one pass takes is what the general mapping serves. Seeded and
bounded; the records are handed over in buffers of their exact size, so a read past one is a read past the
allocation (a sanitizer build reports it)."""

import ctypes
import random
import struct

import pytest

from metaq import speedups
from metaq.protocol.rocketmq.mapping import UNTRIMMED_CHARS, message_of_record
from metaq.rmq5.records import MAX_USER_PROPERTIES
from metaq.store.record import LogRecord

messagebytes = pytest.importorskip("metaq.rmq5.messagebytes")
_bytes = pytest.importorskip("metaq.native._bytes") if speedups.built() else None
served_record_c = getattr(_bytes, "served_record", None)
if served_record_c is None:
    pytest.skip("metaq.native._bytes was not built (with OpenSSL: its served_record)", allow_module_level=True)

HOST = ("192.0.2.7", 8081)
ENDPOINT = "192.0.2.7:8081"
INTS = [0, 1, -1, 2 ** 31, 2 ** 63 - 1, -2 ** 63, 2 ** 63, -2 ** 63 - 1, 1700000000000, 253402300799999,
        253402300800000, -62135596800000, -62135596800001]
KEYS = [b"UNIQ_KEY", b"KEYS", b"TAGS", b"__SHARDINGKEY", b"TIMER_DELIVER_MS", b"@BORNHOST", b"@SYSFLAG", b"@FLAG",
        b"@", b"_", b"__", b"__x", b"u", b"\xc3\xbc", b"", b"DELAY", b"TRACE_ON"]
VALUES = [b"", b"v", b"1700000000000", b"99999999999999999", b"1" * 19, b"a  b ", b" ", b"1.2.3.4:5", b"[::1]:9",
          b"1.2.3.4:99999", b"\xe2\x9c\x93", b"0", b"-1", b"+5", b"\xff", b"\xed\xa0\x80", b"\xd9\xa1"]
SERVED = [None, messagebytes.Served("t-from", 3, 99, "1 2 3 4", 2, 30_000),
          messagebytes.Served("t", 0, 0, "h", 0, 0)]


def exact(data):
    """``data`` in a buffer of exactly its size (ctypes keeps up to 16 bytes inside its object)."""
    return (ctypes.c_char * len(data)).from_buffer_copy(data) if len(data) > 16 else data


def answer(server, data, *args):
    """``server``'s answer, or its exception's type; a born host it did not know learned first (as
    ``messagebytes.served_bytes`` does) when the context is the module's."""
    try:
        out = server(data, *args)
        if isinstance(out, str) and args[-1] is messagebytes._CONTEXT:
            messagebytes.learn_born_host(out)
            out = server(data, *args)
        return out
    except Exception as exc:  # noqa: BLE001 - the two must fail alike
        return type(exc)


def random_record(rng):
    items = []
    for _ in range(rng.randrange(0, 300 if rng.random() < 0.05 else 10)):
        key = rng.choice(KEYS) if rng.random() < 0.8 else b"k%d" % rng.randrange(200)
        items.append(key + (b"\x01" if rng.random() < 0.9 else b"") + rng.choice(VALUES))
    attribute = rng.choice([b"", b"t", b"a\x01b", b"a b", b"\xff"]) + b"\x02" + b"\x02".join(items)
    attribute += rng.choice([b"", b"\x02"])
    body = rng.choice([b"", b"b", bytes(range(256))])
    size = len(attribute)
    if rng.random() < 0.1:
        size = rng.choice([-1, -2 ** 31, 2 ** 31 - 1, 0, size + len(body), size + len(body) + 1])
    data = struct.pack(">i", size) + attribute + body
    if rng.random() < 0.2:
        flipped = bytearray(data)
        for _ in range(rng.randrange(1, 5)):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        data = bytes(flipped)
    if rng.random() < 0.1:
        data = data[:rng.randrange(len(data) + 1)]
    return data


def test_served_record_twins_agree_on_random_truncated_and_bit_flipped_records():
    rng = random.Random(5601)
    taken = 0
    for _ in range(8000):
        data = random_record(rng)
        flag = rng.choice([1, 1, 1, 0, 3, -1])
        ints = [rng.choice(INTS) if rng.random() < 0.1 else v for v in (2, 77, 1700000000123, 1700000000456)]
        served = rng.choice(SERVED)
        if served is not None and rng.random() < 0.2:
            served = served._replace(attempt=rng.choice(INTS), invisible_ms=rng.choice(INTS))
        msg_id = rng.choice(INTS) if rng.random() < 0.1 else 0xABCDEF
        args = (flag, "t", ints[0], ints[1], ints[2], ints[3], msg_id, ENDPOINT, served, messagebytes._CONTEXT)
        out = answer(served_record_c, exact(data), *args)
        assert out == answer(messagebytes.served_record_py, data, *args), (data, args)
        if isinstance(out, bytes):
            taken += 1
            rec = LogRecord(1000, 0, "t", ints[0], ints[1], ints[3], ints[2], msg_id, flag, data)
            want = messagebytes.response_bytes(message_of_record(rec, HOST), HOST, 1 << 20, rec.msg_id, served)
            assert out == want, data
    assert taken > 1000  # the one pass was exercised, not only its refusals


def _record(items, tags=b""):
    attribute = tags + b"\x02" + b"\x02".join(items)
    return struct.pack(">i", len(attribute)) + attribute + b"body"


def _fill(items, tail):
    """``items`` then as many ``tail`` items as the untrimmed bound lets in."""
    room = UNTRIMMED_CHARS - 6 - len(_record(items)) + 4
    return items + [tail] * max(0, room // (len(tail) + 1))


USERS = [b"u%03d\x01v" % i for i in range(MAX_USER_PROPERTIES)]
EXTREME = {
    "users at the bound, then the last one repeated": _fill(USERS, b"u127\x01w"),
    "users at the bound, then a reserved name repeated": _fill(USERS, b"DELAY\x01v"),
    "users at the bound, then one more": USERS + [b"extra\x01v"],
    "users at the bound, then empty values and lone names": _fill(USERS, b"u000\x01") + [b"lonely"],
    "long names alike but for their end": _fill([b"k" * 60 + b"%03d\x01v" % i for i in range(MAX_USER_PROPERTIES)],
                                                b"k" * 60 + b"000\x01last"),
    "separators only": [b""] * 2000,
    "keys: spaces only, and many": [b"KEYS\x01" + b" " * 3000, b"KEYS\x01" + b"k " * 1500],
    "the untrimmed bound, one long value": [b"u\x01" + b"v" * (UNTRIMMED_CHARS - 6 - 4)],
    "one past the untrimmed bound": [b"u\x01" + b"v" * (UNTRIMMED_CHARS - 6 - 3)],
    "a delivery time of 18 and of 19 digits": [b"TIMER_DELIVER_MS\x01" + b"9" * 18,
                                               b"TIMER_DELIVER_MS\x01" + b"0" * 19],
    "born hosts: forged, long, IPv6": [b"@BORNHOST\x01" + b"9" * 3000 + b":1", b"@BORNHOST\x01[::1]:65535"],
}


@pytest.mark.parametrize("served", SERVED, ids=["pulled", "received", "received, zeros"])
@pytest.mark.parametrize("name", list(EXTREME), ids=list(EXTREME))
def test_served_record_twins_agree_on_extreme_property_lists(name, served):
    data = _record(EXTREME[name])
    args = (1, "t", 2, 77, 1700000000123, 1700000000456, 0xABCDEF, ENDPOINT, served, messagebytes._CONTEXT)
    out = answer(served_record_c, exact(data), *args)
    assert out == answer(messagebytes.served_record_py, data, *args)
    if isinstance(out, bytes):
        rec = LogRecord(1000, 0, "t", 2, 77, 1700000000456, 1700000000123, 0xABCDEF, 1, data)
        assert out == messagebytes.response_bytes(message_of_record(rec, HOST), HOST, 1 << 20, rec.msg_id, served)


def _context(i, value):
    context = list(messagebytes._CONTEXT)
    context[i] = value
    return tuple(context)


@pytest.mark.parametrize("data, topic, endpoint, served, context", [
    (_record([b"@BORNHOST\x011.2.3.4:5"]), "t", ENDPOINT, None, _context(4, {"1.2.3.4:5": 7})),  # the born host
    (_record([b"u\x01v"]), "\ud800", ENDPOINT, None, messagebytes._CONTEXT),  # a topic not encodable
    (_record([b"u\x01v"]), "t", "\udc00", None, messagebytes._CONTEXT),  # an endpoint not encodable
    (_record([b"u\x01v"]), "t", ENDPOINT, SERVED[1]._replace(receipt_handle="\udc00"), messagebytes._CONTEXT),
], ids=["born host", "topic", "endpoint", "receipt handle"])
def test_served_record_twins_fail_alike_when_a_part_fails(data, topic, endpoint, served, context):
    args = (1, topic, 2, 77, 1700000000123, 1700000000456, 0xABCDEF, endpoint, served, context)
    out = answer(served_record_c, exact(data), *args)
    assert isinstance(out, type) and issubclass(out, Exception)
    assert out is answer(messagebytes.served_record_py, data, *args)


def test_served_record_twins_give_hashlibs_md5_on_every_length_around_the_block_and_padding_edges():
    import hashlib
    rng = random.Random(57)
    args = (1, "t", 2, 77, 1700000000123, 1700000000456, 0xABCDEF, ENDPOINT, SERVED[1], messagebytes._CONTEXT)
    for n in list(range(0, 200)) + [1023, 1024, 1025, 4096, 65535, 65536, 1 << 20]:
        body = rng.randbytes(n)
        attribute = b"\x02u\x01v"
        data = struct.pack(">i", len(attribute)) + attribute + body
        out = served_record_c(exact(data), *args)
        assert out == messagebytes.served_record_py(data, *args), n
        assert hashlib.md5(body).hexdigest().upper().encode() in out, n


@pytest.mark.parametrize("server", [messagebytes.served_record_py, served_record_c], ids=["python", "c"])
def test_a_born_host_is_given_as_data_and_an_unknown_one_answered_with_its_text(server):
    args = (1, "t", 2, 77, 1700000000123, 1700000000456, 0xABCDEF, ENDPOINT, None)
    hosts = {"1.2.3.4:5": "10.0.0.1:1", "bad": None}

    def served(born_text):
        return server(exact(_record([b"@BORNHOST\x01" + born_text])), *args, _context(4, hosts))

    assert b"10.0.0.1:1" in served(b"1.2.3.4:5")  # the host the caller gave, not the text's own
    assert ENDPOINT.encode() in served(b"bad")  # not a producer's address: the endpoint
    assert served(b"1.2.3.4:6") == "1.2.3.4:6"  # not known: its text, for the caller to learn
    most = messagebytes.BORN_HOST_CHARS
    hosts["9" * (most - 2) + ":1"] = hosts["\u00e9" * (most - 2) + ":1"] = "10.0.0.2:2"
    assert b"10.0.0.2:2" in served(b"9" * (most - 2) + b":1")  # at the longest text
    assert b"10.0.0.2:2" in served("\u00e9".encode() * (most - 2) + b":1")  # counted in characters
    assert served(b"9" * (most - 1) + b":1") is None  # one past it: the general mapping's


def test_the_born_hosts_learned_are_bounded():
    hosts = messagebytes._BORN_HOSTS
    saved = dict(hosts)
    try:
        hosts.clear()
        for i in range(messagebytes.BORN_HOSTS_KEPT):
            messagebytes.learn_born_host("10.0.%d.%d:1" % divmod(i, 256))
        assert len(hosts) == messagebytes.BORN_HOSTS_KEPT and hosts["10.0.0.7:1"] == "10.0.0.7:1"
        messagebytes.learn_born_host("[::1]:9")  # one past the bound: emptied, then kept
        assert hosts == {"[::1]:9": "::1:9"}
    finally:
        hosts.clear()
        hosts.update(saved)


@pytest.mark.parametrize("msg_id", [0, 1, 0xABCDEF, 2 ** 63 - 1, -1, -2 ** 63, 2 ** 63, 2 ** 64 - 1, 2 ** 64, 2 ** 100,
                                    -2 ** 100, True])
def test_served_record_twins_write_a_records_metaq_id_in_hex_when_its_client_gave_no_message_id(msg_id):
    data = _record([b"u\x01v"])
    args = (1, "t", 2, 77, 1700000000123, 1700000000456, msg_id, ENDPOINT, None, messagebytes._CONTEXT)
    out = served_record_c(exact(data), *args)
    assert out == messagebytes.served_record_py(data, *args)
    rec = LogRecord(1000, 0, "t", 2, 77, 1700000000456, 1700000000123, msg_id, 1, data)
    assert out == messagebytes.response_bytes(message_of_record(rec, HOST), HOST, 1 << 20, rec.msg_id, None)
    message_id = ("%X" % msg_id).encode()
    assert bytes((3 << 3 | 2, len(message_id))) + message_id in out


@pytest.mark.parametrize("msg_id", [1.5, "7", None])
def test_served_record_twins_refuse_a_metaq_id_that_is_no_int_alike(msg_id):
    data = _record([b"u\x01v"])
    args = (1, "t", 2, 77, 1700000000123, 1700000000456, msg_id, ENDPOINT, None, messagebytes._CONTEXT)
    with pytest.raises(TypeError):
        served_record_c(exact(data), *args)
    with pytest.raises(TypeError):
        messagebytes.served_record_py(data, *args)


def test_grpc_frames_twins_join_length_prefixed_messages_alike():
    from metaq.native._bytes import grpc_frames
    from metaq.rmq5 import wire
    rng = random.Random(58)
    for _ in range(200):
        items = [rng.randbytes(rng.choice([0, 1, 5, 300, 1100, 70000])) for _ in range(rng.randrange(40))]
        items = [exact(b) if rng.random() < 0.5 else b for b in items]
        out = grpc_frames(items)
        assert out == wire.frames_py(items) == b"".join(wire.frame(bytes(b)) for b in items)
        assert grpc_frames(tuple(items)) == out
    for bad in ([b"x", "text"], [None], 5):
        with pytest.raises(TypeError):
            grpc_frames(bad)
        with pytest.raises(TypeError):
            wire.frames_py(bad)
