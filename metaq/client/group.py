"""Consumer-group membership and rebalance through ZooKeeper (reference §4, §5.3; DESIGN §8).

One :class:`GroupCoordinator` per consumer. It registers
``<root>/consumers/<group>/ids/<consumer_id>`` (ephemeral, data ``"t1,t2"``),
splits every subscribed topic's partitions among the group with MetaQ's range
strategy (:mod:`metaq.client.balance`) and owns its share through ephemeral
``owners/<topic>/<brokerId>-<p>`` nodes whose data is the consumer id, so Java
MetaQ consumers and tools see the same layout.

All ZooKeeper work and every callback into the consumer happen on one thread
per coordinator; kazoo watches and state listeners only set a flag and wake it,
so bursts of events collapse into one rebalance. Compared with MetaQ's client:

* a rebalance that changes nothing for this consumer touches nothing;
* only partitions that leave this consumer are revoked; the ones it keeps stay
  owned and keep being consumed;
* a claim blocked by an owner node that another consumer has not released yet
  does not drop what was already claimed: it watches that node, backs off
  (growing to ~2 s) and retries, forever, reporting through ``on_error`` after
  ``max_attempts`` consecutive failures;
* an owner node is ours only if it carries our id *and* our current session;
* when ZooKeeper is unreachable for a whole session timeout, consumption is
  paused (revoke) because another consumer may take the partitions over; when
  the session is found expired, everything is revoked, the id re-registered and
  the group rebalanced.
"""

import logging
import threading
import time

from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.protocol.states import KazooState

from metaq import errors, limits
from metaq.client import balance
from metaq.client.cluster import parse_broker_node, parse_num_parts

log = logging.getLogger(__name__)

MAX_BACKOFF_S = 2.0
OP_TIMEOUT_S = 10.0


