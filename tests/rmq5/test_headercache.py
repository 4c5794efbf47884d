"""The gRPC port's cached HPACK coders give exactly what hpack's own give, whatever the compression context does."""

import random

import pytest
from hpack import Decoder, Encoder
from hpack.exceptions import OversizedHeaderListError

from metaq.rmq5.headercache import CachedDecoder, CachedEncoder
from metaq.rmq5.wire import OK_TRAILERS_RAW, RESPONSE_HEADERS_RAW, Status, trailers, trailers_only

CONSTANT = (RESPONSE_HEADERS_RAW, OK_TRAILERS_RAW)


def raw(headers):
    return [(name.encode(), value.encode()) for name, value in headers]


def _lists(rng, n):
    """Response header lists as the port sends them: mostly the constant ones, now and then trailers with a message
    (which insert into the dynamic table) and a Trailers-Only answer."""
    out = []
    for i in range(n):
        pick = rng.random()
        if pick < 0.4:
            out.append(list(RESPONSE_HEADERS_RAW))
        elif pick < 0.8:
            out.append(list(OK_TRAILERS_RAW))
        elif pick < 0.9:
            out.append(list(raw(trailers(Status.INTERNAL, "failure %d" % rng.randrange(20)))))
        else:
            out.append(list(raw(trailers_only(Status.UNIMPLEMENTED, "no %d" % i))))
    return out


@pytest.mark.parametrize("seed", range(5))
def test_encoder_blocks_are_hpacks(seed):
    """Byte for byte the blocks a plain Encoder writes, with the table filling, evicting and resized (a client's
    SETTINGS_HEADER_TABLE_SIZE), and a plain Decoder reads each back as the list encoded."""
    rng = random.Random(seed)
    cached, plain, decoder = CachedEncoder(CONSTANT), Encoder(), Decoder()
    for i, headers in enumerate(_lists(rng, 600)):
        if i % 150 == 75:  # the client resizes the table: the next block begins with the size change
            size = rng.choice((0, 64, 256, 4096))
            cached.header_table_size = plain.header_table_size = size
            decoder.max_allowed_table_size = 4096
        block = cached.encode(headers)
        assert block == plain.encode(headers)
        assert [(n, v) for n, v in decoder.decode(block, raw=True)] == headers


def test_encoder_reuses_a_constant_block():
    """A constant list encoded twice without a table change in between is the same block object (not re-encoded)."""
    enc = CachedEncoder(CONSTANT)
    enc.encode(list(RESPONSE_HEADERS_RAW))  # inserts its fields
    second = enc.encode(list(RESPONSE_HEADERS_RAW))  # all indexed now: cached
    assert enc.encode(list(RESPONSE_HEADERS_RAW)) is second
    enc.encode(list(raw(trailers(Status.INTERNAL, "x"))))  # a new entry: the indexes shift
    assert enc.encode(list(RESPONSE_HEADERS_RAW)) is not second


@pytest.mark.parametrize("seed", range(5))
def test_decoder_lists_are_hpacks(seed):
    """Blocks of a client that repeats its request headers (grpcio's: every field indexed after the first call),
    now and then with a new value (inserted) or a table size change: the same lists a plain Decoder gives."""
    rng = random.Random(seed)
    enc, cached, plain = Encoder(), CachedDecoder(), Decoder()
    base = [(b":method", b"POST"), (b":path", b"/apache.rocketmq.v2.MessagingService/SendMessage"),
            (b"content-type", b"application/grpc"), (b"te", b"trailers"), (b"grpc-timeout", b"30S")]
    for i in range(600):
        headers = list(base)
        if rng.random() < 0.2:
            headers.append((b"x-mq-date-time", b"2026%04d" % rng.randrange(10000)))
        if i % 150 == 75:
            enc.header_table_size = rng.choice((0, 128, 4096))
        block = enc.encode(headers)
        got = cached.decode(block, raw=True)
        assert got == plain.decode(block, raw=True)
        assert got == headers
        got.append((b"junk", b"1"))  # a caller's list is its own: the cache's is not changed
    assert cached.decode(block, raw=True) == headers


