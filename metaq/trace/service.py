"""Where is my message: one message's story on this broker, from the log and the state derived from it (docs/
operating.md "Where is my message").

``trace_message`` is the lookup, given only what it reads: the store (the record, the key index, the consumer
offsets, the groups' retry and dead-letter topics, the trace topic), the POP state, the broker's remoting address
(offset ids) and id, and ``require_read(topic)``, the one permission decision (``Guard.require`` SUB on the topic),
asked for the topic named and for each message's own topic before anything of it is answered. ``Tracer`` holds
those for the front-ends (text ``trace``: ``trace/text.py``; ``GET /api/trace``: ``trace/http.py``).

For each message found (at most the query's ``max_count``, ``limits.TRACE_MAX_RESULTS``) the answer says:

* where it is stored: topic, partition, offset, commit-log position, size, store and born times, the born host
  when the producer's was kept (RocketMQ sends), ids (metaq, offset id, ``UNIQ_KEY``), tags, keys, properties;
* ``consumers``: every group with a broker-kept offset of its partition, and whether that offset is past it
  (offsets kept in ZooKeeper or a consumer's file are not the broker's to see);
* ``pop``: per group that receives the topic per message, ``in_flight`` (attempt, invisible deadline,
  ``redelivered`` past the first attempt), ``acknowledged``, ``dead_lettered`` or ``not_received``;
* ``retries`` and ``dead_letters``: the copies a consumer's send-back (``server/remoting/send.py``) or a POP
  dead letter (``pop/service.py``) stored in ``%RETRY%<group>`` / ``%DLQ%<group>``, found by their
  ``ORIGIN_MESSAGE_ID`` (the message's ``UNIQ_KEY``, else its offset id, whose position is the message's), read
  from the message's store time on, at most ``limits.TRACE_MAX_COPY_SCAN`` records (``copies_complete``);
* ``traces``: RocketMQ message-trace records about its ``UNIQ_KEY`` in ``RMQ_SYS_TRACE_TOPIC`` (found by the key
  index; at most ``limits.TRACE_MAX_RECORDS``, ``traces_complete``), oldest first.

Reads run on the event loop as the admin scans do: the key index and time searches bring cold pages in off the
loop (``coldpages.walk``), the copy scan lets the others run every ``limits.DLQ_SCAN_STEP`` records (``pause``).
"""

import gevent

from metaq import errors, limits
from metaq.admin import limits as admin_limits
from metaq.trace import limits as trace_limits
from metaq.auth.acl import SUB
from metaq.protocol.journaltopic import DLQ_PREFIX, RETRY_PREFIX
from metaq.protocol.msgid import id_broker, id_timestamp_ms
from metaq.protocol.rocketmq.bodies import create_offset_msg_id, parse_offset_msg_id
from metaq.protocol.properties import PROP_KEYS, PROP_TAGS, PROP_UNIQ_KEY
from metaq.protocol.rocketmq.mapping import PROP_ORIGIN_MESSAGE_ID, message_of_record
from metaq.clock import now_ms
from metaq.loop.coldpages import walk
from metaq.trace.records import TRACE_TOPIC, parse_message_id, parse_trace_body

__all__ = ["Tracer", "trace_message"]

_NO_HOST = ("127.0.0.1", 0)  # the store host message_of_record is given without a remoting port
_ALL_TIME = (0, 2**63 - 1)
_READ_BYTES = 4 << 20
#: Milliseconds before a metaq id's own a trace by id starts reading: an id's millisecond runs ahead of its store
#: time when a millisecond's sequence was used up (``store/msgid.py``).
ID_SKEW_MS = 1000


def _pause():
    gevent.sleep(0.001)


