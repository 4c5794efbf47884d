"""The PROXY protocol header (HAProxy's, versions 1 and 2), sans-IO: bytes in, the client's address out.

A reverse proxy sends it first on each connection it opens to the broker, before the client's own bytes (a TLS
hello included), to say which client it carries. ``parse(data)`` reads it from the start of ``data``:

* ``None``: not complete yet, and every byte of ``data`` belongs to the header (a reader may consume them all and
  wait for more: it never takes a byte of the client's);
* ``(length, address)``: the header is the first ``length`` bytes; ``address`` is the client's ``(host, port)``,
  or None when the header names none (v1 ``UNKNOWN``, v2 ``LOCAL``: the proxy's own health check; a v2 family
  other than TCP over IPv4 or IPv6): the peer's address stands;
* ``ProxyHeaderError``: not a well-formed header within its bound (``limits.PROXY_V1_MAX_BYTES``,
  ``limits.PROXY_V2_MAX_BYTES``).

Strict: v1 must be one line of single-space-separated fields with addresses of its family and decimal ports; v2 must
carry version 2, command LOCAL or PROXY, an address block no shorter than its family's, and TLVs that exactly fill
the rest (their contents are not used).
"""

import ipaddress
import struct

from metaq import limits

__all__ = ["ProxyHeaderError", "parse", "V1_PREFIX", "V2_SIGNATURE"]

V1_PREFIX = b"PROXY "
V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
_V2_FIXED = 16
_V2_FAMILIES = {0x11: (4, 12), 0x21: (6, 36)}  # TCP over IPv4 / IPv6: (IP version, address block bytes)
_V2_BLOCK = {0x00: 0, 0x12: 12, 0x22: 36, 0x31: 216, 0x32: 216}  # UNSPEC, UDP, UNIX: no address the broker uses


class ProxyHeaderError(ValueError):
    """Not a well-formed PROXY header: why, in a few words."""


def parse(data):
    """``None`` (incomplete; every byte so far is the header's), ``(length, address or None)`` or raises
    ``ProxyHeaderError``: see the module doc."""
    n = min(len(data), len(V2_SIGNATURE))
    if data[:n] == V2_SIGNATURE[:n] and n:
        return _v2(data) if n == len(V2_SIGNATURE) else None
    n = min(len(data), len(V1_PREFIX))
    if data[:n] == V1_PREFIX[:n]:
        return _v1(data) if n == len(V1_PREFIX) else None
    raise ProxyHeaderError("no PROXY header (the connection came from a trusted proxy, which must send one)")


def _v1(data):
    end = data.find(b"\r\n", 0, limits.PROXY_V1_MAX_BYTES)
    if end < 0:
        if len(data) >= limits.PROXY_V1_MAX_BYTES:
            raise ProxyHeaderError("a PROXY v1 line longer than %d bytes" % limits.PROXY_V1_MAX_BYTES)
        if b"\n" in data or b"\r" in data[:-1]:
            raise ProxyHeaderError("a PROXY v1 line not ended by CRLF")
        return None
    fields = data[len(V1_PREFIX):end].split(b" ")
    if fields[0] == b"UNKNOWN":
        return end + 2, None
    if len(fields) != 5 or fields[0] not in (b"TCP4", b"TCP6"):
        raise ProxyHeaderError("a PROXY v1 line that is not TCP4, TCP6 or UNKNOWN with two addresses and ports")
    version = 4 if fields[0] == b"TCP4" else 6
    host = _v1_address(fields[1], version)
    _v1_address(fields[2], version)
    port = _v1_port(fields[3])
    _v1_port(fields[4])
    return end + 2, (host, port)


def _v1_address(field, version):
    try:
        address = ipaddress.ip_address(field.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ProxyHeaderError("a PROXY v1 address that is not an IP address") from None
    if address.version != version:
        raise ProxyHeaderError("a PROXY v1 address not of its line's family (TCP%d)" % version)
    return str(address)


def _v1_port(field):
    if not field.isdigit() or len(field) > 5 or (len(field) > 1 and field[:1] == b"0") or int(field) > 65535:
        raise ProxyHeaderError("a PROXY v1 port that is not a decimal number from 0 to 65535")
    return int(field)


def _v2(data):
    if len(data) < _V2_FIXED:
        return None
    version_command, family, length = struct.unpack_from(">BBH", data, 12)
    if version_command >> 4 != 2:
        raise ProxyHeaderError("a PROXY v2 header of version %d" % (version_command >> 4))
    command = version_command & 0x0F
    if command > 1:
        raise ProxyHeaderError("a PROXY v2 header with command %d (neither LOCAL nor PROXY)" % command)
    if _V2_FIXED + length > limits.PROXY_V2_MAX_BYTES:
        raise ProxyHeaderError("a PROXY v2 header of %d bytes: the limit is %d"
                               % (_V2_FIXED + length, limits.PROXY_V2_MAX_BYTES))
    known = _V2_FAMILIES.get(family)
    block = known[1] if known is not None else _V2_BLOCK.get(family)
    if block is None:
        raise ProxyHeaderError("a PROXY v2 header of unknown family 0x%02x" % family)
    if length < block:
        raise ProxyHeaderError("a PROXY v2 header too short for its addresses (%d bytes, family 0x%02x needs %d)"
                               % (length, family, block))
    total = _V2_FIXED + length
    if len(data) < total:
        return None
    _tlvs(data, _V2_FIXED + block, total)
    if command == 0 or known is None:  # LOCAL (the proxy's own check), or no TCP address: the peer's stands
        return total, None
    version, _ = known
    size = 4 if version == 4 else 16
    host = str(ipaddress.ip_address(bytes(data[_V2_FIXED:_V2_FIXED + size])))
    port = struct.unpack_from(">H", data, _V2_FIXED + 2 * size)[0]
    return total, (host, port)


def _tlvs(data, at, end):
    """Checks that the TLVs from ``at`` exactly fill the header up to ``end``."""
    while at < end:
        if end - at < 3:
            raise ProxyHeaderError("a PROXY v2 TLV cut short")
        at += 3 + struct.unpack_from(">H", data, at + 1)[0]
        if at > end:
            raise ProxyHeaderError("a PROXY v2 TLV longer than its header")
