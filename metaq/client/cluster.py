"""The broker cluster as MetaQ's ZooKeeper layout describes it (reference §4), cached and kept current by watches.

    /meta/brokers/ids/<id>/master             "meta://host:port"            (ephemeral)
    /meta/brokers/ids/<id>/slave<N>           "meta://host:port"            (ephemeral)
    /meta/brokers/topics-pub/<topic>/<id>-m   '{"numParts":N,"broker":"<id>-m"}' (-s<N> for slaves)
    /meta/brokers/topics-sub/<topic>/<id>-m   the same JSON
    /meta/brokers/topics/<topic>/<id>-m       "N"  (legacy, before MetaQ 1.4.3)

Every read is cached. ZooKeeper watches (one-shot, re-armed by each read)
only put a key on a queue; a refresher thread of ours re-reads that part of
the tree, updates the cache and calls the ``watch_topic`` callbacks. So kazoo's
own threads never block on us, and our callbacks never block kazoo.
"""

import json
import logging
import queue
import re
import threading
import time

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NoNodeError

from metaq.errors import ConnectionLost
from metaq.client.message import Partition

__all__ = ["ZkCluster", "parse_num_parts", "parse_broker_node"]

log = logging.getLogger(__name__)

_BROKER_NODE = re.compile(r"(\d+)-(m|s(\d+))")
_SLAVE_NODE = re.compile(r"slave(\d+)")
_RETRY_S = 1.0


def parse_broker_node(name):
    """``"7-m"`` -> ``(7, None)``, ``"7-s2"`` -> ``(7, 2)`` (slave 2); None for any other name."""
    m = _BROKER_NODE.fullmatch(name)
    if m is None:
        return None
    return int(m.group(1)), (None if m.group(2) == "m" else int(m.group(3)))


def parse_num_parts(data):
    """Partition count from a topics node: JSON ``{"numParts": N, ...}`` (any field order) or legacy ``"N"``.

    Returns None when the data holds neither.
    """
    text = data.decode("utf-8", "replace").strip() if isinstance(data, bytes) else str(data or "").strip()
    if text.isdigit():
        return int(text)
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if isinstance(value, dict):
        parts = value.get("numParts")
        if isinstance(parts, int) and not isinstance(parts, bool) and parts >= 0:
            return parts
        if isinstance(parts, str) and parts.isdigit():
            return int(parts)
    return None