class _Since:
    """Iterates ``(offset, record)`` of a partition from the first stored at or after ``since_ms`` to its end, at
    most ``most`` records read ``limits.DLQ_SCAN_STEP`` at a time (``pause()`` between steps), following a retention
    that moved the partition's start meanwhile. ``short``: it stopped at ``most``, before the end."""

    def __init__(self, store, topic, partition, since_ms, most, pause=None):
        self.store, self.topic, self.partition, self.since_ms = store, topic, partition, since_ms
        self.most, self.pause, self.short = most, pause, False

    def __iter__(self):
        store, topic, partition = self.store, self.topic, self.partition
        try:
            offset = walk(store.time_search(topic, partition, self.since_ms)).result
            end = store.max_offset(topic, partition)
        except errors.MetaqError:
            return
        read = 0
        while offset is not None and offset < end:
            if read >= self.most:
                self.short = True
                return
            try:
                records, nxt = store.read_records(topic, partition, offset,
                                                  min(admin_limits.DLQ_SCAN_STEP, self.most - read), _READ_BYTES)
            except errors.Moved as exc:  # retention moved the start while others ran
                if exc.offset <= offset:
                    return
                offset = exc.offset
                continue
            if not records:
                return
            read += len(records)
            for i, rec in enumerate(records):
                yield offset + i, rec
            offset = nxt
            if self.pause is not None:
                self.pause()


class Tracer:
    """``trace_message`` with the broker's collaborators: ``store``; ``pop_state()``: the POP state (None without
    one); ``host()``: the remoting ``(ip, port)`` offset ids name (None without the port); ``broker_id``;
    ``read_refusal()``: why this broker serves no reads now (a slave not caught up), or None."""

    def __init__(self, store, pop_state, host, broker_id, read_refusal=lambda: None, pause=_pause):
        self.store, self.pop_state, self.host, self.broker_id = store, pop_state, host, broker_id
        self.read_refusal, self.pause = read_refusal, pause

    def trace(self, query, guard, session):
        """``trace_message`` for ``session``'s user, by ``guard``'s one permission decision: the messages of topics
        it may subscribe to (Forbidden otherwise), and of their consumers only the groups it may consume as (another
        tenant's groups are not named to it)."""
        refusal = self.read_refusal()
        if refusal is not None:
            raise errors.Unavailable(refusal)
        found = trace_message(self.store, query, lambda topic: guard.require(session, SUB, "topic", topic),
                              self.pop_state(), self.host(), self.broker_id, self.pause)
        for m in found["messages"]:
            for key in _GROUP_ROWS:
                m[key] = [row for row in m[key] if guard.allows(session, SUB, "group", row["group"])]
        return found


#: The rows of a traced message that name a consumer group.
_GROUP_ROWS = ("consumers", "pop", "retries", "dead_letters")


def trace_message(store, query, require_read, pop_state=None, host=None, broker_id=None, pause=_pause):
    """``{"query", "messages", "more"}`` for ``query`` (``trace.wire.TraceQuery``: kind ``id`` or ``key``, value,
    topic or None, max_count). Raises ClientError (a malformed id, a key without a topic), Forbidden (from
    ``require_read``), NotFound (no such message here, with why)."""
    if query.topic is not None:
        limits.validate_topic(query.topic)
        require_read(query.topic)
    most = max(1, min(query.max_count, trace_limits.TRACE_MAX_RESULTS))
    if query.kind == "key":
        if query.topic is None:
            raise errors.ClientError("a key is looked up in one topic: name it")
        found = _by_key(store, query.topic, query.value, most)
    else:
        found = _by_id(store, query.value, query.topic, host, broker_id, most)
    if not found:
        raise errors.NotFound("no message %s %s%s on this broker" % (
            "with key" if query.kind == "key" else "with id", query.value,
            " in topic %s" % query.topic if query.topic else ""))
    more = len(found) > most
    found = found[:most]
    for rec in found:
        require_read(rec.topic)  # each message's own topic, before anything of it is told
    messages = [_describe(store, rec, pop_state, host, pause) for rec in found]
    return {"query": {"kind": query.kind, "value": query.value, "topic": query.topic}, "messages": messages,
            "more": more}


