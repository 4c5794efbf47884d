"""Which topics are the broker's own rather than a user's: what listings hide unless asked (``metaq-admin topics
--all``).

``INTERNAL`` names the broker's exact topics: delayed delivery's (``SCHEDULE_TOPIC_XXXX``), the timer store's log
(``%TIMER%``), the transaction journal (``%TX%``), the POP journal (``%POP%``), the MQTT sessions' log
(``%MQTT%``) and RocketMQ's message-trace topic (``RMQ_SYS_TRACE_TOPIC``, declared with the remoting port; its
records are the clients', read by ``metaq-admin trace``). ``is_internal`` also covers the topics the broker names
after a consumer group (``%RETRY%<group>``, ``%DLQ%<group>``, ``%RESENT%<group>``) and a priority topic's levels
(``<topic>%P<k>``, whose messages belong to ``<topic>``: ``level_owner``). Pure: names in, answers out.
"""

from metaq.protocol.journaltopic import (GROUP_COPY_PREFIXES, MQTT_INBOX_TOPIC, MQTT_SESSIONS_TOPIC, POP_TOPIC,
                                        SCHEDULE_TOPIC, TIMER_TOPIC, TRACE_TOPIC, TX_TOPIC)
from metaq.priorities.wire import split_level

__all__ = ["INTERNAL", "is_internal", "level_owner"]

#: The broker's own topics by exact name: delayed delivery's levels, the timer store's log, the transaction journal,
#: the POP journal, the MQTT sessions' log, RocketMQ's message-trace topic, the MQTT cluster's inbox.
INTERNAL = (SCHEDULE_TOPIC, TIMER_TOPIC, TX_TOPIC, POP_TOPIC, MQTT_SESSIONS_TOPIC, TRACE_TOPIC, MQTT_INBOX_TOPIC)


def level_owner(topic):
    """The priority topic whose level ``topic`` stores (``orders`` for ``orders%P2``), or None for any other name."""
    split = split_level(topic)
    return split[0] if split is not None else None


def is_internal(topic):
    """True for a name in ``INTERNAL``, a consumer group's retry, dead-letter or resent-journal topic, or a
    priority level's topic."""
    return topic in INTERNAL or topic.startswith(GROUP_COPY_PREFIXES) or level_owner(topic) is not None
