"""The HTTP port's JSON API (what ``metaq-admin`` shows), its HTTP put and get, and the health checks.

Routes (docs/operating.md "JSON API and HTTP put/get"):

==========================================================  =====================================================
``GET /healthz``                                            200 while the process serves (open)
``GET /readyz``                                             200 ready, else 503 with the reason (open)
``GET /api/broker``                                         the ``stats`` summary as an object
``GET /api/topics``                                         topics: partitions, messages, bytes, puts, gets
``GET /api/topics/{topic}``                                 one topic, with each partition's min/max offset
``GET /api/groups``                                         broker-kept group offsets, their lag
``GET /api/replication``                                    role, epoch, link or slaves
``POST /api/topics/{topic}/messages``                       put: the body is the payload (``partition``,
                                                            ``key``, ``attribute`` in the query)
``GET /api/topics/{topic}/partitions/{p}/messages``         get from ``offset`` (``max_bytes``, ``max_count``;
                                                            ``format=raw``: the first message's payload alone)
==========================================================  =====================================================

A put goes through the same ``PutPath`` as the text port and is answered once durable per the broker's
flush and replication modes (``PutPath.durable``: the connection's greenlet waits for the group commit; the
loop goes on). A get reads through the store's checked read (``MessageStore.read_records``): a corrupt record
is answered ``512``, never served.
"""

import base64
import zlib

from metaq import errors, limits
from metaq.server.http import limits as http_limits
from metaq.auth.acl import SUB
from metaq.timers.levels import SCHEDULE_TOPIC
from metaq.protocol.message import decode_payload, encode_payload
from metaq.clock import now_ms
from metaq.protocol.httpreply import OPEN, READ, Response, error_response, json_response
from metaq.server.stats import group_rows, public_topics
from metaq.store.results import PRESSURE_FULL


def _plain(value):
    return value if isinstance(value, (int, float, str, bool)) or value is None else str(value)


def readiness(stopping, replication, write_refusal, read_refusal, disk_full=None):
    """``None`` when ready, else why not (``/readyz``). ``replication``: the ``stats`` replication pairs as a dict;
    ``write_refusal``: the WriteGate's refusal (a full disk, a failed flush), the master's lease refusal or its
    isolation refusal (``replication.max_isolation_ms``); ``disk_full``: why writes or a slave's copy are refused
    for lack of disk (``Broker.disk_pressure`` ``full``), or None. Disk pressure short of that (``warn``: retention
    deleting young segments) leaves a broker ready."""
    if stopping:
        return "the broker is shutting down"
    if read_refusal:
        return "reads are refused: %s" % read_refusal
    if replication.get("replication_role") == "slave":
        master = replication.get("replication_master")
        if master in (None, "none"):
            return "role not known: replication.ha auto has elected no master to follow yet"
        if disk_full:  # its link drops at each refused copy: the disk is the reason, not the link
            return "slave cannot store what it replicates: %s" % disk_full
        if replication.get("replication_link") != "connected":
            return "slave of %s: not handshaken with its master yet (link down)" % master
        if not replication.get("replication_caught_up"):
            return "slave of %s: not in sync yet (%s messages behind)" % (master,
                                                                          replication.get("replication_lag_messages"))
        if write_refusal:
            return "slave cannot store what it replicates: %s" % write_refusal
        return None
    if write_refusal:
        return "writes are refused: %s" % write_refusal
    return None


