"""The admin operations on consumer offsets and dead letters, protocol-neutral (docs/operating.md "Admin commands").

``AdminOps`` answers with plain Python values (dicts and lists) and raises ``errors.MetaqError``; each front-end
formats them: the text protocol's ``group_info``, ``reset_offset``, ``dlq_list`` and ``dlq_resend``
(``admin/text.py``, ``admin/wire.py``), and the HTTP JSON API can call the same methods.

**Live members** of a group, for offsets the broker keeps: the RocketMQ clients registered in the group by their
heartbeats (``remoting/clients.py``: until UNREGISTER_CLIENT, their connection closes or no heartbeat for
``remoting.client_timeout_s``), and the text connections still open that sent ``commit_offset`` or
``query_offset`` for the group (``TextGroupMembers``; the metaq ``Consumer`` with broker-kept offsets does both).

**Dead letters** are the records of RocketMQ's ``%DLQ%<group>`` topic (``remoting/send.py``'s send-back after
``max_reconsume_times``): their properties say the original topic (``RETRY_TOPIC``), the id the consumer saw
(``ORIGIN_MESSAGE_ID``) and the deliveries (``@RECONSUME``). A resend puts a copy on the original topic with its
body, flag, tags, keys and user properties (``RETRY_TOPIC`` dropped, deliveries back to 0, ``METAQ_DLQ_RESENT``
naming the dead letter), then records the dead letter's position in the group's *resent journal*, the topic
``%RESENT%<group>`` (one record ``<partition> <offset>`` per resent dead letter): being a topic, the journal is
in the commit log, survives restarts, reaches the slaves with everything else, and lives at least as long as the
dead letters it names (retention deletes older records first). A second resend skips what the journal holds.
A crash between the copy and its journal record resends that one message again (at least once).
"""

import random
from collections import OrderedDict

import gevent

from metaq import errors, limits
from metaq.admin import limits as admin_limits
from metaq.protocol.compression import COMPRESSION_BITS
from metaq.protocol.journaltopic import DLQ_PREFIX, RESENT_PREFIX
from metaq.protocol.properties import PROP_KEYS, PROP_TAGS, PROP_UNIQ_KEY, stored_payload
from metaq.protocol.rocketmq.mapping import (
    PROP_ORIGIN_MESSAGE_ID,
    PROP_RETRY_TOPIC,
    message_of_record,
    record_data_from_send,
)

__all__ = ["TextGroupMembers", "AdminOps", "DLQ_PREFIX", "RESENT_PREFIX", "RESENT_PROPERTY"]

#: The property a resent copy carries: ``<dlq topic> <partition>-<offset>`` of its dead letter.
RESENT_PROPERTY = "METAQ_DLQ_RESENT"
_READ_BYTES = 4 << 20
_HOST = ("127.0.0.1", 0)


class TextGroupMembers:
    """Text connections that committed or queried a group's offsets, while they are open (time passed in,
    monotonic seconds). Bounded by ``max_members`` (group, connection) entries: the least recently seen goes."""

    def __init__(self, max_members=admin_limits.MAX_TEXT_GROUP_MEMBERS):
        self.max_members = max_members
        self._seen = OrderedDict()  # (group, conn_id) -> (peer, last seen)
        self._groups_of = {}  # conn_id -> {group}

    def seen(self, group, conn_id, peer, now):
        key = (group, conn_id)
        self._seen[key] = (peer, now)
        self._seen.move_to_end(key)
        self._groups_of.setdefault(conn_id, set()).add(group)
        while len(self._seen) > self.max_members:
            (old_group, old_conn), _ = self._seen.popitem(last=False)
            groups = self._groups_of.get(old_conn)
            if groups is not None:
                groups.discard(old_group)
                if not groups:
                    del self._groups_of[old_conn]

    def connection_closed(self, conn):
        """The connection core's close hook: a closed connection is a member no more."""
        conn_id = getattr(conn, "conn_id", None)
        for group in self._groups_of.pop(conn_id, ()):
            self._seen.pop((group, conn_id), None)

    def of(self, group, now):
        """``[(conn id, peer, idle seconds)]`` of ``group``."""
        return [(conn_id, peer, max(0.0, now - last)) for (g, conn_id), (peer, last) in self._seen.items()
                if g == group]

    def __len__(self):
        return len(self._seen)


