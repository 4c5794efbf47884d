"""HTTP/2 header blocks coded and checked once while a connection repeats them: HPACK reused while the compression
context stands still (h2's encoder and decoder), and a request's header list checked once (``CheckedHeaders``).

A gRPC connection repeats itself: every response opens with the same three headers and most end with the same
``grpc-status: 0``, and a client such as grpcio sends the same request header block, byte for byte, for each call
of one method (every field indexed). HPACK's result depends only on the block (or header list) and the dynamic
table, so a block decoded, or a header list encoded, without changing the table gives the same result again for as
long as the table is unchanged: ``CachedEncoder`` and ``CachedDecoder`` keep that result and hand it out again
instead of running hpack's pure-Python coder. Nothing else changes: a block that inserts into the table, resizes it
or meets another size limit is coded by hpack as before, and h2 still checks every decoded header as it does.

The table counts as unchanged while its newest entry is the same object, its entry count and size limits are the
same and no size change waits to be sent: hpack only ever inserts a new tuple at the front (evicting from the back),
so any insertion since replaced that object.
"""

from h2.exceptions import ProtocolError
from h2.utilities import HeaderValidationFlags, validate_headers
from hpack import Decoder, Encoder

#: h2's checks of a request's headers as a server receives them, and of trailers a client sends.
_REQUEST = HeaderValidationFlags(is_client=False, is_trailer=False, is_response_header=False, is_push_promise=False)
_TRAILERS = HeaderValidationFlags(is_client=False, is_trailer=True, is_response_header=False, is_push_promise=False)


def _table_mark(table):
    """What tells a dynamic table changed: its newest entry (the object itself: an equal entry inserted again is
    another object), entry count and maximum size. Compare marks with ``_same``."""
    entries = table.dynamic_entries
    return entries[0] if entries else None, len(entries), table.maxsize


def _same(a, b):
    return a[0] is b[0] and a[1] == b[1] and a[2] == b[2]


class CachedEncoder(Encoder):
    """h2's HPACK encoder, reusing the block of each header list in ``constant`` (tuples of ``(name, value)``
    bytes pairs: the port's fixed response headers and trailers) while the table stands still. Other header lists
    are encoded as hpack does; the cache holds at most one block per constant list."""

    def __init__(self, constant):
        super().__init__()
        self._constant = frozenset(constant)
        self._blocks = {}  # header list (a tuple) -> (the table's mark, huffman, its block)

    def encode(self, headers, huffman=True):
        table = self.header_table
        key = tuple(headers)
        if key not in self._constant or table.resized:
            return super().encode(key, huffman)
        mark = _table_mark(table)
        hit = self._blocks.get(key)
        if hit is not None and _same(hit[0], mark) and hit[1] == huffman:
            return hit[2]
        block = super().encode(key, huffman)
        if _same(_table_mark(table), mark):  # nothing inserted: the same block for as long as the table stands
            self._blocks[key] = (mark, huffman, block)
        else:
            self._blocks.pop(key, None)
        return block


class CachedDecoder(Decoder):
    """h2's HPACK decoder, reusing the header list of the last block it decoded when that block changed nothing
    (every field indexed or a literal not indexed) and the table and limits are still as they were. Each call gets
    a list of its own; hpack's checks (list size, table size) ran on the block once and hold for the same block."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._last = None  # (block, raw, mark, limits, headers)

    def decode(self, data, raw=False):
        table = self.header_table
        mark = _table_mark(table)
        limits = (self.max_header_list_size, self.max_allowed_table_size)
        last = self._last
        if last is not None and last[0] == data and last[1] == raw and _same(last[2], mark) and last[3] == limits:
            return list(last[4])
        headers = super().decode(data, raw)
        if _same(_table_mark(table), mark):
            self._last = (bytes(data), raw, mark, limits, tuple(headers))
        else:
            self._last = None
        return headers


class CheckedHeaders:
    """h2's own checks of inbound headers (``h2.utilities.validate_headers``: legal characters, no empty names,
    ``te`` only ``trailers``, no connection-specific fields, the pseudo-headers a request needs and no others, host
    and authority, a non-empty path), run by the port instead of by h2 (its ``validate_inbound_headers`` off) so that
    a header list equal to the last one checked is not checked again: a gRPC client sends the same list for each
    call of a method. A list that fails raises ``ProtocolError``, which ends the connection as h2 ends it (GOAWAY
    PROTOCOL_ERROR)."""

    __slots__ = ("_last",)

    def __init__(self):
        self._last = None  # (the last request header list checked, its metadata)

    def request(self, headers):
        """The metadata of a request's header list (bytes pairs, as h2 decoded them), once checked: names and values
        as text, a repeated field's values joined with "," (a repeated pseudo-header fails the checks); the caller's own
        dict."""
        key = tuple(headers)
        last = self._last
        if last is not None and last[0] == key:
            return dict(last[1])
        for _ in validate_headers(key, _REQUEST):
            pass
        metadata = {}
        try:
            for name, value in key:
                name, value = name.decode("utf-8"), value.decode("utf-8")
                if name in metadata and not name.startswith(":"):
                    metadata[name] += "," + value
                else:
                    metadata[name] = value
        except UnicodeDecodeError:
            raise ProtocolError("a header field that is not UTF-8") from None
        self._last = (key, metadata)
        return dict(metadata)

    def trailers(self, headers):
        """Check the trailers a client sent on a stream (ProtocolError when they fail)."""
        for _ in validate_headers(tuple(headers), _TRAILERS):
            pass
