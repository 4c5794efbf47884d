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
"""

from metaq.errors import TopicLimit


class TopicQuota:
    def __init__(self, max_topics, max_partitions, exempt=(), uncounted=()):
        self.max_topics = max_topics
        self.max_partitions = max_partitions
        self._uncounted = frozenset(uncounted)
        self._exempt = frozenset(exempt) | self._uncounted
        self._topics = {}  # topic -> partitions held
        self.partitions = 0

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