# -- finding the message -------------------------------------------------------------------


def _by_key(store, topic, key, most):
    """The newest ``most + 1`` messages of ``topic`` carrying ``key`` (the key index)."""
    try:
        store.partitions_of(topic)
    except errors.UnknownTopic:
        return []
    return list(walk(store.key_search(topic, key, _ALL_TIME[0], _ALL_TIME[1], most + 1)).page().records)


def _by_id(store, text, topic, host, broker_id, most):
    ref = parse_message_id(text)
    if ref.kind == "metaq":
        if topic is None:
            raise errors.ClientError("metaq id %s is found within its topic: name the topic" % text)
        if broker_id is not None and id_broker(ref.metaq_id) != broker_id:
            raise errors.NotFound("metaq id %s was made by broker %d, not this one (broker %d)"
                                  % (text, id_broker(ref.metaq_id), broker_id))
        return _by_metaq_id(store, topic, ref.metaq_id)
    if host is not None and ref.host == tuple(host):
        try:
            return [store.record_at(ref.position)]
        except errors.NotFound:
            pass  # not a record here: maybe a client's UNIQ_KEY of the same shape
    if topic is not None:
        return _by_key(store, topic, ref.text, most)
    raise errors.NotFound("message id %s names no record of this broker (an offset id names %s:%d, this broker is %s); "
                          "a client's message id (UNIQ_KEY) is found within its topic: name the topic"
                          % (ref.text, ref.host[0], ref.host[1], "%s:%d" % tuple(host) if host else "without a "
                                                                                                     "remoting port"))


def _by_metaq_id(store, topic, msg_id):
    """The record of ``topic`` whose id is ``msg_id``: per partition, from the first stored ``ID_SKEW_MS`` before the
    id's millisecond, until an id past it (ids grow with offsets), at most ``limits.TRACE_ID_SCAN`` records."""
    try:
        count = store.partitions_of(topic)
    except errors.UnknownTopic:
        return []
    since = id_timestamp_ms(msg_id) - ID_SKEW_MS
    for p in range(count):
        for _offset, rec in _Since(store, topic, p, since, trace_limits.TRACE_ID_SCAN):
            if rec.msg_id == msg_id:
                return [rec]
            if rec.msg_id > msg_id:
                break
    return []


# -- what became of it ---------------------------------------------------------------------


def _describe(store, rec, pop_state, host, pause):
    msg = message_of_record(rec, host or _NO_HOST)
    props = dict(msg.properties)
    uniq = props.get(PROP_UNIQ_KEY)
    offset_id = create_offset_msg_id(host[0], host[1], rec.position) if host else None
    copies, complete = _copies(store, rec, uniq, host, pause)
    dead_groups = {c["group"] for c in copies if c["kind"] == "dead_letter"}
    traces, traces_complete = _traces(store, uniq, host)
    return {
        "topic": rec.topic, "partition": rec.partition, "offset": rec.queue_offset, "position": rec.position,
        "size": rec.total_size, "store_ms": rec.store_ts_ms, "born_ms": rec.born_ts_ms,
        "born_host": "%s:%d" % msg.born_host if msg.born_host != (host or _NO_HOST) else None,
        "msg_id": rec.msg_id, "offset_msg_id": offset_id, "uniq_key": uniq, "tags": props.get(PROP_TAGS),
        "keys": props.get(PROP_KEYS), "reconsume_times": msg.reconsume_times, "body_bytes": len(msg.body),
        "properties": props,
        "consumers": _consumers(store, rec),
        "pop": _pop(pop_state, rec, dead_groups),
        "retries": [_copy_row(c) for c in copies if c["kind"] == "retry"],
        "dead_letters": [_copy_row(c) for c in copies if c["kind"] == "dead_letter"],
        "copies_complete": complete,
        "traces": traces, "traces_complete": traces_complete,
    }


