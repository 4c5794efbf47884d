"""What a resumed MQTT session sends before its subscriptions read on (docs/mqtt.md "Persistent sessions"): its
messages in flight again (``resend``, MQTT 5.0 §4.4), then the messages it brought from another broker of the
cluster (``send_carried``), each found again in the log by where it is (``message_at``).
"""

from metaq import errors
from metaq.mqtt import wire
from metaq.mqtt.follow import RecordError, decode_carried
from metaq.mqtt.records import message_of
from metaq.mqtt.session import PUBREL_SENT
from metaq.protocol.journaltopic import MQTT_SESSIONS_TOPIC


def resend(out):
    """The messages in flight of ``out``'s session (an ``outbound.Outbound``) go out again: a PUBLISH not
    acknowledged is sent again with DUP set, from the log; one whose PUBREC came gets its PUBREL again."""
    conn, session = out.conn, out.session
    v5 = conn.version == wire.MQTT_5
    for pid, state in list(session.inflight.items()):
        if state == PUBREL_SENT:
            conn.send(wire.PubRel(pid))
            continue
        where = session.where.get(pid)
        found = message_at(out.store, *where[1:], out.max_transfer) if where is not None else None
        if found is None:
            session.dropped(pid)  # its message is gone from the log (retention): nothing to send again
            continue
        qos, (topic, flag, data) = where[0], found
        m = message_of(topic, flag, data, out.port.topics)
        props = m.properties
        ids = session.matching(topic, m.topic, m.client_id)[1]
        if ids:
            props = dict(props, subscription_identifier=tuple(ids))
        conn.send_bytes(wire.encode(wire.Publish(m.topic, m.payload, qos, False, True, pid,
                                                 props if v5 else {}), conn.version))


def message_at(store, topic, partition, offset, max_transfer):
    """``(metaq topic, flag, data)`` of the message at ``offset`` of ``topic``'s ``partition``, or None when the log
    holds it no more: a record of its topic, or one a session carried from another broker (a ``%MQTT%`` record,
    ``follow``'s ``encode_carried``), which is the message of the topic it names. A session's messages in flight are
    found again so, here and when it moves to another broker (``mqttcluster.clientids.handover``)."""
    try:
        records, _next = store.read_records(topic, partition, offset, 1, max_transfer)
    except errors.MetaqError:
        return None
    if not records or records[0].queue_offset != offset:
        return None
    rec = records[0]
    if topic != MQTT_SESSIONS_TOPIC:
        return topic, rec.flag, rec.data
    try:
        return decode_carried(rec.data)
    except RecordError:
        return None


def send_carried(out):
    """Send the messages ``out``'s session brought from another broker (``MqttSession.carried``), in order, after
    those in flight and before what its subscriptions read: each at its QoS then, a QoS 1 or 2 one in flight under
    its place in ``%MQTT%`` (so it is sent again from there). False when the connection closed."""
    session = out.session
    while session.carried:
        qos, offset = session.carried[0]
        found = message_at(out.store, MQTT_SESSIONS_TOPIC, 0, offset, out.max_transfer)
        if found is None:
            session.carried.pop(0)  # gone from the log (retention), as a queued message would be
            session.dirty = True
            continue
        topic, flag, data = found
        sent = out.send(MQTT_SESSIONS_TOPIC, (0, offset), flag, data, qos, False, message_of(topic, flag, data),
                        carried=(qos, offset))  # one in flight leaves ``carried`` as it goes in flight: never both
        if not sent:
            return False
        if session.carried[:1] == [(qos, offset)]:  # sent at QoS 0, or dropped (too large, not allowed)
            session.carried.pop(0)
            session.dirty = True
    return True
