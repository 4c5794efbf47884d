"""The topic table's service: create, alter, delete and list topics (protocol-neutral; docs/concepts.md "Topics: the
table, create, alter, delete").

Front-ends call ``TopicAdmin.create(name, settings)``, ``alter(name, settings)``, ``delete(name)``, ``list()``
(or ``handle(action, name, settings)``) after checking admin permission; each returns JSON-able data and raises
the store's errors (ClientError 400, UnknownTopic, TopicLimit, Forbidden). One change at a time; the table's
fsync and a deleted topic's file removal run in gevent's thread pool (the event loop goes on), under the store
lock so no checkpoint or work ahead meets a partition being removed. After a change the registry is told (a
topic's ZooKeeper nodes carry its partition count) and ``on_change`` callbacks run (the replication master sends
the table to its slaves).
"""

import logging

import gevent
from gevent.lock import Semaphore

from metaq.errors import ClientError, Unavailable

log = logging.getLogger(__name__)


class TopicAdmin:
    def __init__(self, store, store_lock, registry=None, refusal=lambda: None):
        """``store``: the MessageStore (its ``topics``: topics/state.py); ``registry``: the ZkRegistry or None;
        ``refusal()``: why this broker takes no change now (a slave: its table is its master's), or None."""
        self.refusal = refusal
        self.store = store
        self.ops = store.topics
        self.ops.run_blocking = _in_thread
        self.store_lock = store_lock
        self.registry = registry
        self.on_change = []  # callables, run after each change
        self._one = Semaphore()

    def handle(self, action, name, settings, known=None):
        """``action`` one of create/alter/delete/list (topics/wire.py); ``settings``: ``{key: text}``;
        ``known``: ``list``'s filter."""
        if action == "list":
            return self.list(known)
        if action == "create":
            return self.create(name, settings)
        if action == "alter":
            return self.alter(name, settings)
        if action == "delete":
            return self.delete(name)
        raise ClientError("unknown topic action %r" % (action,))

    def list(self, known=None):
        """Every topic's settings; ``known(name)``: only those (``Guard.known_to``: a user sees the topics it may
        publish to or read, not every name on the broker)."""
        topics = self.ops.describe()
        return topics if known is None else [t for t in topics if known(t["name"])]

    def create(self, name, settings):
        return self._change(name, lambda: self.ops.create(name, dict(settings)).describe())

    def alter(self, name, settings):
        if not settings:
            raise ClientError("topics alter %s: give at least one setting to change" % name)
        return self._change(name, lambda: self.ops.alter(name, dict(settings)).describe())

    def delete(self, name):
        def run():
            offsets = self.ops.delete(name)
            return {"name": name, "deleted": True, "next_offsets": {str(k): v for k, v in sorted(offsets.items())}}
        return self._change(name, run)

    def _change(self, name, fn):
        why = self.refusal()
        if why is not None:
            raise Unavailable("topics are changed on the master: %s" % why)
        with self._one, self.store_lock:
            result = fn()
        if self.registry is not None:
            self.registry.topic_changed(name)
        for callback in self.on_change:
            callback()
        return result


def _in_thread(fn):
    return gevent.get_hub().threadpool.apply(fn)