class BrokerViews:
    """What the API reads and does, given at assembly (never the Broker): the store, the stats counters, the
    put path, the guard, the roles (replication pairs, read refusal), the stats summary, and ``stopping``.
    ``broker_id`` goes into every answer about topics and messages: in a cluster each broker's port answers for
    its own partitions, and the answer says which broker that is."""

    def __init__(self, store, counters, put_path, guard, roles, summary, stopping, max_body_bytes,
                 disk_pressure=None, broker_id=None):
        self.broker_id = broker_id
        self.store = store
        self.counters = counters
        self.put_path = put_path
        self.guard = guard
        self.roles = roles
        self.summary = summary  # () -> the stats summary's (key, value) pairs
        self.stopping = stopping  # () -> bool
        self.max_body_bytes = max_body_bytes
        self.disk_pressure = disk_pressure  # () -> (state, why): Broker.disk_pressure

    # -- health ----------------------------------------------------------------

    def not_ready(self):
        path = self.put_path
        refusal = path.gate.refusal
        if self.roles.role != "slave" and path.slave_refusal:  # ha: auto, a master whose lease ran out
            refusal = refusal or path.slave_refusal
        refusal = refusal or path.isolation_refusal()  # an async master cut off from its slaves and ZooKeeper
        disk = self.disk_pressure() if self.disk_pressure is not None else (None, "")
        return readiness(self.stopping(), dict(self.roles.stats_values()), refusal, self.roles.read_refusal,
                         disk[1] if disk[0] == PRESSURE_FULL else None)

    def healthz(self, request):
        return Response(200, "ok\n", "text/plain; charset=utf-8")

    def readyz(self, request):
        why = self.not_ready()
        if why is None:
            return Response(200, "ready\n", "text/plain; charset=utf-8")
        return Response(503, "not ready: %s\n" % why, "text/plain; charset=utf-8")

    # -- read views ------------------------------------------------------------

    def _may_see(self, request):
        return self.guard.visible_to(request.session)

    def topic_list(self, may_see=None):
        store, totals = self.store, self.counters.topic_totals
        with_data = {}
        for topic, partition in store.partition_keys():
            with_data.setdefault(topic, []).append(partition)
        out = []
        for topic in sorted(public_topics(store)):
            if may_see is not None and not may_see("topic", topic):
                continue
            parts = with_data.get(topic, [])
            count = sum(store.max_offset(topic, p) - store.min_offset(topic, p) for p in parts)
            t = totals.get(topic, (0, 0, 0))
            out.append({"topic": topic, "broker_id": self.broker_id, "partitions": store.partitions_of(topic),
                        "messages": count,
                        "bytes": store.topic_bytes(topic) if parts else 0, "puts_total": t[0],
                        "put_bytes_total": t[1], "gets_total": t[2]})
        return out

    def group_list(self, may_see=None):
        out = []
        for r in group_rows(self.store, (), may_see, most=None, most_bytes=None)[0]:
            out.append({"group": r.group, "topic": r.topic, "partition": r.partition, "offset": r.offset,
                        "max_offset": r.max_offset, "lag": r.lag, "commit_ms": r.committed_ms})
        return out

    def broker(self, request):
        doc = {k: _plain(v) for k, v in self.summary()}
        ready = self.not_ready()
        doc["ready"] = ready is None
        doc["not_ready_reason"] = ready
        return json_response(doc)

    def topics(self, request):
        return json_response({"topics": self.topic_list(self._may_see(request))})

    def topic(self, request):
        topic = request.params["topic"]
        store = self.store
        if topic == SCHEDULE_TOPIC or topic not in store.known_topics():
            return error_response(404, "no such topic: %s" % topic)
        parts = []
        for p in range(store.partitions_of(topic)):
            lo, hi = store.min_offset(topic, p), store.max_offset(topic, p)
            parts.append({"partition": p, "min_offset": lo, "max_offset": hi, "messages": hi - lo})
        t = self.counters.topic_totals.get(topic, (0, 0, 0))
        return json_response({"topic": topic, "broker_id": self.broker_id, "partitions": parts, "puts_total": t[0],
                              "put_bytes_total": t[1], "gets_total": t[2]})

    def groups(self, request):
        return json_response({"groups": self.group_list(self._may_see(request))})

    def replication(self, request):
        return json_response({k: _plain(v) for k, v in self.roles.stats_values()})

    # -- put and get -------------------------------------------------------------

    def put(self, request):
        topic = request.params["topic"]
        path = self.put_path
        key = request.arg("key")
        attribute = request.arg("attribute")
        try:
            path.check_write(topic, request.session)
            partition = request.arg("partition", kind=int)
            if partition is None:
                count = self.store.partitions_of(topic)
                partition = zlib.crc32(key.encode("utf-8")) % count if key is not None else 0
            payload = request.body()
            flag, data = encode_payload(payload, attribute)
            if len(data) > self.max_body_bytes:
                raise errors.ClientError("the message is %d bytes: the limit is %d (limits.max_body_bytes)"
                                         % (len(data), self.max_body_bytes))
        except errors.MetaqError as exc:
            path.failed(topic, exc)
            raise
        now = now_ms()
        r = path.append(topic, partition, flag, data, now)
        try:
            path.durable(topic, r.partition, r.log_end, now)
        except errors.MetaqError as exc:
            path.failed(topic, exc, counted_only=True)
            raise
        request.pace("produce", len(payload))  # the user's produce rate: the reply waits
        return json_response({"id": r.msg_id, "topic": topic, "broker_id": self.broker_id, "partition": r.partition,
                              "offset": r.offset})

    def get(self, request):
        topic = request.params["topic"]
        try:
            partition = int(request.params["partition"])
        except ValueError:
            raise errors.ClientError("partition %r is not a number" % request.params["partition"]) from None
        refusal = self.roles.read_refusal
        if refusal is not None:
            raise errors.Unavailable(refusal)
        offset = request.arg("offset", 0, int)
        max_bytes = request.arg("max_bytes", limits.MAX_TRANSFER_BYTES, int)
        max_count = request.arg("max_count", http_limits.HTTP_MAX_GET_MESSAGES, int)
        if max_bytes <= 0 or max_count <= 0:
            raise errors.ClientError("max_bytes and max_count must be positive")
        raw = request.arg("format", "json") == "raw"
        if raw:
            max_count = 1
        records, nxt = self.store.read_records(topic, partition, offset,
                                               min(max_count, http_limits.HTTP_MAX_GET_MESSAGES),
                                               min(max_bytes, limits.MAX_TRANSFER_BYTES))
        self.counters.on_get(topic, not records)
        request.pace("fetch", sum(len(rec.data) for rec in records))  # the user's fetch rate: the reply waits
        messages = []
        for rec in records:
            try:
                attribute, payload = decode_payload(rec.flag, rec.data)
            except errors.MetaqError:
                attribute, payload = None, bytes(rec.data)
            messages.append((rec, attribute, payload))
        if raw:
            if not messages:
                return error_response(404, "no message at offset %d yet" % offset, next_offset=nxt)
            rec, attribute, payload = messages[0]
            headers = [("X-Metaq-Id", str(rec.msg_id)), ("X-Metaq-Offset", str(rec.queue_offset)),
                       ("X-Metaq-Next-Offset", str(nxt))]
            if attribute is not None:
                headers.append(("X-Metaq-Attribute", attribute.encode("unicode_escape").decode("ascii")))
            return Response(200, payload, "application/octet-stream", headers)
        return json_response({"topic": topic, "broker_id": self.broker_id, "partition": partition, "offset": offset,
                              "next_offset": nxt,
                              "messages": [{"id": rec.msg_id, "offset": rec.queue_offset, "flag": rec.flag,
                                            "attribute": attribute, "store_ms": rec.store_ts_ms,
                                            "body": base64.b64encode(payload).decode("ascii")}
                                           for rec, attribute, payload in messages]})


def _subscriber(guard, session, params):
    guard.require(session, SUB, "topic", params["topic"])


def add_routes(router, views):
    """The API's routes on ``router`` (routes.Router)."""
    router.add("GET", "/healthz", OPEN, views.healthz)
    router.add("GET", "/readyz", OPEN, views.readyz)
    router.add("GET", "/api/broker", READ, views.broker)
    router.add("GET", "/api/topics", READ, views.topics)
    router.add("GET", "/api/topics/{topic}", _subscriber, views.topic)
    router.add("GET", "/api/groups", READ, views.groups)
    router.add("GET", "/api/replication", READ, views.replication)
    router.add("POST", "/api/topics/{topic}/messages", READ, views.put)  # who may write: PutPath.check_write
    router.add("GET", "/api/topics/{topic}/partitions/{partition}/messages", _subscriber, views.get)