class ZkCluster:
    """Brokers and topic partitions read from ZooKeeper under ``root`` and kept current by watches.

    ``zk`` is the started ``KazooClient`` (default threading handler); consumers
    use it for their own nodes. Raises ``ConnectionLost`` when ZooKeeper cannot
    be reached within ``connect_timeout`` seconds.
    """

    def __init__(self, zk_connect, root="/meta", session_timeout=10.0, *, connect_timeout=15.0):
        self.root = "/" + root.strip("/") if root.strip("/") else ""
        self._brokers_path = self.root + "/brokers"
        self.zk = KazooClient(hosts=zk_connect, timeout=session_timeout)
        try:
            self.zk.start(timeout=connect_timeout)
        except Exception as exc:  # kazoo raises its own timeout class
            self.zk.close()
            raise ConnectionLost("cannot connect to ZooKeeper %s: %s" % (zk_connect, exc)) from exc
        self._lock = threading.RLock()  # cache and callbacks
        self._refresh_lock = threading.Lock()  # one refresh at a time
        self._brokers = {}  # id -> {"master": url|None, "slaves": {n: url}}
        self._topics = {}  # topic -> {"pub": {node: n}, "sub": {node: n}, "legacy": {node: n}}
        self._callbacks = {}  # topic -> [callback]
        self._watchers = {}  # key -> the watch function registered for it (one per key)
        self._queue = queue.Queue()
        self._closed = False
        self._expired = False
        self.zk.add_listener(self._on_state)
        try:
            with self._refresh_lock:
                self._refresh(("ids",))
        except KazooException as exc:
            self.zk.stop()
            self.zk.close()
            raise ConnectionLost("cannot read brokers from ZooKeeper %s: %s" % (zk_connect, exc)) from exc
        self._thread = threading.Thread(target=self._run, name="metaq-zk-refresh", daemon=True)
        self._thread.start()

    # -- public API -----------------------------------------------------------------------

    def broker_urls(self):
        """``{broker_id: master url}`` of every broker with a registered master."""
        with self._lock:
            return {bid: b["master"] for bid, b in self._brokers.items() if b["master"]}

    def broker_url(self, broker_id):
        """The master's url of ``broker_id``, or the lowest-numbered slave's when no master is registered, or None."""
        with self._lock:
            b = self._brokers.get(broker_id)
            if b is None:
                return None
            if b["master"]:
                return b["master"]
            slaves = sorted((n, url) for n, url in b["slaves"].items() if url)
            return slaves[0][1] if slaves else None

    def master_url(self, broker_id):
        """The registered master's url of ``broker_id``, or None."""
        with self._lock:
            b = self._brokers.get(broker_id)
            return b["master"] if b is not None else None

    def slave_urls(self, broker_id):
        """The registered slaves' urls of ``broker_id``, lowest slave number first."""
        with self._lock:
            b = self._brokers.get(broker_id)
            return [url for _n, url in sorted(b["slaves"].items()) if url] if b is not None else []

    def publish_partitions(self, topic):
        """Partitions to send ``topic`` to, sorted by (broker_id, partition).

        From ``topics-pub/<topic>`` (masters only, and only brokers whose master
        is registered); when that holds no master, from the legacy
        ``topics/<topic>``.
        """
        nodes = self._topic(topic)
        with self._lock:
            masters = self.broker_urls()
            for kind in ("pub", "legacy"):
                out = []
                for name, count in nodes[kind].items():
                    parsed = parse_broker_node(name)
                    if parsed and parsed[1] is None and parsed[0] in masters:
                        out.extend(Partition(parsed[0], p) for p in range(count))
                if out:
                    return sorted(out)
            return []

    def subscribe_partitions(self, topic):
        """Partitions to consume ``topic`` from, sorted: ``topics-sub/<topic>`` from masters and slaves, deduplicated.

        Falls back to the legacy ``topics/<topic>`` when ``topics-sub`` lists nothing.
        """
        nodes = self._topic(topic)
        with self._lock:
            for kind in ("sub", "legacy"):
                out = set()
                for name, count in nodes[kind].items():
                    parsed = parse_broker_node(name)
                    if parsed:
                        out.update(Partition(parsed[0], p) for p in range(count))
                if out:
                    return sorted(out)
            return []

    def watch_topic(self, topic, callback):
        """Call ``callback()`` whenever ``topic``'s partitions or the set of brokers change.

        It runs on the cluster's refresher thread and must return quickly.
        Returns a function that removes the callback.
        """
        with self._lock:
            self._callbacks.setdefault(topic, []).append(callback)
        self._topic(topic)

        def unwatch():
            with self._lock:
                callbacks = self._callbacks.get(topic, [])
                if callback in callbacks:
                    callbacks.remove(callback)

        return unwatch

    def add_session_listener(self, callback):
        """Call ``callback(state)`` on every ZooKeeper session state change (``KazooState.CONNECTED`` /
        ``SUSPENDED`` / ``LOST``); it runs on kazoo's thread and must not block."""
        self.zk.add_listener(callback)

    def refresh(self):
        """Re-read everything now (normally the watches make this unnecessary)."""
        with self._refresh_lock:
            changed = self._refresh_all()
        self._notify(changed)

    def close(self):
        """Stop the refresher and the ZooKeeper session (its ephemeral nodes go away)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(5)
        try:
            self.zk.stop()
        finally:
            self.zk.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- cache ----------------------------------------------------------------------------

    def _topic(self, topic):
        """The cached nodes of ``topic``; the first call reads them and arms the watches."""
        with self._lock:
            nodes = self._topics.get(topic)
        if nodes is None:
            with self._refresh_lock:
                with self._lock:
                    nodes = self._topics.get(topic)
                if nodes is None:
                    try:
                        self._refresh(("topic", topic))
                    except KazooException as exc:  # ZooKeeper unreachable: nothing known yet, the refresher retries
                        log.info("cannot read topic %s from ZooKeeper yet: %s", topic, exc)
                        self._queue.put(("topic", topic))
                        return {"pub": {}, "sub": {}, "legacy": {}}
                    with self._lock:
                        nodes = self._topics.setdefault(topic, {"pub": {}, "sub": {}, "legacy": {}})
        return nodes

    def _watcher(self, key):
        """The one watch function for ``key`` (kazoo keeps a set, so re-arming does not pile up)."""
        fn = self._watchers.get(key)
        if fn is None:
            def fn(_event, key=key):
                self._queue.put(key)
            self._watchers[key] = fn
        return fn

    # -- refresher ------------------------------------------------------------------------

    def _on_state(self, state):
        """kazoo's thread: only queue work. Back from a disconnection (after a session loss the watches
        are gone), re-read everything."""
        if state in (KazooState.LOST, KazooState.SUSPENDED):
            self._expired = True
        elif state == KazooState.CONNECTED and self._expired:
            self._expired = False
            self._queue.put(("all",))

    def _run(self):
        retry = {}
        while not self._closed:
            timeout = max(0.05, min(retry.values()) - time.monotonic()) if retry else 1.0
            keys = set()
            try:
                keys.add(self._queue.get(timeout=timeout))
                while True:
                    keys.add(self._queue.get_nowait())
            except queue.Empty:
                pass
            if None in keys or self._closed:
                return
            now = time.monotonic()
            keys.update(k for k, at in retry.items() if at <= now)
            for key in keys:
                retry.pop(key, None)
            for key in sorted(keys, key=lambda k: k != ("ids",)):  # brokers first
                try:
                    with self._refresh_lock:
                        changed = self._refresh(key)
                    self._notify(changed)
                except KazooException as exc:
                    log.info("ZooKeeper refresh of %s failed (%s); retrying", key, exc)
                    retry[key] = time.monotonic() + _RETRY_S
                except Exception:
                    log.exception("ZooKeeper refresh of %s failed", key)
                    retry[key] = time.monotonic() + _RETRY_S

    def _refresh(self, key):
        """Re-read what ``key`` names; return the set of changed topics (None in it: the brokers changed)."""
        kind = key[0]
        if kind == "all":
            return self._refresh_all()
        if kind == "ids":
            return {None} if self._refresh_ids() else set()
        if kind == "broker":
            return {None} if self._refresh_broker(key[1]) else set()
        if kind == "topic":
            return {key[1]} if self._refresh_topic(key[1]) else set()
        return set()

    def _refresh_all(self):
        changed = {None} if self._refresh_ids() else set()
        with self._lock:
            brokers, topics = list(self._brokers), list(self._topics)
        for bid in brokers:
            if self._refresh_broker(bid):
                changed.add(None)
        for topic in topics:
            if self._refresh_topic(topic):
                changed.add(topic)
        return changed

    def _children(self, path, key):
        """Children of ``path`` with a watch for ``key``; [] (watching for its creation) when it does not exist."""
        watch = self._watcher(key)
        try:
            return self.zk.get_children(path, watch=watch)
        except NoNodeError:
            if self.zk.exists(path, watch=watch) is None:
                return []
            return self.zk.get_children(path, watch=watch)

    def _data(self, path, key):
        """Data of ``path`` as text with a watch for ``key``; None when it does not exist."""
        try:
            data, _stat = self.zk.get(path, watch=self._watcher(key))
        except NoNodeError:
            return None
        return data.decode("utf-8", "replace").strip()

    def _refresh_ids(self):
        """Re-read ``brokers/ids``; read brokers that appeared, forget those that left. True when something changed."""
        ids = set()
        for name in self._children(self._brokers_path + "/ids", ("ids",)):
            if name.isdigit():
                ids.add(int(name))
        with self._lock:
            gone = [bid for bid in self._brokers if bid not in ids]
            for bid in gone:
                del self._brokers[bid]
            new = [bid for bid in ids if bid not in self._brokers]
        changed = bool(gone)
        for bid in new:
            changed = self._refresh_broker(bid) or changed
        return changed

    def _refresh_broker(self, bid):
        key = ("broker", bid)
        path = "%s/ids/%d" % (self._brokers_path, bid)
        entry = {"master": None, "slaves": {}}
        for name in self._children(path, key):
            m = _SLAVE_NODE.fullmatch(name)
            if name == "master":
                entry["master"] = self._data(path + "/master", key) or None
            elif m:
                url = self._data("%s/%s" % (path, name), key)
                if url:
                    entry["slaves"][int(m.group(1))] = url
        with self._lock:
            if entry == self._brokers.get(bid):
                return False
            self._brokers[bid] = entry
        log.info("broker %d: master %s, slaves %s", bid, entry["master"], entry["slaves"] or "none")
        return True

    def _refresh_topic(self, topic):
        key = ("topic", topic)
        nodes = {}
        for kind, folder in (("pub", "topics-pub"), ("sub", "topics-sub"), ("legacy", "topics")):
            path = "%s/%s/%s" % (self._brokers_path, folder, topic)
            found = {}
            for name in self._children(path, key):
                if parse_broker_node(name) is None:
                    continue
                count = parse_num_parts(self._data("%s/%s" % (path, name), key))
                if count is not None:
                    found[name] = count
            nodes[kind] = found
        with self._lock:
            if nodes == self._topics.get(topic):
                return False
            self._topics[topic] = nodes
        log.info("topic %s: publish %s, subscribe %s", topic, nodes["pub"] or nodes["legacy"], nodes["sub"])
        return True

    def _notify(self, changed):
        """Call the callbacks of the changed topics (of every topic when None, i.e. the brokers, changed).

        Called without the refresh lock held, so a callback may read the cluster.
        """
        if not changed:
            return
        with self._lock:
            if None in changed:
                callbacks = [cb for cbs in self._callbacks.values() for cb in cbs]
            else:
                callbacks = [cb for topic in changed for cb in self._callbacks.get(topic, ())]
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("topic watch callback %r failed", callback)


def zk_children(zk, path):
    """Children of ``path`` (a started KazooClient), or [] when the node does not exist."""
    try:
        return zk.get_children(path)
    except NoNodeError:
        return []


def zk_data(zk, path, with_stat=False):
    """The UTF-8 text of ``path`` (and its ZnodeStat when ``with_stat``), or None when it does not exist."""
    try:
        data, stat = zk.get(path)
    except NoNodeError:
        return None
    text = data.decode("utf-8", "replace")
    return (text, stat) if with_stat else text
