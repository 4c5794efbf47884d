"""HTTP/2 header blocks coded and checked once while a connection repeats them: HPACK reused while the compression
context stands still (hpack's encoder and decoder), and a request's header list checked once (``CheckedHeaders``).

A gRPC connection repeats itself: every response opens with the same three headers and most end with the same
``grpc-status: 0``, and a client such as grpcio sends the same request header block, byte for byte, for each call
of one method (every field indexed). HPACK's result depends only on the block (or header list) and the dynamic
table, so a block decoded, or a header list encoded, without changing the table gives the same result again for as
long as the table is unchanged: ``CachedEncoder`` and ``CachedDecoder`` keep that result and hand it out again
instead of running hpack's pure-Python coder (the decoder keeps a few blocks, ``limits.GRPC_CACHED_HEADER_BLOCKS``:
a connection alternates the blocks of the few methods it calls). Nothing else changes: a block that inserts into the
table, resizes it or meets another size limit is coded by hpack as before, and every decoded header list is still
checked (``CheckedHeaders``).

The table counts as unchanged while its count of changes (``CountedTable``: every entry added, every size limit
set) is the same and no size change waits to be sent.
"""

import re

from hpack import Decoder, Encoder
from hpack.table import HeaderTable

from metaq.rmq5 import limits as rmq5_limits
from metaq.rmq5.http2 import ProtocolError

#: A field name HTTP/2 accepts (RFC 9113 section 8.2.1): visible ASCII, no upper case, a colon only first.
_NAME = re.compile(rb":?[\x21-\x39\x3b-\x40\x5b-\x7e]+\Z")
#: A field value it refuses: NUL, CR or LF anywhere, or white space at either end.
_BAD_VALUE = re.compile(rb"[\0\r\n]|\A[ \t]|[ \t]\Z")
#: Connection-specific fields (RFC 9113 section 8.2.2).
_CONNECTION = frozenset((b"connection", b"proxy-connection", b"keep-alive", b"transfer-encoding", b"upgrade"))
_REQUEST_PSEUDO = frozenset((b":method", b":scheme", b":authority", b":path", b":protocol"))


class CountedTable(HeaderTable):
    """hpack's dynamic table, counting its changes (``changes``): every entry added (and what it evicted) and every
    maximum size set. hpack changes a table through these two alone, so the same count is the same table."""

    def __init__(self):
        super().__init__()
        self.changes = 0

    def add(self, name, value):
        self.changes += 1
        super().add(name, value)

    @property
    def maxsize(self):
        return self._maxsize

    @maxsize.setter
    def maxsize(self, newmax):
        self.changes += 1
        HeaderTable.maxsize.fset(self, newmax)


class CachedEncoder(Encoder):
    """hpack's encoder, reusing the block of each header list in ``constant`` (tuples of ``(name, value)``
    bytes pairs: the port's fixed response headers and trailers) while the table stands still. Other header lists
    are encoded as hpack does; the cache holds at most one block per constant list."""

    def __init__(self, constant):
        super().__init__()
        self.header_table = CountedTable()
        self._constant = frozenset(constant)
        self._blocks = {}  # header list (a tuple) -> (the table's changes, huffman, its block)

    def encode(self, headers, huffman=True):
        table = self.header_table
        key = tuple(headers)
        if key not in self._constant or table.resized:
            return super().encode(key, huffman)
        changes = table.changes
        hit = self._blocks.get(key)
        if hit is not None and hit[0] == changes and hit[1] == huffman:
            return hit[2]
        block = super().encode(key, huffman)
        if table.changes == changes:  # nothing inserted: the same block for as long as the table stands
            self._blocks[key] = (changes, huffman, block)
        else:
            self._blocks.pop(key, None)
        return block


class CachedDecoder(Decoder):
    """hpack's decoder, reusing the header lists of the last ``blocks`` distinct blocks it decoded that changed
    nothing (every field indexed or a literal not indexed), while the table and limits are still as they were when
    they were decoded: a connection calling a few methods alternates a few repeated blocks. Every kept list stands
    for one state of the table (``_state``); a block that changes the table, or a table or limit that differs from
    that state, drops them all (an HPACK table never goes back to an earlier state). Past ``blocks`` the oldest kept
    block goes. Each call gets a list of its own; hpack's checks (list size, table size) ran on the block once and
    hold for the same block under the same table and limits."""

    def __init__(self, *args, blocks=rmq5_limits.GRPC_CACHED_HEADER_BLOCKS, **kwargs):
        super().__init__(*args, **kwargs)
        self.header_table = CountedTable()
        self._blocks = blocks
        self._state = None  # (the table's changes, limits) every kept list was decoded under
        self._lists = {}  # (block, raw) -> its header list (a tuple), oldest first

    def decode(self, data, raw=False):
        changes = self.header_table.changes
        key = (bytes(data), raw)
        state = self._state
        if (state is not None and state[0] == changes and state[1] == self.max_header_list_size
                and state[2] == self.max_allowed_table_size):
            hit = self._lists.get(key)
            if hit is not None:
                return list(hit)
        elif self._lists:
            self._lists.clear()
        self._state = None
        headers = super().decode(data, raw)
        if self.header_table.changes != changes:  # it inserted or resized: nothing kept stands any more
            self._lists.clear()
            return headers
        lists = self._lists
        if len(lists) >= self._blocks:
            del lists[next(iter(lists))]
        lists[key] = tuple(headers)
        self._state = (changes, self.max_header_list_size, self.max_allowed_table_size)
        return headers


