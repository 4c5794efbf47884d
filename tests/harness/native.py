"""The two definitions of a function that reads or writes bytes: its Python definition and its C one in
``metaq._speedups``, as pytest parameters, so that each case runs against both (as aiohttp runs every parser case
against both its parsers). The C one is skipped where the helper was not built (or was built without it)."""

import pytest


def built(name):
    """``metaq._speedups.<name>``, or None where the helper (or that function) was not built."""
    try:
        from metaq import _speedups
    except ImportError:
        return None
    return getattr(_speedups, name, None)


def both(python_definition, name):
    """``[python_definition, metaq._speedups.<name>]`` as pytest parameters (ids ``python`` and ``c``; the second
    skipped where it was not built), for ``pytest.mark.parametrize``."""
    c = built(name)
    return [pytest.param(python_definition, id="python"),
            pytest.param(c, id="c", marks=pytest.mark.skipif(c is None, reason="metaq._speedups.%s not built" % name))]