class GroupCoordinator:
    """ZooKeeper group membership and partition rebalance for one consumer.

    ``zk`` is a started kazoo ``KazooClient``; ``root`` the MetaQ root (``"/meta"``);
    ``consumer_id`` the full id (``"<group>_<uuid>"``) written to ``ids/`` and to owner
    nodes. ``partitions_of(topic)`` returns the topic's ``"<brokerId>-<p>"`` strings
    (default: read ``brokers/topics-sub/<topic>`` directly, masters and slaves
    deduplicated, falling back to the legacy ``brokers/topics/<topic>``). The
    coordinator watches those nodes itself; if ``partitions_of`` answers from a cache
    it may lag, so an answer that disagrees with ZooKeeper is re-checked (see
    ``_read_partitions``). :meth:`request_rebalance` asks for a rebalance at any time.

    ``revoke(set_of_(topic, "b-p"))`` runs before the owner nodes of those partitions
    are deleted: the consumer stops their fetchers and commits their offsets before
    returning. ``assign(set_of_(topic, "b-p"))`` runs once their owner nodes are held
    by us: the consumer loads their offsets and starts fetching. Both are incremental
    (only partitions that change hands); when some new partitions are still held by
    a consumer that has not released them yet, the ones already claimed are assigned
    at once and the rest in a later attempt. Both run on the coordinator's thread
    (and on the caller's in :meth:`stop`), never concurrently.

    A failed attempt is retried after ``rebalance_backoff`` seconds, growing 1.5x per
    failure up to 2 s, without end; after ``max_attempts`` failures in a row
    ``on_error(errors.Unavailable)`` is called (and for any exception a callback
    raised). :meth:`start` gives up after ``start_timeout`` seconds. ``session_timeout``
    (default: the kazoo client's) is how long ZooKeeper may be unreachable before
    consumption is paused.
    """

    def __init__(self, zk, root, group, consumer_id, *, partitions_of=None, revoke, assign,
                 rebalance_backoff=0.3, max_attempts=10, on_error=None, start_timeout=30.0,
                 session_timeout=None):
        limits.validate_group(group)
        self.zk = zk
        self.group = group
        self.consumer_id = consumer_id
        self.root = "/" + root.strip("/") if root.strip("/") else ""
        self._group_path = "%s/consumers/%s" % (self.root, group)
        self._ids_path = self._group_path + "/ids"
        self._partitions_of = partitions_of
        self._revoke_cb, self._assign_cb, self._on_error = revoke, assign, on_error
        self._backoff, self._max_attempts = rebalance_backoff, max_attempts
        self._start_timeout = start_timeout
        self._session_timeout_s = session_timeout
        self.topics = ()
        self._cond = threading.Condition()
        self._thread = None
        # flags set by watches / listeners (under _cond)
        self._dirty = False
        self._lost = False
        self._suspended_at = None
        self._stopping = False
        # rebalance progress (under _cond)
        self._running = False
        self._retry_at = None
        self._waiting_connection = False
        self._failures = 0
        # ownership: only touched by the worker thread (or by stop() after joining it)
        self._owned = set()       # (topic, "b-p") whose owner node we hold
        self._owned_session = None
        self._active = set()      # (topic, "b-p") handed to assign() and not revoked since
        self._published = {}

    # ----------------------------------------------------------------- public API

    def start(self, topics):
        """Join the group for ``topics`` and perform the first rebalance before returning.

        Raises ``errors.Unavailable`` (after leaving the group again) when the
        rebalance cannot complete within ``start_timeout`` seconds.
        """
        if self._thread is not None:
            raise RuntimeError("GroupCoordinator.start() called twice")
        self.topics = tuple(dict.fromkeys(limits.validate_topic(t) for t in topics))
        if not self.topics:
            raise ValueError("subscribe to at least one topic")
        self.zk.add_listener(self._on_state)
        self._thread = threading.Thread(target=self._run, name="metaq-group-%s" % self.group, daemon=True)
        self._request()
        self._thread.start()
        if not self.wait_stable(self._start_timeout):
            self.stop()
            raise errors.Unavailable(
                "consumer %s could not join group %r for topics %s within %.0f s: ZooKeeper unreachable, or "
                "owner nodes held by other consumers were never released" %
                (self.consumer_id, self.group, ",".join(self.topics), self._start_timeout))

    def assignment(self):
        """``{topic: sorted ["b-p", ...]}`` of the partitions handed to ``assign`` and not revoked."""
        result = {t: [] for t in self.topics}
        for topic, part in list(self._published.items()):
            result[topic] = part
        return result

    def wait_stable(self, timeout):
        """Wait until no rebalance is pending or running; True if that happened within ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._is_stable():
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping:
                    return self._is_stable()
                self._cond.wait(min(left, 1.0))
            return True

    def stop(self, timeout=30.0):
        """Leave the group: revoke everything (callback), delete our owner nodes, then our id node."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self.zk.remove_listener(self._on_state)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("group %s: rebalance thread still busy after %.0f s; leaving anyway", self.group, timeout)
        self._revoke(set(self._active))
        for key in sorted(self._owned):
            self._release_node(key)
        self._owned.clear()
        self._delete_node(self._ids_path + "/" + self.consumer_id, owned_by_data=False)

    def request_rebalance(self):
        """Ask for a rebalance soon (never blocks): e.g. when the source of ``partitions_of`` changed."""
        self._request()

    # ------------------------------------------------------------ event plumbing

    def _request(self, *_event):
        """Watch callback: ask the worker for a rebalance (never blocks)."""
        with self._cond:
            self._dirty = True
            self._cond.notify_all()

    def _on_state(self, state):
        """kazoo state listener: record the transition and wake the worker (never blocks)."""
        with self._cond:
            if state == KazooState.LOST:
                self._lost = True
                self._suspended_at = None
            elif state == KazooState.SUSPENDED:
                if self._suspended_at is None:
                    self._suspended_at = time.monotonic()
            else:
                self._suspended_at = None
                self._dirty = True
            self._cond.notify_all()

    def _is_stable(self):
        return not (self._dirty or self._running or self._lost or self._retry_at is not None
                    or self._waiting_connection)

    def _session_timeout(self):
        if self._session_timeout_s is not None:
            return self._session_timeout_s
        return getattr(self.zk, "_session_timeout", 10000) / 1000.0

    def _pause_due(self, now):
        return (self._suspended_at is not None and bool(self._active)
                and now - self._suspended_at >= self._session_timeout())

    def _next_wake(self, now):
        waits = [1.0]
        if self._retry_at is not None:
            waits.append(self._retry_at - now)
        if self._suspended_at is not None and self._active:
            waits.append(self._suspended_at + self._session_timeout() - now)
        return max(0.01, min(waits))

    def _wait_for_work(self):
        """Block until there is something to do; returns (lost, pause) or None when stopping."""
        with self._cond:
            while True:
                if self._stopping:
                    return None
                now = time.monotonic()
                retry_due = self._retry_at is not None and now >= self._retry_at
                if self._lost or self._dirty or retry_due or self._pause_due(now):
                    break
                self._cond.wait(self._next_wake(now))
            lost, pause = self._lost, self._pause_due(now)
            self._lost = self._dirty = False
            self._running = True
            return lost, pause

    def _run(self):
        while True:
            work = self._wait_for_work()
            if work is None:
                return
            lost, pause = work
            outcome = "failed"
            try:
                if lost:
                    self._forget_session("ZooKeeper session expired")
                if pause:
                    log.warning("group %s: ZooKeeper unreachable for a whole session timeout; pausing %d "
                                "partitions", self.group, len(self._active))
                    self._revoke(set(self._active))
                outcome = self._attempt()
            except (KazooException, errors.MetaqError) as exc:
                log.info("group %s: rebalance attempt failed: %r", self.group, exc)
            except Exception:
                log.exception("group %s: rebalance attempt failed", self.group)
            self._finish_attempt(outcome)

    def _finish_attempt(self, outcome):
        report = None
        with self._cond:
            self._running = False
            self._waiting_connection = outcome == "disconnected"
            if outcome in ("done", "disconnected") or self._stopping:
                self._failures, self._retry_at = 0, None
            else:
                self._failures += 1
                delay = min(self._backoff * (1.5 ** (self._failures - 1)), MAX_BACKOFF_S)
                self._retry_at = time.monotonic() + delay
                if self._failures == self._max_attempts:
                    report = errors.Unavailable(
                        "consumer %s: %d rebalance attempts in a row failed for group %r; still retrying" %
                        (self.consumer_id, self._failures, self.group))
            self._cond.notify_all()
        if report is not None:
            log.warning("%s", report)
            self._report(report)

    def _report(self, exc):
        if self._on_error is not None:
            try:
                self._on_error(exc)
            except Exception:
                log.exception("group %s: on_error callback raised", self.group)

    # ------------------------------------------------------------- one attempt

    def _attempt(self):
        """One rebalance; returns "done", "failed" (retry with backoff) or "disconnected"."""
        session = self.zk.client_id
        if session is None:
            return "disconnected"
        if self._owned_session is not None and session[0] != self._owned_session:
            self._forget_session("new ZooKeeper session")
        self._owned_session = session[0]
        if not self._register(session[0]):
            return "failed"
        consumers = self._read_consumers()
        target, settled = set(), True
        for topic in self.topics:
            parts, agreed = self._read_partitions(topic)
            settled = settled and agreed
            target.update((topic, p) for p in balance.range_assign(consumers.get(topic, ()), parts,
                                                                     self.consumer_id))
        leaving = self._owned - target
        self._revoke(leaving & self._active)
        released = {key for key in sorted(leaving) if self._release_node(key)}
        self._owned -= released
        complete = released == leaving  # a node we could not delete is retried
        for key in sorted(target - self._owned):
            if self._claim(key, session[0]):
                self._owned.add(key)
            else:
                complete = False
        self._assign(self._owned - self._active)
        return "done" if complete and settled else "failed"

    def _forget_session(self, why):
        """Our ephemeral nodes died with the old session: revoke everything we had."""
        if self._owned or self._active:
            log.warning("group %s: %s; revoking %d partitions", self.group, why, len(self._active))
        self._revoke(set(self._active))
        self._owned.clear()
        self._owned_session = None

    def _register(self, session_id):
        """Ensure ``ids/<consumer_id>`` exists in this session; False if a stale one still blocks it."""
        path = self._ids_path + "/" + self.consumer_id
        data = ",".join(self.topics).encode("utf-8")
        try:
            self._op(self.zk.create_async(path, data, ephemeral=True, makepath=True))
            return True
        except NodeExistsError:
            pass
        try:
            _, stat = self._op(self.zk.get_async(path))
        except NoNodeError:
            return False
        if stat.ephemeralOwner == session_id:
            return True
        log.info("group %s: id node %s belongs to an older session; waiting for it to expire", self.group, path)
        self._op(self.zk.exists_async(path, watch=self._request))
        return False

    def _read_consumers(self):
        """``{topic: [consumer ids subscribed to it]}`` from the ids children (watched)."""
        try:
            children = self._op(self.zk.get_children_async(self._ids_path, watch=self._request))
        except NoNodeError:
            return {}
        per_topic = {}
        for child in children:
            try:
                data, _ = self._op(self.zk.get_async(self._ids_path + "/" + child))
            except NoNodeError:
                continue
            for topic in (data or b"").decode("utf-8", "replace").split(","):
                if topic.strip():
                    per_topic.setdefault(topic.strip(), []).append(child)
        return per_topic

    def _read_partitions(self, topic):
        """``(parts, settled)``: the topic's ``"b-p"`` strings and whether ``partitions_of`` agrees with ZooKeeper.

        Reads ``topics-sub/<topic>`` (masters and slaves, deduplicated; the legacy
        ``topics/<topic>`` when it lists nothing) with watches on the children and
        on each child's data. A ``partitions_of`` backed by a cache may lag behind
        the watch that woke us: while it disagrees, the attempt is retried (up to
        ``max_attempts`` times, then its answer is taken).
        """
        parts = []
        for folder in ("topics-sub", "topics"):
            parts = self._read_topic_nodes("%s/brokers/%s/%s" % (self.root, folder, topic))
            if parts:
                break
        if self._partitions_of is None:
            return parts, True
        given = balance.java_sorted(str(p) for p in self._partitions_of(topic))
        if given == balance.java_sorted(parts):
            return given, True
        log.info("group %s: partitions_of(%s) disagrees with ZooKeeper (%d vs %d partitions)", self.group, topic,
                 len(given), len(parts))
        return given, self._failures + 1 >= self._max_attempts

    def _read_topic_nodes(self, path):
        try:
            children = self._op(self.zk.get_children_async(path, watch=self._request))
        except NoNodeError:
            self._op(self.zk.exists_async(path, watch=self._request))
            children = []
        counts = {}
        for child in children:
            try:
                data, _ = self._op(self.zk.get_async(path + "/" + child, watch=self._request))
            except NoNodeError:
                continue
            broker, count = parse_broker_node(child), parse_num_parts(data)
            if broker is None or count is None:
                log.warning("group %s: ignoring unreadable node %s/%s = %r", self.group, path, child, data)
                continue
            counts[broker[0]] = max(count, counts.get(broker[0], 0))
        return ["%d-%d" % (b, p) for b, n in counts.items() for p in range(n)]

    def _claim(self, key, session_id):
        """Create our owner node for ``key``; True if we hold it (now or already, in this session)."""
        path = self._owner_path(key)
        try:
            self._op(self.zk.create_async(path, self.consumer_id.encode("utf-8"), ephemeral=True, makepath=True))
            return True
        except NodeExistsError:
            pass
        try:
            data, stat = self._op(self.zk.get_async(path, watch=self._request))
        except NoNodeError:
            return False  # released meanwhile: the next attempt comes at once (the watch fired)
        if data.decode("utf-8", "replace") == self.consumer_id and stat.ephemeralOwner == session_id:
            return True
        log.info("group %s: %s/%s still owned by %s; waiting for its release", self.group, key[0], key[1],
                 data.decode("utf-8", "replace"))
        return False

    def _release_node(self, key):
        return self._delete_node(self._owner_path(key), owned_by_data=True)

    def _delete_node(self, path, owned_by_data):
        """Delete ``path`` if it is ours: data = our id (owner nodes), or created by our session (id node).

        A node a successor already re-created is left alone. True once the node is
        not ours any more; False when ZooKeeper could not be asked.
        """
        try:
            data, stat = self._op(self.zk.get_async(path))
            session = self.zk.client_id
            if owned_by_data:
                ours = data.decode("utf-8", "replace") == self.consumer_id
            else:
                ours = session is not None and stat.ephemeralOwner == session[0]
            if ours:
                self._op(self.zk.delete_async(path, version=stat.version))
            return True
        except NoNodeError:
            return True
        except (KazooException, errors.MetaqError) as exc:
            # cannot reach ZooKeeper: the node is ephemeral and at worst goes with our session
            log.info("group %s: could not delete %s: %r", self.group, path, exc)
            return False

    def _owner_path(self, key):
        return "%s/owners/%s/%s" % (self._group_path, key[0], key[1])

    def _op(self, async_result):
        """Wait for a kazoo async call, at most OP_TIMEOUT_S (then ``errors.Unavailable``)."""
        try:
            return async_result.get(timeout=OP_TIMEOUT_S)
        except self.zk.handler.timeout_exception:
            raise errors.Unavailable("ZooKeeper did not answer within %.0f s" % OP_TIMEOUT_S) from None

    # ---------------------------------------------------------------- callbacks

    def _revoke(self, keys):
        if not keys:
            return
        self._active -= keys
        self._publish()
        try:
            self._revoke_cb(set(keys))
        except Exception as exc:
            log.exception("group %s: revoke callback raised", self.group)
            self._report(exc)

    def _assign(self, keys):
        if not keys:
            return
        self._active |= keys
        self._publish()
        try:
            self._assign_cb(set(keys))
        except Exception as exc:
            log.exception("group %s: assign callback raised", self.group)
            self._report(exc)

    def _publish(self):
        shares = {}
        for topic, part in self._active:
            shares.setdefault(topic, []).append(part)
        self._published = {t: balance.java_sorted(p) for t, p in shares.items()}
