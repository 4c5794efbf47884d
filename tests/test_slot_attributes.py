"""The C helper's attribute access on its hot paths (``_slots.c``: an object slot read and written at its offset,
found once per type and name) answers as ``getattr`` and ``setattr`` do, including after the type changed under a
kept entry."""

import pytest

from metaq import speedups

C = speedups.load("slot_getattr", None)
SET = speedups.load("slot_setattr", None)
pytestmark = pytest.mark.skipif(C is None, reason="the C helper is not built")


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self):
        self.a = "a"


class Sub(Slotted):
    __slots__ = ("c",)


class Plain:
    def __init__(self):
        self.a = "plain"


def test_a_slot_is_read_and_written_as_getattr_and_setattr_do():
    o = Slotted()
    assert C(o, "a") == "a"
    SET(o, "a", "x")
    assert o.a == "x" and C(o, "a") == "x"
    SET(o, "b", [1])
    assert C(o, "b") == [1] and o.b == [1]


def test_an_unset_slot_and_a_missing_name_raise_attribute_error():
    o = Slotted()
    with pytest.raises(AttributeError):
        C(o, "b")
    with pytest.raises(AttributeError):
        C(o, "nope")
    with pytest.raises(AttributeError):
        SET(o, "nope", 1)  # no dict: as setattr


def test_a_subclass_reads_its_bases_slots_and_its_own():
    s = Sub()
    s.c = "c"
    assert (C(s, "a"), C(s, "c")) == ("a", "c")
    SET(s, "a", "sub")
    assert s.a == "sub" and C(Slotted(), "a") == "a"


def test_a_class_attribute_set_over_a_kept_slot_is_what_is_read_after():
    """The type's version tag moves when the class changes: a property set over a slot read before is used."""

    class Changing:
        __slots__ = ("v",)

    o = Changing()
    o.v = 1
    assert C(o, "v") == 1
    Changing.v = property(lambda self: "property")
    assert C(o, "v") == "property" == o.v
    with pytest.raises(AttributeError):
        SET(o, "v", 2)  # a property without a setter: as setattr


def test_objects_with_a_dict_and_names_made_at_run_time_answer_as_getattr():
    p = Plain()
    assert C(p, "a") == "plain"
    SET(p, "".join(["a", "b"]), 3)  # a name not interned
    assert p.ab == 3 and C(p, "".join(["a", "b"])) == 3


def test_a_read_only_member_is_read_and_not_written():
    """A member its type marks read-only (a slice's ``start``) is read, and refused as setattr refuses it."""
    s = slice(1, 2, 3)
    assert C(s, "start") == 1
    with pytest.raises(AttributeError):
        SET(s, "start", 5)
    assert s.start == 1


def test_a_class_with_its_own_attribute_access_is_asked_as_getattr_and_setattr_ask_it():
    """A slotted class whose ``__getattribute__`` or ``__setattr__`` is its own (or its base's) is not read or written
    at the slot's offset behind its back."""

    class Hooked:
        __slots__ = ("x",)

        def __getattribute__(self, name):
            return "hooked" if name == "x" else object.__getattribute__(self, name)

    class Guarded:
        __slots__ = ("x",)

        def __setattr__(self, name, value):
            raise AttributeError("read-only by its class")

    class GuardedSub(Guarded):
        __slots__ = ("y",)

    h = Hooked()
    object.__setattr__(h, "x", 1)
    assert C(h, "x") == "hooked" == h.x
    for g in (Guarded(), GuardedSub()):
        object.__setattr__(g, "x", 1)
        assert C(g, "x") == 1
        with pytest.raises(AttributeError, match="read-only by its class"):
            SET(g, "x", 2)
        assert g.x == 1
