"""The brokers a long-running Spark stream reader asks, with its connections kept between micro-batches.

Spark asks a streaming source for the latest offsets before every micro-batch, and with its default
trigger every few milliseconds while there is no new data. ``BrokerView`` keeps one connection per
broker and one ZooKeeper session (its masters kept current by watches) for the life of the reader,
learns a listed broker's id once, and forgets a connection that failed (the next call opens a new one).
It is never pickled: the copy of the reader an executor gets starts without one.
"""

import ssl

from metaq import errors
from metaq.client import security as client_security
from metaq.client.connection import BrokerConnection
from metaq.client.discovery import broker_id_from_stats
from metaq.protocol import events as ev

__all__ = ["BrokerView", "UNREACHABLE", "is_unreachable"]

#: Errors that mean "this broker cannot be reached now" (its partitions wait); anything else raises.
UNREACHABLE = (OSError, errors.Unavailable)


def is_unreachable(exc):
    """True for a broker that is down or cut off; False for a TLS failure (a bad certificate is not "down")."""
    return isinstance(exc, UNREACHABLE) and not isinstance(exc, ssl.SSLError)


class BrokerView:
    """Connections to the stream's brokers (``opts``: a ``StreamOptions``), opened on first use."""

    def __init__(self, opts):
        self.opts = opts
        self._security = None
        self._conns = {}  # url -> BrokerConnection
        self._ids = {}  # listed url -> broker id
        self._zk = None  # ZkDiscovery

    @property
    def security(self):
        if self._security is None:
            self._security = client_security.resolve(self.opts.security)
        return self._security

    def call(self, url, request):
        """``request``'s reply from the broker at ``url`` (its connection kept); a failed connection is dropped."""
        conn = self._conns.get(url)
        if conn is None or conn.closed:
            conn = self._conns[url] = BrokerConnection(url, connect_timeout=self.opts.timeout,
                                                       request_timeout=self.opts.timeout, heartbeat_interval=0,
                                                       security=self.security)
        try:
            return conn.call(request, timeout=self.opts.timeout)
        except BaseException:
            self._conns.pop(url, None)
            conn.close()
            raise

    def masters(self):
        """``({broker_id: url}, [(url, error)])``: the registered masters (``zk``) and the listed brokers that
        told their id; the listed ones that could not be reached, with why. ZooKeeper that cannot be reached,
        refused credentials and TLS failures raise."""
        urls, failed = {}, []
        if self.opts.zk:
            urls.update(self.zk_discovery().broker_urls())
        for url in self.opts.brokers:
            if url not in self._ids:
                try:
                    self._ids[url] = broker_id_from_stats(self.call(url, ev.Stats(None, 0)))
                except Exception as exc:
                    if not is_unreachable(exc):
                        raise
                    failed.append((url, exc))
                    continue
            urls[self._ids[url]] = url
        return urls, failed

    def zk_discovery(self):
        """The reader's ZooKeeper discovery (one session, opened on first use)."""
        if self._zk is None:
            from metaq.client.discovery import ZkDiscovery

            self._zk = ZkDiscovery.connect(self.opts.zk, self.opts.zk_root, connect_timeout=self.opts.timeout)
        return self._zk

    def close(self):
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
        if self._zk is not None:
            self._zk.close()
            self._zk = None