class AdminOps:
    """``store``: the MessageStore; ``put_path``: where resent dead letters go (its refusals, durability);
    ``text_members``: a TextGroupMembers; ``remoting_members(group)``: ``[(client id, address, idle seconds)]`` of
    the RocketMQ clients in the group (empty without a remoting port); ``pause()`` lets the broker's other
    greenlets run between the steps of a dead-letter scan (``limits.DLQ_SCAN_STEP``)."""

    def __init__(self, store, put_path, text_members, remoting_members=lambda group: [],
                 pause=lambda: gevent.sleep(0.001)):
        self.pause = pause  # lets the loop's other greenlets run (a long scan's steps)
        self.store = store
        self.put_path = put_path
        self.text_members = text_members
        self.remoting_members = remoting_members

    # -- consumer groups -----------------------------------------------------

    def require_topic(self, topic):
        """NotFound unless the broker holds ``topic`` (configured by its exact name, or with messages): an offset
        of a topic that is not there is a typo, not a reset."""
        limits.validate_topic(topic)
        if topic not in self.store.known_topics() and self.store.topics.level_owner(topic) is None:
            raise errors.NotFound("no topic %s on this broker" % topic)  # a priority level's name is its topic's

    def live_members(self, group, now_s):
        """``[{"kind", "id", "address", "idle_s"}]``: the group's live members (module docstring)."""
        limits.validate_group(group)
        members = [{"kind": "remoting", "id": str(cid), "address": str(addr), "idle_s": round(idle, 1)}
                   for cid, addr, idle in self.remoting_members(group)]
        members.extend({"kind": "text", "id": "conn-%s" % cid, "address": str(peer), "idle_s": round(idle, 1)}
                       for cid, peer, idle in self.text_members.of(group, now_s))
        return members

    def group_info(self, group, now_s):
        """The group's live members and its broker-kept offsets, each with its partition's bounds."""
        members = self.live_members(group, now_s)
        offsets = []
        for g, topic, partition, offset, commit_ms in self.store.consumer_offsets.entries():
            if g != group:
                continue
            try:
                bounds = self.store.min_offset(topic, partition), self.store.max_offset(topic, partition)
            except errors.MetaqError:
                bounds = (None, None)
            offsets.append({"topic": topic, "partition": partition, "offset": offset, "commit_ms": commit_ms,
                            "min_offset": bounds[0], "max_offset": bounds[1]})
        return {"group": group, "members": members, "offsets": offsets}

    def reset_offset(self, group, topic, partition, offset, force, now_ms, now_s):
        """Set the group's broker-kept offset of ``topic``/``partition`` to ``offset`` (within the partition's
        ``[min, max]``); GroupActive while it has live members unless ``force``; NotMaster (503, naming the master
        when known) on a broker that is not the master, as every offset commit (``PutPath.check_master``). Returns
        ``{"old", "new"}``."""
        limits.validate_group(group)
        limits.validate_topic(topic)
        self.put_path.check_master()
        members = self.live_members(group, now_s)
        if members and not force:
            raise errors.GroupActive("group %s has %d live member(s): %s; stop them first, or force the reset"
                                     % (group, len(members), ", ".join("%s %s (%s)" % (m["kind"], m["id"],
                                                                                       m["address"])
                                                                         for m in members)))
        self.require_topic(topic)
        low, high = self.store.min_offset(topic, partition), self.store.max_offset(topic, partition)
        if not low <= offset <= high:
            raise errors.ClientError("offset %d is outside %s-%d: it holds offsets %d..%d" % (offset, topic,
                                                                                              partition, low, high))
        old = self.store.query_offset(group, topic, partition)
        self.store.commit_offset(group, topic, partition, offset, now_ms)
        return {"old": old, "new": offset}

    # -- dead letters --------------------------------------------------------

    def _dead_letter_topic(self, group):
        limits.validate_group(group)
        topic = DLQ_PREFIX + group
        try:
            limits.validate_topic(RESENT_PREFIX + group)
            if topic in self.store.known_topics():  # a topic with data (or configured by its exact name)
                return topic, self.store.partitions_of(topic)
        except errors.InvalidTopic:
            raise errors.ClientError("group name %r is too long for a dead-letter journal" % group) from None
        except errors.UnknownTopic:
            pass
        raise errors.NotFound("group %s has no dead letters on this broker (no topic %s)" % (group, topic))

    def _records(self, topic, partition, first=None, keep=None):
        """``([(offset, record)], more)``: one partition's records from ``first`` (default: its first kept
        offset) to its end, at most ``limits.MAX_DLQ_SCAN`` of them; ``more``: some were not scanned. ``keep(rec)``
        (optional) says which records to hold: the others are read and dropped (the count bounds what is held)."""
        store = self.store
        offset, end = store.min_offset(topic, partition), store.max_offset(topic, partition)
        offset = max(offset, first or 0)
        found = []
        while offset < end and len(found) < admin_limits.MAX_DLQ_SCAN:
            try:
                records, nxt = store.read_records(topic, partition, offset,
                                                  min(admin_limits.DLQ_SCAN_STEP,
                                                      admin_limits.MAX_DLQ_SCAN - len(found)),
                                                  _READ_BYTES)
            except errors.Moved as exc:  # retention moved the partition's start while this scan let others run
                if exc.offset <= offset:
                    break
                offset = exc.offset
                continue
            if not records:
                break
            found.extend((offset + i, rec) for i, rec in enumerate(records) if keep is None or keep(rec))
            offset = nxt
            self.pause()  # the loop serves the others between steps (limits.DLQ_SCAN_STEP)
        return found, offset < end

    def _window(self, topic, partition):
        """The first offset of the dead letters a list or resend sees: the newest ``limits.MAX_DLQ_SCAN`` of the
        partition (the newest are the ones an operator is after; older ones are named by ``more``)."""
        return max(self.store.min_offset(topic, partition),
                   self.store.max_offset(topic, partition) - admin_limits.MAX_DLQ_SCAN)

    def resent(self, group, windows=None):
        """The positions ``(partition, offset)`` of the group's dead letters already resent (its journal), only
        those at or after ``windows[partition]`` when given. The whole journal is read, in steps that let the loop
        serve others; what is held is bounded by the windows."""
        journal = RESENT_PREFIX + group
        try:
            count = self.store.partitions_of(journal)
        except errors.UnknownTopic:
            return set()
        done = set()

        def position(rec):
            try:
                part, off = bytes(rec.data).split()
                return int(part), int(off)
            except ValueError:
                return None

        def wanted(rec):
            pos = position(rec)
            return pos is not None and (windows is None or (pos[0] in windows and pos[1] >= windows[pos[0]]))

        for p in range(count):
            first, more = None, True
            while more:
                found, more = self._records(journal, p, first, keep=wanted)
                done.update(position(rec) for _offset, rec in found)
                if more:  # held a full bound: go on past the last one held
                    first = found[-1][0] + 1
        return done

    def _letters(self, group):
        topic, count = self._dead_letter_topic(group)
        windows = {p: self._window(topic, p) for p in range(count)}
        resent = self.resent(group, windows)
        letters, more = [], False
        for p in range(count):
            records, _ = self._records(topic, p, windows[p])
            more = more or windows[p] > self.store.min_offset(topic, p)
            for i, (offset, rec) in enumerate(records):
                letters.append((p, offset, message_of_record(rec, _HOST), (p, offset) in resent))
                if i % admin_limits.DLQ_SCAN_STEP == admin_limits.DLQ_SCAN_STEP - 1:
                    self.pause()
        return topic, letters, more

    def dlq_list(self, group, max_count=admin_limits.MAX_DLQ_LIST):
        """``{"group", "topic", "dead_letters": [...], "more"}``: the group's dead letters, oldest first."""
        max_count = max(1, min(max_count, admin_limits.MAX_DLQ_LIST))
        topic, letters, more = self._letters(group)
        letters.sort(key=lambda letter: (letter[2].store_timestamp, letter[0], letter[1]))
        shown = [_describe(p, offset, msg, resent) for p, offset, msg, resent in letters[:max_count]]
        return {"group": group, "topic": topic, "dead_letters": shown, "more": more or len(letters) > max_count}

    def dlq_resend(self, group, ids, now_ms):
        """Put dead letters back on their original topic: every one not resent yet (``ids`` None), or those whose
        id or position (``p-o``) is in ``ids``. BLOCKS its greenlet until each copy may be acknowledged. Returns
        ``{"resent": [...], "skipped": [...]}`` (an id named and not found is skipped with that reason)."""
        self.put_path.check_writable()
        topic, letters, _more = self._letters(group)
        wanted = None if ids is None else set(ids)
        resent, skipped, matched = [], [], set()
        for p, offset, msg, done in letters:
            position, msg_id = "%d-%d" % (p, offset), _msg_id(msg)
            if wanted is not None:
                names = {position, msg_id} & wanted
                if not names:
                    continue
                matched |= names
            if done:
                skipped.append({"position": position, "id": msg_id, "reason": "already resent"})
                continue
            target = msg.properties.get(PROP_RETRY_TOPIC)
            if not target:
                skipped.append({"position": position, "id": msg_id, "reason": "no RETRY_TOPIC: original topic unknown"})
                continue
            try:
                r = self._resend(topic, p, offset, msg, target, now_ms)
            except errors.ClientError as exc:  # its topic deleted, read-only or internal: the others still go
                skipped.append({"position": position, "id": msg_id, "reason": "not resent to %s: %s" % (target, exc)})
                continue
            self._journal(group, p, offset, now_ms)
            resent.append({"position": position, "id": msg_id, "topic": target, "partition": r.partition,
                           "offset": r.offset})
        for name in sorted((wanted or set()) - matched):
            skipped.append({"position": None, "id": name, "reason": "no such dead letter of group %s" % group})
        return {"resent": resent, "skipped": skipped}

    def _resend(self, dlq_topic, partition, offset, msg, target, now_ms):
        props = {k: v for k, v in msg.properties.items() if k != PROP_RETRY_TOPIC}
        props[RESENT_PROPERTY] = "%s %d-%d" % (dlq_topic, partition, offset)
        body = stored_payload({}, msg.body)
        born = "%s:%d" % msg.born_host if msg.born_host != _HOST else None
        flag, data = record_data_from_send(body, props, msg.flag, msg.sys_flag & ~COMPRESSION_BITS, 0, born)
        path = self.put_path
        r = path.append(target, random.randrange(self.store.partitions_of(target)), flag, data, now_ms,
                        born_ms=msg.born_timestamp)
        path.durable(target, r.partition, r.log_end, now_ms)
        return r

    def _journal(self, group, partition, offset, now_ms):
        journal = RESENT_PREFIX + group
        r = self.put_path.append(journal, 0, 0, b"%d %d" % (partition, offset), now_ms, internal=True)
        self.put_path.durable(journal, r.partition, r.log_end, now_ms)


def _msg_id(msg):
    props = msg.properties
    return props.get(PROP_ORIGIN_MESSAGE_ID) or props.get(PROP_UNIQ_KEY) or ""


def _describe(partition, offset, msg, resent):
    body = bytes(msg.body)
    preview = body[:admin_limits.DLQ_BODY_PREVIEW_BYTES].decode("utf-8", "backslashreplace")
    return {"position": "%d-%d" % (partition, offset), "id": _msg_id(msg),
            "topic": msg.properties.get(PROP_RETRY_TOPIC), "tags": msg.properties.get(PROP_TAGS),
            "keys": msg.properties.get(PROP_KEYS), "reconsume_times": msg.reconsume_times,
            "stored_ms": msg.store_timestamp, "body_bytes": len(body), "body": preview, "resent": resent}
