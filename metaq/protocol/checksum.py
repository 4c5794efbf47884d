"""The project's one CRC-32 module.

Both functions compute the IEEE 802.3 CRC-32 (polynomial 0x04C11DB7,
reflected 0xEDB88320, initial value and final XOR 0xFFFFFFFF), which is the
same CRC-32 as Java's ``java.util.zip.CRC32`` that MetaQ uses. They call
``metaq._bytes.crc32`` when the C helper is built (Intel's ISA-L when it
was found at build time, faster than zlib: ``IMPLEMENTATION`` says which; figures
in bench/README.md, "CRC-32") and ``zlib.crc32`` otherwise; zlib is faster than
crcmod's C extension. The tests check every one of them against crcmod's ``crc-32``.
"""

import zlib

from metaq import speedups

__all__ = ["crc32", "metaq_checksum", "IMPLEMENTATION"]

_crc32 = speedups.load("crc32", zlib.crc32)
#: Where the CRC-32 comes from: "isa-l", "zlib" (the C helper linked to it) or "python-zlib" (not built).
IMPLEMENTATION = speedups.load("CRC32_IMPL", "python-zlib")


def crc32(data, start=0):
    """Unsigned 32-bit CRC-32 of ``data`` (bytes, bytearray or memoryview).

    ``start`` is the CRC of the bytes before ``data``, so a CRC can be computed
    over several pieces: ``crc32(b, crc32(a)) == crc32(a + b)``.
    """
    return _crc32(data, start) & 0xFFFFFFFF


def metaq_checksum(data):
    """MetaQ's ``CheckSum.crc32``: CRC-32 of ``data`` masked to 31 bits, never negative.

    This is the value of the ``checksum`` field of a ``put``/``sync`` line and
    of a message record header.
    """
    return _crc32(data) & 0x7FFFFFFF
