"""Receipt handles: an ack's handles read in one call (``parse_handles_py`` and the C helper's ``pop_parse_handles``,
each case run against both, and both against the one-handle ``parse_handle``: four runs of ASCII digits, at most 96
characters), and a handle's text written (``handle_py`` and ``pop_handle``)."""

import random

import pytest

from metaq.pop.records import InvalidHandle, handle, handle_py, parse_handle, parse_handles_py
from tests.harness.native import both, built

PARSERS = both(parse_handles_py, "pop_parse_handles")
WRITERS = both(handle_py, "pop_handle")


def _expected(text):
    try:
        return parse_handle(text)
    except InvalidHandle:
        return None


CASES = [
    handle(0, 0, 1, 1764300000000), handle(3, 2 ** 40, 17, 2 ** 62), "0:0:0:0", "007:08:09:010",
    "1:2:3", "1:2:3:4:5", ":1:2:3", "1:2:3:", "1::2:3", "", "a:b:c:d", "1:2:3:4 ", " 1:2:3:4", "1:2:3:4\n",
    "1:2:3:\u0663", "\u0661:2:3:4", "1:2:3:4\u00e9", "+1:2:3:4", "-1:2:3:4", "1:2:3:0x4",
    "1:2:3:" + "9" * 18, "1:2:3:" + "9" * 19, "1:2:3:" + "1" * 90, "1:2:3:" + "1" * 91,  # 96 and 97 characters
    "9" * 30 + ":" + "8" * 30 + ":" + "7" * 20 + ":" + "6" * 13,
    b"1:2:3:4", 5, None, ["1:2:3:4"],
]


@pytest.mark.parametrize("parse_handles", PARSERS)
def test_each_case_as_parse_handle_reads_it(parse_handles):
    assert len(CASES[22]) == 96 and len(CASES[23]) == 97
    want = [_expected(t) for t in CASES]
    assert want[0] == (0, 0, 1, 1764300000000) and want[3] == (7, 8, 9, 10)
    assert want[22] == (1, 2, 3, int("1" * 90)) and want[23] is None and want[21] == (1, 2, 3, 10 ** 19 - 1)
    assert parse_handles(CASES) == want


@pytest.mark.parametrize("parse_handles", PARSERS)
def test_seeded_fuzz_as_parse_handle_reads_it(parse_handles):
    rnd = random.Random(57)
    alphabet = "0123456789" * 4 + "::::" + "ab -+\u0663\u00e9"
    texts = []
    for _ in range(20000):
        n = rnd.choice((rnd.randint(0, 12), rnd.randint(7, 40), rnd.randint(90, 100)))
        texts.append("".join(rnd.choice(alphabet) for _ in range(n)))
        parts = [str(rnd.choice((0, 1, rnd.randint(0, 10 ** rnd.randint(1, 25))))) for _ in range(4)]
        texts.append(":".join(parts))
    got = parse_handles(texts)
    assert got == [_expected(t) for t in texts]
    assert sum(1 for g in got if g is not None) > 20000  # the fuzz reaches both sides


@pytest.mark.skipif(built("pop_parse_handles") is None, reason="metaq.native._bytes was not built")
def test_the_c_one_requires_a_list():
    pop_parse_handles = built("pop_parse_handles")
    with pytest.raises(TypeError, match="a list expected"):
        pop_parse_handles(("1:2:3:4",))
    assert pop_parse_handles([]) == []


@pytest.mark.parametrize("write", WRITERS)
def test_handle_text_as_the_format_writes_it(write):
    rnd = random.Random(61)
    cases = [(0, 0, 1, 1764300000000), (3, 2 ** 63 - 1, 2, -(2 ** 63)), (True, False, 1, 0), (1, 2 ** 64, 3, 4),
             (-(2 ** 70), 0, 0, 0)]
    cases += [tuple(rnd.choice((rnd.randint(-10, 10), rnd.randint(0, 2 ** 63 - 1), rnd.randint(-2 ** 80, 2 ** 80)))
                    for _ in range(4)) for _ in range(5000)]
    for c in cases:
        assert write(*c) == "%d:%d:%d:%d" % c
    texts = [write(p, o, a, d) for p, o, a, d in [(1, 2, 3, 4), (0, 2 ** 40, 1, 1764300000000)]]
    assert parse_handles_py(texts) == [(1, 2, 3, 4), (0, 2 ** 40, 1, 1764300000000)]
    with pytest.raises(TypeError):
        write(1, 2, 3)


@pytest.mark.skipif(built("pop_handle") is None, reason="metaq.native._bytes was not built")
def test_the_c_writer_refuses_what_is_not_an_int():  # its domain is ints; the format would write a float's
    with pytest.raises(TypeError, match="an int expected"):
        built("pop_handle")(1, 2, 3, 4.0)