def check_fields(headers, trailers=False):
    """RFC 9113's checks of a request's (or a client's trailers') header list as a server receives it (bytes
    pairs; ProtocolError when one fails): field names and values (section 8.2.1), no connection-specific field and
    ``te`` only ``trailers`` (8.2.2), pseudo-headers first, known, once each and none in trailers, a request's
    ``:method``, ``:scheme`` and a non-empty ``:path`` (CONNECT's own rules aside), ``:authority`` or ``host`` and
    equal when both (8.3.1)."""
    pseudo = {}
    regular = False
    host = None
    for name, value in headers:
        _check_field(name, value)
        if name[0] == 0x3A:
            if regular or trailers or name in pseudo or name not in _REQUEST_PSEUDO:
                raise ProtocolError("a pseudo-header field %r out of place, repeated or unknown" % name[:40])
            pseudo[name] = value
            continue
        regular = True
        if name in _CONNECTION:
            raise ProtocolError("a connection-specific header field %r" % name)
        if name == b"te" and value.lower() != b"trailers":
            raise ProtocolError("te other than trailers")
        if name == b"host":
            if host is not None:
                raise ProtocolError("more than one host header field")
            host = value
    if not trailers:
        _check_request(pseudo, host)


def _check_field(name, value):
    if not _NAME.match(name):
        raise ProtocolError("an illegal header field name %r" % name[:40])
    if value and _BAD_VALUE.search(value):
        raise ProtocolError("an illegal value of header field %r" % name[:40])


def _check_request(pseudo, host):
    """A request's pseudo-headers (8.3.1) and its ``:authority`` or ``host``."""
    method = pseudo.get(b":method")
    if method is None:
        raise ProtocolError("a request without :method")
    if method == b"CONNECT" and b":protocol" not in pseudo:
        if b":scheme" in pseudo or b":path" in pseudo:
            raise ProtocolError("CONNECT with :scheme or :path")
    else:
        if b":scheme" not in pseudo or not pseudo.get(b":path"):
            raise ProtocolError("a request without :scheme or a non-empty :path")
        if b":protocol" in pseudo and method != b"CONNECT":
            raise ProtocolError(":protocol in a request other than CONNECT")
    authority = pseudo.get(b":authority")
    if authority is None and host is None:
        raise ProtocolError("a request without :authority or host")
    if authority is not None and host is not None and authority != host:
        raise ProtocolError(":authority and host differ")


class CheckedHeaders:
    """The checks of inbound headers (``check_fields``), run once for a header list equal to one of the last
    ``lists`` distinct lists checked: a gRPC client sends the same list for each call of a method, and calls a few
    methods on one connection. A list that fails raises ``ProtocolError``, which ends the connection (GOAWAY
    PROTOCOL_ERROR), and is not kept. Past ``lists`` the oldest kept list goes."""

    __slots__ = ("_lists", "_checked")

    def __init__(self, lists=rmq5_limits.GRPC_CACHED_HEADER_BLOCKS):
        self._lists = lists
        self._checked = {}  # request header list (a tuple) -> its metadata, oldest first

    def request(self, headers):
        """The metadata of a request's header list (bytes pairs, as HPACK decoded them), once checked: names and
        values as text, a repeated field's values joined with "," (a repeated pseudo-header fails the checks); the
        caller's own dict."""
        key = tuple(headers)
        checked = self._checked
        hit = checked.get(key)
        if hit is not None:
            return dict(hit)
        check_fields(key)
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
        if len(checked) >= self._lists:
            del checked[next(iter(checked))]
        checked[key] = metadata
        return dict(metadata)

    def trailers(self, headers):
        """Check the trailers a client sent on a stream (ProtocolError when they fail)."""
        check_fields(headers, trailers=True)
