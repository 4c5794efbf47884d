"""Subscribing an MQTT session's filters to the log (docs/mqtt.md "Subscribing"): which metaq topics and partitions a
filter reads, from where, and the retained messages a new subscription is sent (``Subscriber``).

A filter whose first level is literal reads the metaq topics the topic map says can hold its names
(``TopicMap.topics_for``: usually one), those its user may read; one that starts with a wildcard reads every topic
its user may read (the broker's own topics never), at most ``mqtt.max_wildcard_topics``. Each subscription's
permission is the guard's (``Guard.require(session, SUB, "topic", ...)``) for every topic it reads. A new
subscription starts at the end of the log (clean sessions); a topic that appears later under a wildcard filter is read
from its start (``Subscriber.rescan``). A ``$share`` filter joins its group at the port (``MqttPort.join_group``).
"""

import logging
import time

from metaq import errors
from metaq.auth.acl import SUB
from metaq.mqtt import wire
from metaq.mqtt.records import partition_for
from metaq.mqtt.session import Subscribed
from metaq.mqtt.topics import TopicError, split_shared
from metaq.topics.names import is_internal

log = logging.getLogger(__name__)


def one_name(topic_filter):
    """The one MQTT topic name ``topic_filter`` matches when it has no wildcard and more than one level (its messages
    are all in that name's partition), else None: a filter of the first level alone also matches the records put to
    that metaq topic over the other protocols, which may be in any partition."""
    if "/" not in topic_filter or "+" in topic_filter or "#" in topic_filter:
        return None
    return topic_filter


