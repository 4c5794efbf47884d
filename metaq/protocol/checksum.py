"""The project's one CRC-32 module.

Both functions use ``zlib.crc32``: the IEEE 802.3 polynomial (0x04C11DB7,
reflected 0xEDB88320, initial value and final XOR 0xFFFFFFFF), which is the
same CRC-32 as Java's ``java.util.zip.CRC32`` that MetaQ uses. ``zlib`` is
several times faster than crcmod's C extension, so it serves the hot path;
the tests check it against crcmod's ``crc-32``.
"""

import zlib

__all__ = ["crc32", "metaq_checksum"]


def crc32(data, start=0):
    """Unsigned 32-bit CRC-32 of ``data`` (bytes, bytearray or memoryview).

    ``start`` is the CRC of the bytes before ``data``, so a CRC can be computed
    over several pieces: ``crc32(b, crc32(a)) == crc32(a + b)``.
    """
    return zlib.crc32(data, start) & 0xFFFFFFFF


def metaq_checksum(data):
    """MetaQ's ``CheckSum.crc32``: CRC-32 of ``data`` masked to 31 bits, never negative.

    This is the value of the ``checksum`` field of a ``put``/``sync`` line and
    of a message record header.
    """
    return zlib.crc32(data) & 0x7FFFFFFF
