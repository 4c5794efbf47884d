"""The answers to a burst of puts (protocol/burst.py): the general path's replies byte for byte; C equals Python."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metaq.protocol.burst import encode_put_acks_py, encode_results
from metaq.protocol.text import encode_result

try:
    from metaq.native._bytes import encode_put_acks as encode_put_acks_c
except ImportError:  # not built: the Python reference is what runs
    encode_put_acks_c = None

int32 = st.integers(-2**31, 2**31 - 1)


def frames_with(opaques):
    """Frames as scan_puts gives them; only the opaque (field 3) matters here."""
    return [(b"t", 0, 0, opaque, 0, 0, 0) for opaque in opaques]


@given(st.lists(int32, max_size=20), st.integers(0, 2**63 - 1000), st.integers(0, 2**31 - 1),
       st.integers(0, 2**62))
def test_acks_are_what_the_general_path_answers(opaques, first_id, partition, first_offset):
    frames = frames_with([7] + opaques)
    expected = b"".join(encode_result(200, b"%d %d %d" % (first_id + k, partition, first_offset + k), opaque)
                        for k, opaque in enumerate(opaques))
    assert encode_put_acks_py(frames, 1, len(opaques), first_id, partition, first_offset) == expected


@pytest.mark.skipif(encode_put_acks_c is None, reason="metaq.native._bytes was not built")
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(int32, max_size=40), st.integers(0, 5), st.integers(0, 2**63 - 1000), st.integers(-2, 2**31 - 1),
       st.integers(-2, 2**62))
def test_c_acks_equal_the_python_reference(opaques, start, first_id, partition, first_offset):
    frames = frames_with(opaques)
    start = min(start, len(frames))
    count = len(frames) - start
    assert (encode_put_acks_c(frames, start, count, first_id, partition, first_offset)
            == encode_put_acks_py(frames, start, count, first_id, partition, first_offset))


@pytest.mark.skipif(encode_put_acks_c is None, reason="metaq.native._bytes was not built")
def test_c_acks_refuse_frames_past_the_list():
    with pytest.raises(IndexError):
        encode_put_acks_c(frames_with([1, 2]), 1, 2, 0, 0, 0)


def test_results_one_per_opaque():
    assert encode_results(500, b"flush failed", [5, -6]) == (b"result 500 12 5\r\nflush failed"
                                                              b"result 500 12 -6\r\nflush failed")
    assert encode_results(500, b"x", []) == b""