def _consumers(store, rec):
    """Every group with a broker-kept offset of the message's partition: past it (``consumed``) or not."""
    return [{"group": g, "offset": offset, "commit_ms": commit_ms, "consumed": offset > rec.queue_offset}
            for g, topic, partition, offset, commit_ms in store.consumer_offsets.entries()
            if topic == rec.topic and partition == rec.partition]


def _pop(pop_state, rec, dead_groups):
    if pop_state is None:
        return []
    now = now_ms()
    out = []
    for group, state, flight in pop_state.message_states(rec.topic, rec.partition, rec.queue_offset):
        row = {"group": group, "state": state, "attempt": None, "invisible_until_ms": None, "redelivered": False,
               "visible_again": False}
        if state == "done":
            row["state"] = "dead_lettered" if group in dead_groups else "acknowledged"
        elif flight is not None:
            row.update(attempt=flight.attempt, invisible_until_ms=flight.deadline, redelivered=flight.attempt > 1,
                       visible_again=flight.deadline <= now)
        out.append(row)
    return out


def _is_copy_of(origin, rec, uniq):
    if not origin:
        return False
    if uniq is not None and origin == uniq:
        return True
    try:
        return parse_offset_msg_id(origin)[2] == rec.position
    except errors.MetaqError:
        return False


def _copies(store, rec, uniq, host, pause):
    """``([copy], complete)``: the message's copies in the groups' retry and dead-letter topics (module doc)."""
    budget = trace_limits.TRACE_MAX_COPY_SCAN
    found, complete = [], True
    for topic in store.known_topics():
        if topic.startswith(RETRY_PREFIX):
            kind, group = "retry", topic[len(RETRY_PREFIX):]
        elif topic.startswith(DLQ_PREFIX):
            kind, group = "dead_letter", topic[len(DLQ_PREFIX):]
        else:
            continue
        try:
            count = store.partitions_of(topic)
        except errors.MetaqError:
            continue
        for p in range(count):
            scan = _Since(store, topic, p, rec.store_ts_ms, budget, pause)
            for offset, copy in scan:
                budget -= 1
                msg = message_of_record(copy, host or _NO_HOST)
                if _is_copy_of(msg.properties.get(PROP_ORIGIN_MESSAGE_ID), rec, uniq):
                    found.append({"kind": kind, "group": group, "topic": topic, "partition": p, "offset": offset,
                                  "store_ms": copy.store_ts_ms, "reconsume_times": msg.reconsume_times})
            complete = complete and not scan.short
    found.sort(key=lambda c: (c["store_ms"], c["topic"], c["partition"], c["offset"]))
    return found, complete


def _copy_row(copy):
    return {k: copy[k] for k in ("group", "topic", "partition", "offset", "store_ms", "reconsume_times")}


def _traces(store, uniq, host):
    """``([record], complete)``: the message-trace records about ``uniq`` (module doc), oldest first."""
    if uniq is None:
        return [], True
    try:
        store.partitions_of(TRACE_TOPIC)
        page = walk(store.key_search(TRACE_TOPIC, uniq, _ALL_TIME[0], _ALL_TIME[1],
                                     trace_limits.TRACE_MAX_RECORDS)).page()
    except (errors.UnknownTopic, errors.ClientError):
        return [], True
    out, complete = [], page.cursor is None
    for rec in page.records:
        body = message_of_record(rec, host or _NO_HOST).body
        for t in parse_trace_body(bytes(body)):
            if t["msg_id"] != uniq:
                continue
            if len(out) >= trace_limits.TRACE_MAX_RECORDS:
                complete = False
                break
            out.append(dict(t, trace_topic_offset=rec.queue_offset))
    out.sort(key=lambda t: (t.get("timestamp_ms") is None, t.get("timestamp_ms") or 0))
    return out, complete
