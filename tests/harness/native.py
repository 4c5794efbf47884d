"""The two definitions of a function that reads or writes bytes: its Python definition and its C one in
``metaq.native._bytes``, as pytest parameters, so that each case runs against both (as aiohttp runs every parser case
against both its parsers). The C one is skipped where the helper was not built (or was built without it)."""

import pytest


def built(name):
    """``metaq.native._bytes.<name>``, or None where the helper (or that function) was not built."""
    try:
        from metaq.native import _bytes
    except ImportError:
        return None
    return getattr(_bytes, name, None)


def both(python_definition, name):
    """``[python_definition, metaq.native._bytes.<name>]`` as pytest parameters (ids ``python`` and ``c``; the second
    skipped where it was not built), for ``pytest.mark.parametrize``."""
    c = built(name)
    return [pytest.param(python_definition, id="python"),
            pytest.param(c, id="c",
                         marks=pytest.mark.skipif(c is None, reason="metaq.native._bytes.%s not built" % name))]