class Subscriber:
    """The subscriptions of one delivery: ``out`` (its ``outbound.Outbound``: the connection, its session, the port's
    store, guard, topic map and groups) and ``settings`` (the port's ``mqtt`` settings). ``rescanned``: when the
    wildcard filters last looked for new topics (``rescan``)."""

    __slots__ = ("out", "settings", "rescanned", "_seen", "_overflow_logged")

    def __init__(self, out, settings):
        self.out = out
        self.settings = settings
        self.rescanned = time.monotonic()
        self._seen = None  # topics known when a wildcard filter was subscribed, or found since
        self._overflow_logged = False

    def subscribe(self, sub, sub_id=None):
        """Add one filter of a SUBSCRIBE (a ``wire.Subscription``) with the SUBSCRIBE's Subscription Identifier
        (``sub_id``, None: none); its SUBACK code (the granted QoS, or a failure)."""
        out = self.out
        session, port = out.session, out.port
        try:
            share, inner = split_shared(sub.topic_filter)
        except TopicError:
            return wire.TOPIC_FILTER_INVALID
        code = self._admission(sub.topic_filter, share)
        if code is not None:
            return code
        code, topics = self._topics(sub.topic_filter, inner)
        if code is not None:
            return code
        granted = min(sub.qos, 2)
        cluster = port.cluster_topics  # the MQTT cluster's inbox: what the peers published (metaq.mqttcluster)
        if share is not None:
            old = session.shared.pop(sub.topic_filter, None)
            if old is not None:
                port.leave_group(out.conn, old[0])
            group = port.join_group(out.conn, share, inner, topics, out.store.max_offset)
            session.shared[sub.topic_filter] = (group, granted, sub_id)
            return granted
        session.subscribe(Subscribed(sub.topic_filter, granted, sub.no_local, list(topics) + list(cluster),
                                     sub.retain_as_published, sub_id))
        for topic in topics:
            self._start_at_end(topic, name=one_name(inner))
        for topic in cluster:
            self._start_at_end(topic)
        if cluster:
            port.routes_changed(sub.topic_filter)
        return granted

    def _admission(self, topic_filter, share):
        """The SUBACK failure code when ``topic_filter`` (of shared group ``share``, None: none) is refused before its
        topics are looked at (past ``mqtt.max_subscriptions``, a group its user may not join), else None."""
        out, most = self.out, self.settings.max_subscriptions
        session = out.session
        if topic_filter not in session.subscriptions and topic_filter not in session.shared \
                and len(session.subscriptions) + len(session.shared) >= most:
            log.info("mqtt %s: SUBSCRIBE %s refused: %d subscriptions is the limit (mqtt.max_subscriptions)",
                     out.conn.peer, topic_filter, most)
            return wire.QUOTA_EXCEEDED
        if share is not None:
            try:
                out.guard.require(out.conn.session, SUB, "group", share)  # the group is a consumer group's
            except (errors.Forbidden, errors.Unauthenticated) as exc:
                log.info("mqtt %s: SUBSCRIBE %s refused: %s", out.conn.peer, topic_filter, exc)
                return wire.NOT_AUTHORIZED
        return None

    def _topics(self, topic_filter, inner):
        """``(None, the metaq topics it reads)`` for ``topic_filter`` (``inner``: without its ``$share`` prefix), or
        ``(SUBACK failure code, None)``: a wildcard one reads every topic its user may read (the rules' topics among
        them once they exist, ``rescan``), within ``mqtt.max_wildcard_topics``; a literal one those of the topic map
        its user may read (``_allowed``)."""
        out = self.out
        topics, every = out.port.topics.topics_for(inner)
        if every:
            topics = self._readable()
            if self._seen is None:
                self._seen = set()
            self._seen.update(out.store.known_topics())
            most = self.settings.max_wildcard_topics
            if len(topics) > most:
                log.info("mqtt %s: SUBSCRIBE %s refused: it would read %d topics, past the limit of %d "
                         "(mqtt.max_wildcard_topics)", out.conn.peer, topic_filter, len(topics), most)
                return wire.QUOTA_EXCEEDED, None
            return None, topics
        if not topics:
            log.info("mqtt %s: SUBSCRIBE %s refused: topic filters beginning with '$' are the broker's",
                     out.conn.peer, topic_filter)
            return wire.TOPIC_FILTER_INVALID, None
        return self._allowed(topic_filter, topics)

    def resumed(self):
        """A resumed session's filters whose first level is literal also read the topics the topic map gives them now
        and did not when they were subscribed (``mqtt.topic_map`` changed since), from the end of the log; those read
        before go on from their positions (what they hold was written under the rules of then)."""
        for sub in self.out.session.subscriptions.values():
            if sub.wildcard:
                continue
            topics, _every = self.out.port.topics.topics_for(sub.topic_filter)
            new = [t for t in topics if t not in sub.topics]
            for topic in (self._allowed(sub.topic_filter, new)[1] or ()) if new else ():
                sub.topics.add(topic)
                self.out.session.changed()
                self._start_at_end(topic, name=one_name(sub.topic_filter))

    def _allowed(self, topic_filter, topics):
        """``(None, the topics of ``topics`` this subscriber may read)`` for a filter whose first level is literal
        (``TopicMap.topics_for``'s), or ``(SUBACK failure code, None)`` when it may read none of them: a filter that
        spans topics reads those its user may read (and the store has or may create), as a wildcard one does."""
        out = self.out
        allowed, code, why = [], None, None
        for topic in topics:
            try:
                out.guard.require(out.conn.session, SUB, "topic", topic)
                out.store.partitions_of(topic)
            except (errors.Forbidden, errors.Unauthenticated) as exc:
                code, why = code or wire.NOT_AUTHORIZED, why or exc
                continue
            except errors.InvalidTopic as exc:
                code, why = code or wire.TOPIC_FILTER_INVALID, why or exc
                continue
            except errors.MetaqError as exc:
                code, why = code or wire.UNSPECIFIED_ERROR, why or exc
                continue
            allowed.append(topic)
        if not allowed:
            log.info("mqtt %s: SUBSCRIBE %s refused: %s", out.conn.peer, topic_filter, why)
            return code, None
        return None, allowed

    def _readable(self):
        """The topics a wildcard filter reads: every topic this user may read, the broker's own left out."""
        out = self.out
        security = out.conn.session
        return [t for t in out.store.known_topics()
                if not is_internal(t) and out.guard.allows(security, SUB, "topic", t)]

    def _start_at_end(self, topic, at_start=False, name=None):
        """Read ``topic`` from the end of the log (``at_start``: from its start) on the partitions not read yet: every
        partition, or with ``name`` (a filter without wildcards: one MQTT topic name) only the one its messages are
        stored in (``records.partition_for``), so that its delivery neither reads nor wakes on the others."""
        store, cursors = self.out.store, self.out.session.cursors
        try:
            partitions = store.partitions_of(topic)
        except errors.MetaqError:
            return
        for p in range(partitions) if name is None else (partition_for(name, partitions),):
            key = (topic, p)
            if key not in cursors:
                cursors[key] = store.min_offset(topic, p) if at_start else store.max_offset(topic, p)

    def rescan(self):
        """Topics that appeared since (or became readable) join the wildcard filters, within their bound; a filter
        without wildcards whose name's partition has no read position (partitions were added since it subscribed)
        reads it from its start."""
        self.rescanned = time.monotonic()
        session = self.out.session
        for sub in list(session.subscriptions.values()):
            name = one_name(sub.topic_filter)
            if name is not None:  # its name's partition moves when the topic's count changes
                for topic in sub.topics:
                    self._start_at_end(topic, at_start=True, name=name)
        wild = session.wildcards()
        if not wild:
            return
        readable = self._readable()
        for sub in wild:
            self._rescan_filter(sub, readable)
        if self._seen is None:
            self._seen = set()
        self._seen.update(readable)

    def _rescan_filter(self, sub, readable):
        """Wildcard subscription ``sub`` reads the topics of ``readable`` it does not yet, within
        ``mqtt.max_wildcard_topics`` (past it, logged once): one never seen before from its start (all of it is
        new), the others from the end of the log."""
        most = self.settings.max_wildcard_topics
        for topic in readable:
            if topic in sub.topics:
                continue
            if len(sub.topics) >= most:
                if not self._overflow_logged:
                    self._overflow_logged = True
                    log.warning("mqtt %s: filter %s reads %d topics (mqtt.max_wildcard_topics): topic %s and "
                                "others created since are not read", self.out.conn.peer, sub.topic_filter,
                                len(sub.topics), topic)
                break
            sub.topics.add(topic)
            self.out.session.changed()
            self._start_at_end(topic, at_start=topic not in (self._seen or ()))

    def send_retained(self, pending):
        """Send each retained message the new subscriptions ``pending`` (``(filter, granted QoS)``) match, RETAIN set
        ([MQTT-3.3.1-8]), at min(its QoS, granted), of the metaq topics the filter reads and its user may read now.
        Waits for room in flight (the delivery's greenlet); stops when the connection closed."""
        out = self.out
        security = out.conn.session
        for topic_filter, granted in pending:
            sub = out.session.subscriptions.get(topic_filter)
            if sub is None:
                continue
            for r in out.port.retained_for(topic_filter, sub.topics):
                if not out.guard.allows(security, SUB, "topic", r.metaq_topic):
                    continue
                if not out.send(r.metaq_topic, None, r.flag, r.data, granted, True, None,
                                () if sub.sub_id is None else (sub.sub_id,)):
                    return
