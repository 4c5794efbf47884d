"""metaq's Python client: producers, consumer groups, offsets and admin (DESIGN §8).

    from metaq.client import Producer, Consumer, Message

Plain stdlib sockets and threads; when an application has monkey-patched
gevent they are cooperative greenlets. ZooKeeper is reached through kazoo.
"""

try:
    from metaq import lazy_exports
except ImportError as exc:  # metaq/__init__.py never ran: 'metaq' is some folder of that name, not this package
    import metaq

    _folders = ", ".join(sorted(set(getattr(metaq, "__path__", None) or ["?"])))
    raise ImportError(
        "'metaq' is the folder %s, not the metaq package: a folder named metaq without an __init__.py (a clone of "
        "the repository) in the current directory or the script's hides the installed package. Run from another "
        "directory, or from inside the clone" % _folders) from exc

_EXPORTS = {
    "Message": "metaq.client.message",
    "Partition": "metaq.client.message",
    "SendResult": "metaq.client.message",
    "ManyResult": "metaq.client.message",
    "Producer": "metaq.client.producer",
    "RoundRobinSelector": "metaq.client.selectors",
    "RandomSelector": "metaq.client.selectors",
    "KeySelector": "metaq.client.selectors",
    "Consumer": "metaq.client.consumer",
    "LocalTransaction": "metaq.transactions.client",
    "XaError": "metaq.transactions.client",
    "Xid": "metaq.transactions.client",
    "XAResource": "metaq.transactions.resource",
    "Coordinator": "metaq.client.coordinator",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
