"""The gRPC port's cached HPACK coders give exactly what hpack's own give, whatever the compression context does."""

import random

import pytest
from hpack import Decoder, Encoder
from hpack.exceptions import HPACKDecodingError, OversizedHeaderListError

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


def _method_headers(method):
    return [(b":method", b"POST"), (b":scheme", b"http"), (b":path", b"/apache.rocketmq.v2.MessagingService/" + method),
            (b":authority", b"h"), (b"content-type", b"application/grpc"), (b"te", b"trailers")]


def _indexed_blocks(n):
    """n distinct request blocks, each of fields all in the table already (so decoding one changes nothing), with
    the encoder and a plain decoder that read the blocks inserting them."""
    enc, plain, cached = Encoder(), Decoder(), CachedDecoder()
    lists = [_method_headers(b"Method%d" % i) for i in range(n)]
    for headers in lists:  # the first block of each inserts its fields, in both decoders
        block = enc.encode(headers)
        assert cached.decode(block, raw=True) == plain.decode(block, raw=True) == headers
    return enc, plain, cached, lists, [enc.encode(h) for h in lists]


def _decodes(cached, monkeypatch):
    """Count the blocks the cached decoder hands to hpack's own decoder (a miss)."""
    calls = []
    real = Decoder.decode

    def counting(self, data, raw=False):
        if self is cached:
            calls.append(bytes(data))
        return real(self, data, raw)
    monkeypatch.setattr(Decoder, "decode", counting)
    return calls


def test_decoder_keeps_the_limits_blocks_and_one_past_drops_the_oldest(monkeypatch):
    """GRPC_CACHED_HEADER_BLOCKS distinct blocks alternating are each decoded by hpack once, then served from the
    cache; one block more drops the oldest kept block, which is decoded again (correctly) when it comes back."""
    from metaq.rmq5 import limits as rmq5_limits
    n = rmq5_limits.GRPC_CACHED_HEADER_BLOCKS
    enc, plain, cached, lists, blocks = _indexed_blocks(n + 1)
    calls = _decodes(cached, monkeypatch)
    for _ in range(3):  # the limit's blocks, alternating: each decoded once
        for headers, block in zip(lists[:n], blocks[:n], strict=True):
            assert cached.decode(block, raw=True) == plain.decode(block, raw=True) == headers
    assert calls == blocks[:n]
    del calls[:]
    assert cached.decode(blocks[n], raw=True) == lists[n]  # one past: kept, the oldest (blocks[0]) goes
    assert calls == [blocks[n]]
    for headers, block in zip(lists[1:], blocks[1:], strict=True):  # the others are still kept
        assert cached.decode(block, raw=True) == headers
    assert calls == [blocks[n]]
    assert cached.decode(blocks[0], raw=True) == plain.decode(blocks[0], raw=True) == lists[0]
    assert calls == [blocks[n], blocks[0]]


def test_decoder_keeps_no_block_past_a_table_change(monkeypatch):
    """Kept blocks stand for one state of the dynamic table: after a block that inserts (the indexes shift under
    the kept blocks) every kept block is decoded again and gives what a fresh hpack decoder, fed the same blocks,
    gives: with h2's hpack as the client's encoder."""
    enc, plain, cached, lists, blocks = _indexed_blocks(3)
    for block in blocks:
        cached.decode(block, raw=True), plain.decode(block, raw=True)
    # An insertion shifts every dynamic index by one: the old blocks now mean other fields.
    inserted = enc.encode([(b"x-new", b"1")])
    assert cached.decode(inserted, raw=True) == plain.decode(inserted, raw=True)
    calls = _decodes(cached, monkeypatch)
    for block in blocks:  # the same bytes under the changed table: not served from the cache
        assert cached.decode(block, raw=True) == plain.decode(block, raw=True)
    assert calls == blocks
    # A table size change (evicting entries) drops them all too, and the lists still match.
    cached.max_allowed_table_size = plain.max_allowed_table_size = 4096
    enc.header_table_size = 80
    resize = enc.encode(lists[0])
    assert cached.decode(resize, raw=True) == plain.decode(resize, raw=True) == lists[0]
    del calls[:]
    again = enc.encode(lists[1])
    assert cached.decode(again, raw=True) == plain.decode(again, raw=True) == lists[1]
    assert calls == [again]


def test_decoder_refuses_a_kept_block_once_a_size_update_evicted_what_it_names():
    """A block of indexes only, kept, then a dynamic table size update to 0 (every entry evicted, nothing inserted):
    the same block names entries no longer there, and is refused as hpack refuses it."""
    enc, plain, cached = Encoder(), Decoder(), CachedDecoder()
    first, again = enc.encode([(b"x-a", b"1")]), enc.encode([(b"x-a", b"1")])  # inserted, then indexed
    for dec in (plain, cached):
        assert dec.decode(first, raw=True) == dec.decode(again, raw=True) == [(b"x-a", b"1")]
        assert dec.decode(b"\x20", raw=True) == []  # the size update to 0
        with pytest.raises(HPACKDecodingError):
            dec.decode(again, raw=True)


def test_checked_headers_keep_the_limits_lists_and_one_past_drops_the_oldest(monkeypatch):
    """CheckedHeaders checks each of GRPC_CACHED_HEADER_BLOCKS alternating lists once; one more drops the oldest,
    checked again when it comes back; a list that fails is never kept."""
    from metaq.rmq5 import limits as rmq5_limits
    from metaq.rmq5 import headercache
    from metaq.rmq5.http2 import ProtocolError
    n = rmq5_limits.GRPC_CACHED_HEADER_BLOCKS
    lists = [_method_headers(b"Method%d" % i) for i in range(n + 1)]
    checks = []
    real = headercache.check_fields
    monkeypatch.setattr(headercache, "check_fields", lambda h, trailers=False: (checks.append(h), real(h, trailers)))
    checked = headercache.CheckedHeaders()
    for _ in range(3):
        for headers in lists[:n]:
            assert checked.request(headers)[":path"] == headers[2][1].decode()
    assert len(checks) == n
    checked.request(lists[n])
    for headers in lists[1:]:
        checked.request(headers)
    assert len(checks) == n + 1
    checked.request(lists[0])
    assert len(checks) == n + 2
    bad = lists[0] + [(b"X-Upper", b"1")]
    for _ in range(2):
        with pytest.raises(ProtocolError):
            checked.request(bad)
    assert len(checks) == n + 4
