"""An ack's receipt handles read in one call: the C helper's ``pop_parse_handles`` against its Python twin, and both
against the one-handle ``parse_handle`` (what a handle is: four runs of ASCII digits, at most 96 characters)."""

import random

import pytest

from metaq import speedups
from metaq.pop.records import InvalidHandle, handle, parse_handle, parse_handles_py

if not speedups.built():
    pytest.skip("metaq._speedups was not built", allow_module_level=True)
from metaq._speedups import pop_parse_handles  # noqa: E402


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


def test_each_case_as_parse_handle_reads_it():
    assert len(CASES[22]) == 96 and len(CASES[23]) == 97
    want = [_expected(t) for t in CASES]
    assert want[0] == (0, 0, 1, 1764300000000) and want[3] == (7, 8, 9, 10)
    assert want[22] == (1, 2, 3, int("1" * 90)) and want[23] is None and want[21] == (1, 2, 3, 10 ** 19 - 1)
    assert parse_handles_py(CASES) == want
    assert pop_parse_handles(CASES) == want


def test_seeded_fuzz_twins_agree():
    rnd = random.Random(57)
    alphabet = "0123456789" * 4 + "::::" + "ab -+\u0663\u00e9"
    texts = []
    for _ in range(20000):
        n = rnd.choice((rnd.randint(0, 12), rnd.randint(7, 40), rnd.randint(90, 100)))
        texts.append("".join(rnd.choice(alphabet) for _ in range(n)))
        parts = [str(rnd.choice((0, 1, rnd.randint(0, 10 ** rnd.randint(1, 25))))) for _ in range(4)]
        texts.append(":".join(parts))
    got = pop_parse_handles(texts)
    assert got == parse_handles_py(texts) == [_expected(t) for t in texts]
    assert sum(1 for g in got if g is not None) > 20000  # the fuzz reaches both sides


def test_a_list_is_required():
    with pytest.raises(TypeError, match="a list expected"):
        pop_parse_handles(("1:2:3:4",))
    assert pop_parse_handles([]) == []
