"""How many topics and partitions the store holds, and the refusal to create one past the limits.

With the default ``*`` topic pattern any client may create topics. Each
partition costs an index file (a page to start with: index.py), a map, an
entry in every checkpoint and a line in ``stats``, so the store bounds them:
``max_topics`` topics and ``max_partitions`` partitions in all (``limits``,
configured under ``limits:``). A put that would create a topic or a partition
past either bound is refused with ``TopicLimit`` (a client error: 400 on the
text port, TOPIC_NOT_EXIST on the remoting port, as RocketMQ answers a topic
it will not create). Topics named exactly in the configuration (the broker's
own among them) are counted but never refused: the operator bounded them. The transaction journal (``%TX%``, one
partition) is the store's own and neither counted nor refused.
Replication (a slave mirrors its master) and recovery create what the log
holds, past the bounds if need be; only puts are refused.

**Per user.** A topic a user's put creates is that user's (``claim``: asked by
the put path's write decision before the put, with the topic's partition count
and the quota decision ``check(user, name, held, more)``: ``metaq.auth.quotas``,
``topics`` and ``partitions``), so one user cannot take every topic the broker
may hold. The owners are the store's ``topic_owners`` state file (``owners`` /
``load_owners``); a deleted topic leaves its owner's count. Topics created by
the configuration or an admin's ``topic create`` have no owner. A master sends
its owners to its slaves with the topic table (the TOPICS frame:
``metaq.protocol.replication_topics``) and a slave's become exactly those
(``replace_owners``), so a slave's counts, and a promoted slave's quotas, are
its master's.
"""

import logging

from metaq import limits
from metaq.errors import InvalidTopic, TopicLimit

log = logging.getLogger(__name__)


class TopicQuota:
    def __init__(self, max_topics, max_partitions, exempt=(), uncounted=()):
        self.max_topics = max_topics
        self.max_partitions = max_partitions
        self._uncounted = frozenset(uncounted)
        self._exempt = frozenset(exempt) | self._uncounted
        self._topics = {}  # topic -> partitions held
        self.partitions = 0
        self._owners = {}  # topic -> (user, partitions): the topics users' puts created
        self._held = {}  # user -> [topics, partitions] it owns
        self.owners_version = 0  # bumped by every change of the owners (the store saves them when it moved)

    @property
    def topics(self):
        return len(self._topics)

    def added(self, topic):
        """The store now holds one more partition of ``topic``."""
        if topic in self._uncounted:
            return
        self._topics[topic] = self._topics.get(topic, 0) + 1
        self.partitions += 1

    def forget(self, topic):
        """The store no longer holds any partition of ``topic`` (deleted: topics/state.py)."""
        self.partitions -= self._topics.pop(topic, 0)
        self._disown(topic)

    # -- owners ---------------------------------------------------------------

    def settled(self, topic):
        """True when a put to ``topic`` creates no topic of a user's: held, owned already, or the operator's."""
        return topic in self._topics or topic in self._owners or topic in self._exempt

    def claim(self, topic, user, partitions, check):
        """``user``'s put is about to create ``topic`` (``partitions`` of them): count it as the user's, or raise
        what ``check(user, quota name, held, more)`` raises past its ``topics`` or ``partitions`` quota. Nothing
        for a topic the store holds or one already owned."""
        if topic in self._topics or topic in self._owners or topic in self._exempt:
            return
        topics, held = self._held.get(user, (0, 0))
        check(user, "topics", topics, 1)
        check(user, "partitions", held, partitions)
        self._own(topic, user, partitions)

    def _own(self, topic, user, partitions):
        self._owners[topic] = (user, partitions)
        held = self._held.setdefault(user, [0, 0])
        held[0] += 1
        held[1] += partitions
        self.owners_version += 1

    def _disown(self, topic):
        owner = self._owners.pop(topic, None)
        if owner is None:
            return
        held = self._held[owner[0]]
        held[0] -= 1
        held[1] -= owner[1]
        if held[0] <= 0:
            del self._held[owner[0]]
        self.owners_version += 1

    def held(self):
        """``{user: (topics, partitions)}`` its puts created (stats)."""
        return {u: tuple(h) for u, h in self._held.items()}

    def owners(self):
        """The state to save: ``[[topic, user, partitions]]``."""
        return [[t, u, n] for t, (u, n) in sorted(self._owners.items())]

    def load_owners(self, rows):
        """The saved owners (``owners``' rows; a malformed row is skipped, and so is one no user can have: a name
        past MAX_TX_OWNER_BYTES, which the replication stream could not carry either)."""
        for row in rows or ():
            try:
                topic, user, partitions = str(row[0]), str(row[1]), int(row[2])
                limits.validate_topic(topic)
                size = len(user.encode("utf-8"))
            except (TypeError, ValueError, IndexError, InvalidTopic):  # UnicodeEncodeError among them
                continue
            if not (0 < size <= limits.MAX_TX_OWNER_BYTES
                    and 1 <= partitions <= limits.MAX_PARTITIONS):
                log.warning("topic owners: ignored %r: a user name has 1..%d bytes and a topic 1..%d partitions",
                            row, limits.MAX_TX_OWNER_BYTES, limits.MAX_PARTITIONS)
                continue
            if topic not in self._owners:
                self._own(topic, user, partitions)

    def owned(self):
        """``[(topic, user, partitions)]`` sorted: the topics users' puts created (what a master sends)."""
        return [(t, u, n) for t, (u, n) in sorted(self._owners.copy().items())]

    def replace_owners(self, rows):
        """A master's owners ``[(topic, user, partitions)]``: ours become exactly these (the master's word is final;
        an owner only we had goes). The version moves only when something changed, so the state file is written
        again only then."""
        owners = {t: (u, n) for t, u, n in rows}
        if owners == self._owners:
            return
        held = {}
        for user, partitions in owners.values():
            h = held.setdefault(user, [0, 0])
            h[0] += 1
            h[1] += partitions
        self._owners, self._held = owners, held  # new objects: a checkpoint listing the old ones meets no change
        self.owners_version += 1

    def check(self, topic, partition):
        """Raise TopicLimit if creating ``topic``-``partition`` (not held yet) would pass a limit."""
        if topic in self._exempt:
            return
        if topic not in self._topics and len(self._topics) >= self.max_topics:
            raise TopicLimit("topic %s is not created: the broker holds %d topics, its limit (limits.max_topics); "
                             "put to an existing topic, or ask the operator" % (topic, len(self._topics)))
        if self.partitions >= self.max_partitions:
            raise TopicLimit("partition %s-%d is not created: the broker holds %d partitions, its limit "
                             "(limits.max_partitions); put to an existing partition, or ask the operator"
                             % (topic, partition, self.partitions))
