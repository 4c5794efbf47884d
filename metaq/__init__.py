"""metaq: a MetaQ-style message broker (text protocol, shared commit log, 16-byte index units)."""

__version__ = "0.1.0"

import metaq.native  # noqa: E402  (the compiled modules found first: metaq/native/__init__.py)

metaq.native.install()


def lazy_exports(package, exports):
    """A module ``__getattr__`` that imports ``exports[name]`` only when ``name`` is first used.

    ``package.__init__`` keeps importing cheap (``metaq.client`` without kazoo threads,
    ``metaq.spark`` without pyspark): ``__getattr__ = lazy_exports(__name__, _EXPORTS)``.
    """
    import importlib
    import sys

    def __getattr__(name):
        module = exports.get(name)
        if module is None:
            raise AttributeError("module %r has no attribute %r" % (package, name))
        value = getattr(importlib.import_module(module), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
