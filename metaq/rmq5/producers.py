"""The gRPC port's producers' streams: which Telemetry stream of which client publishes to which topic (its producer
Settings' ``publishing.topics``), so a half message's check-back asks a producer of its topic. At most
``limits.GRPC_MAX_TOPICS_PER_SETTINGS`` names a Settings, ``limits.GRPC_MAX_PRODUCER_TOPICS`` names in all and, per
user, its ``producer_topics`` quota.
"""

from metaq import errors, limits
from metaq.rmq5 import limits as rmq5_limits
from metaq.rmq5.wire import GrpcError, Status


class ProducerStreams:
    """The streams (see the module doc), given the guard whose quotas bound each user's names (None: no users)."""

    def __init__(self, guard):
        self.guard = guard
        self._producers = {}  # topic -> {ClientKey: its Telemetry call}: whom a half message's check asks
        self._published = {}  # Telemetry call -> the topic names its latest producer Settings registered
        self._by_user = {}  # user ("" with authentication off) -> names its streams hold (``_published``)

    def streams_of(self, topic):
        """The Telemetry calls of the clients publishing to ``topic`` now (a list: a copy)."""
        return list(self._producers.get(topic, {}).values())

    def publish(self, client, call, topics):
        """Register ``call`` as ``client``'s stream for ``topics`` (its producer Settings' ``publishing.topics``),
        replacing what its Settings before named. Checked before anything is kept: at most
        ``limits.GRPC_MAX_TOPICS_PER_SETTINGS`` names (INVALID_ARGUMENT), each a legal topic name, and the names
        kept stay within ``limits.GRPC_MAX_PRODUCER_TOPICS`` and the user's ``producer_topics`` quota
        (RESOURCE_EXHAUSTED). So one stream holds at most one Settings' names, and a user at most its quota."""
        most = rmq5_limits.GRPC_MAX_TOPICS_PER_SETTINGS
        if len(topics) > most:
            raise GrpcError(Status.INVALID_ARGUMENT, "BAD_REQUEST: a producer's Settings names %d topics: at most %d "
                            "(limits.GRPC_MAX_TOPICS_PER_SETTINGS)" % (len(topics), most))
        names = set()
        for resource in topics:
            try:
                limits.validate_topic(resource.name)
            except errors.InvalidTopic as exc:
                raise GrpcError(Status.INVALID_ARGUMENT, "ILLEGAL_TOPIC: %s" % exc) from None
            names.add(resource.name)
        mine = len(self._published.get(call, ()))
        held = sum(self._by_user.values()) - mine
        if held + len(names) > rmq5_limits.GRPC_MAX_PRODUCER_TOPICS:
            raise GrpcError(Status.RESOURCE_EXHAUSTED, "TOO_MANY_REQUESTS: the broker keeps %d topic names of "
                            "producers' streams (limits.GRPC_MAX_PRODUCER_TOPICS); this Settings names %d more"
                            % (rmq5_limits.GRPC_MAX_PRODUCER_TOPICS, len(names)))
        guard = self.guard
        if guard is not None and client.user:
            try:
                guard.quotas.check(client.user, "producer_topics", self._by_user.get(client.user, 0) - mine,
                                   len(names))
            except errors.QuotaExceeded as exc:
                raise GrpcError(Status.RESOURCE_EXHAUSTED, "TOO_MANY_REQUESTS: %s" % exc) from None
        self.unpublish(client, call)
        if not names:
            return
        self._published[call] = frozenset(names)
        self._by_user[client.user] = self._by_user.get(client.user, 0) + len(names)
        for topic in names:
            self._producers.setdefault(topic, {})[client] = call

    def unpublish(self, client, call):
        """Forget the topic names ``call``'s Settings registered (its stream ended, or new Settings replace them)."""
        names = self._published.pop(call, ())
        if not names:
            return
        left = self._by_user.get(client.user, 0) - len(names)
        if left > 0:
            self._by_user[client.user] = left
        else:
            self._by_user.pop(client.user, None)
        for topic in names:
            streams = self._producers.get(topic)
            if streams is not None and streams.get(client) is call:
                del streams[client]
                if not streams:
                    del self._producers[topic]

    def held(self):
        """``{user: topic names its producers' streams hold}`` (``stats quotas``; None: no user, authentication off)."""
        return {user or None: n for user, n in self._by_user.items()}
