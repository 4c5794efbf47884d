"""metaq's Python client: producers, consumer groups, offsets and admin (DESIGN §8).

    from metaq.client import Producer, Consumer, Message

Plain stdlib sockets and threads; when an application has monkey-patched
gevent they are cooperative greenlets. ZooKeeper is reached through kazoo.
"""

from metaq import lazy_exports

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
