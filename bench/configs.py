"""Broker settings the benchmarks share."""

from metaq.client.local import SMALL_STORE


def full_size_store(**overrides):
    """``store:`` settings that undo ``small_config``'s: the schema's defaults for them, then ``overrides``.

    Benchmarks measure the real layout (1 GiB segments, 16 MiB index files).
    """
    from metaq.server.config import ServerConfig

    defaults = ServerConfig().store
    return dict({name: getattr(defaults, name) for name in SMALL_STORE}, **overrides)
