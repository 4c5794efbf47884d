"""metaq's Python client: producers, consumer groups, offsets and admin (DESIGN §8).

    from metaq.client import Producer, Consumer, Message

Plain stdlib sockets and threads; when an application has monkey-patched
gevent they are cooperative greenlets. ZooKeeper is reached through kazoo.

Every feature's client side is here, a module named after its feature (keys.py, offsets.py, pop.py,
priorities.py, reqreply.py, timers.py, transactions.py and xa.py, idempotence.py), and every ``metaq-admin``
command in admin/ (its docstring maps them). Why here and not in the feature packages: the Producer and Consumer
offer the features' calls and the client parses with the whole text command set (metaq/textcommands.py, which
lists the features' wire modules), so the client imports the features' codecs; a feature's own client module,
which builds on the client's messages and replies, would import the client back. Here, the client imports the
features and none imports it: the import graph points one way (tests/test_layers.py).
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
    "LocalTransaction": "metaq.client.transactions",
    "XaError": "metaq.client.transactions",
    "Xid": "metaq.client.transactions",
    "XAResource": "metaq.client.xa",
    "Coordinator": "metaq.client.coordinator",
    "SimpleConsumer": "metaq.client.pop",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_exports(__name__, _EXPORTS)