def test_decoder_still_refuses_an_oversized_list():
    """A block decoded once under a larger limit is refused once the limit is lower (the limits are part of what
    the cached list stands for)."""
    enc, dec = Encoder(), CachedDecoder()
    first = enc.encode([(b"x-big", b"v" * 200)])
    again = enc.encode([(b"x-big", b"v" * 200)])  # indexed: it changes nothing, so its list is kept
    dec.decode(first, raw=True)
    assert dec.decode(again, raw=True) == [(b"x-big", b"v" * 200)]
    dec.max_header_list_size = 100
    with pytest.raises(OversizedHeaderListError):
        dec.decode(again, raw=True)


def test_checked_headers_check_a_list_once_and_give_each_caller_its_own_metadata():
    from metaq.rmq5.http2 import ProtocolError

    from metaq.rmq5.headercache import CheckedHeaders
    good = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/p"), (b":authority", b"h"), (b"x-a", b"1"),
            (b"x-a", b"2")]
    checked = CheckedHeaders()
    first = checked.request(good)
    assert first == {":method": "POST", ":scheme": "http", ":path": "/p", ":authority": "h", "x-a": "1,2"}
    first["x-a"] = "changed"
    assert checked.request(list(good))["x-a"] == "1,2"
    with pytest.raises(ProtocolError):
        checked.request(good + [(b"X-B", b"1")])
    with pytest.raises(ProtocolError):
        checked.request(good + [(b"x-b", b"\xff")])
    assert checked.request(good)["x-a"] == "1,2"


_GOOD = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/p"), (b":authority", b"h"), (b"te", b"trailers"),
         (b"x-a", b"1")]


@pytest.mark.parametrize("bad", [
    _GOOD + [(b"", b"v")],  # an empty name
    _GOOD + [(b"X-B", b"1")],  # upper case
    _GOOD + [(b"x b", b"1")],  # a space in a name
    _GOOD + [(b"x:b", b"1")],  # a colon past the first character
    _GOOD + [(b"x-b", b"a\0b")], _GOOD + [(b"x-b", b"a\nb")], _GOOD + [(b"x-b", b" a")], _GOOD + [(b"x-b", b"a\t")],
    _GOOD + [(b"connection", b"close")], _GOOD + [(b"transfer-encoding", b"chunked")], _GOOD + [(b"upgrade", b"x")],
    [(b"te", b"gzip") if n == b"te" else (n, v) for n, v in _GOOD],
    _GOOD[:1] + _GOOD,  # a pseudo-header repeated
    _GOOD + [(b":path", b"/q")],  # a pseudo-header after a regular field
    [(b":status", b"200")] + _GOOD,  # a response's pseudo-header
    [(b":custom", b"1")] + _GOOD,  # an unknown one
    [h for h in _GOOD if h[0] != b":method"], [h for h in _GOOD if h[0] != b":scheme"],
    [(b":path", b"") if n == b":path" else (n, v) for n, v in _GOOD],  # an empty path
    [h for h in _GOOD if h[0] != b":authority"],  # neither :authority nor host
    _GOOD + [(b"host", b"other")],  # host unlike :authority
    [h for h in _GOOD if h[0] != b":authority"] + [(b"host", b"h"), (b"host", b"h")],  # host twice
    [(b":protocol", b"websocket")] + _GOOD,  # :protocol without CONNECT
])
def test_check_fields_refuses_what_rfc_9113_refuses_in_a_request(bad):
    from metaq.rmq5.headercache import check_fields
    from metaq.rmq5.http2 import ProtocolError
    check_fields(_GOOD)
    check_fields([h for h in _GOOD if h[0] != b":authority"] + [(b"host", b"h")])  # host instead of :authority
    check_fields(_GOOD + [(b"host", b"h"), (b"x-e", b"")])  # both, equal; an empty value
    with pytest.raises(ProtocolError):
        check_fields(bad)


def test_check_fields_refuses_pseudo_headers_in_trailers():
    from metaq.rmq5.headercache import check_fields
    from metaq.rmq5.http2 import ProtocolError
    check_fields([(b"x-t", b"1")], trailers=True)
    with pytest.raises(ProtocolError):
        check_fields([(b":path", b"/x")], trailers=True)
    with pytest.raises(ProtocolError):
        check_fields([(b"X-T", b"1")], trailers=True)
