import zlib

import crcmod.predefined
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metaq.protocol.checksum import IMPLEMENTATION, crc32, metaq_checksum

CRCMOD_CRC32 = crcmod.predefined.mkCrcFun("crc-32")


def test_metaq_checksum_of_hello_is_the_reference_value():
    assert metaq_checksum(b"hello") == 907060870
    assert crc32(b"hello") == 0x3610A686


def test_checksum_is_masked_to_31_bits_even_when_the_crc_has_bit_31_set():
    data = b"a"  # CRC-32 0xE8B7BE43 has bit 31 set
    assert crc32(data) == 0xE8B7BE43
    assert metaq_checksum(data) == 0x68B7BE43


def test_empty_input():
    assert crc32(b"") == 0
    assert metaq_checksum(b"") == 0


@settings(max_examples=200)
@given(st.binary(max_size=2048))
def test_crc32_matches_crcmod(data):
    assert crc32(data) == CRCMOD_CRC32(data)
    assert metaq_checksum(data) == CRCMOD_CRC32(data) & 0x7FFFFFFF


@settings(max_examples=100)
@given(st.binary(max_size=512), st.binary(max_size=512))
def test_running_crc_over_pieces_equals_crc_of_the_whole(a, b):
    assert crc32(b, crc32(a)) == CRCMOD_CRC32(a + b)


@settings(max_examples=50)
@given(st.binary(max_size=512))
def test_accepts_memoryview_and_bytearray(data):
    expected = CRCMOD_CRC32(data)
    assert crc32(memoryview(data)) == expected
    assert crc32(bytearray(data)) == expected
    assert metaq_checksum(memoryview(data)) == expected & 0x7FFFFFFF


try:
    from metaq.native import _bytes
except ImportError:  # not built: checksum.py runs zlib.crc32, which the tests above check
    _bytes = None


@pytest.mark.skipif(_bytes is None, reason="metaq.native._bytes was not built")
@settings(max_examples=300)
@given(st.binary(max_size=9000), st.integers(0, 2**32 - 1))
def test_c_crc32_equals_zlib_and_crcmod_from_any_start(data, start):
    """The C helper's CRC-32 (ISA-L or zlib, see CRC32_IMPL) is zlib's, also past 4 KiB where it drops the GIL."""
    assert _bytes.crc32(data, start) == zlib.crc32(data, start)
    assert _bytes.crc32(memoryview(data)) == crcmod.predefined.mkCrcFun("crc-32")(data)


@pytest.mark.skipif(_bytes is None, reason="metaq.native._bytes was not built")
def test_c_crc32_of_a_large_buffer_and_its_implementation_name():
    data = bytes(range(256)) * 40000  # 10 MB
    assert _bytes.crc32(data) == zlib.crc32(data)
    assert _bytes.CRC32_IMPL in ("isa-l", "zlib")
    assert IMPLEMENTATION in ("isa-l", "zlib", "python-zlib")
