"""The broker's internal topics written by the broker alone: the dead letters' resent journals (``%RESENT%<group>``,
admin/service.py), the timer store's log (``%TIMER%``, timers/service.py), the transaction journal (``%TX%``,
transactions/follow.py), the per-message acknowledgements' journal (``%POP%``, pop/follow.py) and the MQTT sessions'
log (``%MQTT%``, mqtt/follow.py). A client's put to a journal would make ``dlq resend`` skip a dead letter it never
resent (the journal says which were); one to the timer topic would schedule, cancel or mark delivered messages
behind the broker's back; one to the transaction journal would prepare, commit or forget branches; one to the POP
journal would acknowledge or hand out messages of any group; one to the MQTT sessions' log would give a device's
session subscriptions or read positions it never asked for. So every put path refuses these names (``is_journal``
is the one check they all ask), as it refuses the delay scheduler's topic."""

RESENT_PREFIX = "%RESENT%"
RETRY_PREFIX, DLQ_PREFIX = "%RETRY%", "%DLQ%"  # a consumer group's retry and dead-letter topics (RocketMQ's names)
#: Topics that hold copies of the messages of every topic a group consumed, or which of them were resent
#: (``server/guard.py``: an admin's, except a group's own retry topic pulled on the remoting port).
GROUP_COPY_PREFIXES = (RETRY_PREFIX, DLQ_PREFIX, RESENT_PREFIX)
_RESENT_BYTES = RESENT_PREFIX.encode()
TIMER_TOPIC = "%TIMER%"  # metaq.timers.records.TIMER_TOPIC (that module imports limits; this one stays bare)
_TIMER_BYTES = TIMER_TOPIC.encode()
TX_TOPIC = "%TX%"  # the transaction journal (metaq.transactions.follow)
_TX_BYTES = TX_TOPIC.encode()
POP_TOPIC = "%POP%"  # the per-message acknowledgements' journal (metaq.pop.follow)
_POP_BYTES = POP_TOPIC.encode()
MQTT_SESSIONS_TOPIC = "%MQTT%"  # the MQTT persistent sessions' and retained messages' records (metaq.mqtt.follow)
_MQTT_BYTES = MQTT_SESSIONS_TOPIC.encode()
#: The MQTT cluster's inbox: the copies of the peer brokers' messages this broker's sessions subscribe
#: (metaq.mqttcluster.following.inbox); a client's put to it would hand devices messages no peer published.
MQTT_INBOX_TOPIC = "%MQTTIN%"
#: The delay scheduler's internal topic (RocketMQ's name; one partition per delay level, ``metaq.timers.levels``):
#: not a journal, but the broker's own, and the topic table's names refuse it like the journals' (``topics.names``).
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: The topic RocketMQ clients send their message traces to by default (``TopicValidator.RMQ_SYS_TRACE_TOPIC``;
#: ``metaq.trace.records`` reads its bodies): a client's topic, which the topic table's names know (``topics.names``).
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
_INBOX_BYTES = MQTT_INBOX_TOPIC.encode()


def is_journal(topic):
    """True for a resent journal's name, the timer topic, the transaction journal, the POP journal or the MQTT
    sessions' log (``str`` or ``bytes``, as the fast put paths hold it)."""
    if isinstance(topic, (bytes, bytearray, memoryview)):
        topic = bytes(topic)
        return topic[:len(_RESENT_BYTES)] == _RESENT_BYTES or topic == _TIMER_BYTES or topic == _TX_BYTES or \
            topic == _POP_BYTES or topic == _MQTT_BYTES or topic == _INBOX_BYTES
    return topic.startswith(RESENT_PREFIX) or topic in (TIMER_TOPIC, TX_TOPIC, POP_TOPIC, MQTT_SESSIONS_TOPIC,
                                                        MQTT_INBOX_TOPIC)


def journal_refusal(topic):
    if topic in (MQTT_INBOX_TOPIC, _INBOX_BYTES):
        return ("%s is the broker's internal topic for the MQTT cluster: its records are copied from the peer brokers"
                % MQTT_INBOX_TOPIC)
    if topic in (MQTT_SESSIONS_TOPIC, _MQTT_BYTES):
        return ("%s is the broker's internal topic for MQTT sessions: its records are written by the MQTT port"
                % MQTT_SESSIONS_TOPIC)
    if topic in (POP_TOPIC, _POP_BYTES):
        return "%s is the broker's internal topic for per-message acknowledgements: use receive and ack" % POP_TOPIC
    if topic in (TX_TOPIC, _TX_BYTES):
        return "%s is the broker's internal topic for the transaction journal: use the transaction command" % TX_TOPIC
    if topic in (TIMER_TOPIC, _TIMER_BYTES):
        return ("%s is the broker's internal topic for timers: put to your topic with put_at "
                "<topic> <partition> <len> <flag> <checksum> @<epoch ms>|+<delay ms> <opaque> instead" % TIMER_TOPIC)
    return ("%s is a broker's internal topic: the resent journal of a consumer group's dead letters "
            "(metaq-admin dlq resend writes it)" % topic)
