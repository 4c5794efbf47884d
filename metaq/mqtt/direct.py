"""Sending from a publisher's turn (docs/mqtt.md "Subscribing"): while a delivery's greenlet waits between passes,
a publisher's burst, once visible, has it send what the burst brought at once (``deliver_now``, called through
``MqttPort.deliver_now``): non-blocking writes only, the QoS 1 window respected, each
message decided and encoded as the greenlet would (``outbound.Outbound``). What it cannot send so is left to the
greenlet, which the append woke as before.
"""

from metaq import errors, limits
from metaq.mqtt.outbound import DROPPED, HELD
from metaq.mqtt.wire import MQTT_5, publish_bytes


def deliver_now(out, key, staged=None):
    """Send what partition ``key`` holds past the cursor of ``out``'s session (an ``Outbound``), each record as the
    greenlet decides it (``Outbound.decision``, ``Outbound.prepare``: filters, No Local, Retain As Published,
    Subscription Identifiers, Message Expiry, the Maximum Packet Size, the window in flight), but only while that
    needs no wait: the connection takes each PUBLISH whole at once (``try_send``, which first writes what an earlier
    write left of its packet, or takes nothing; a part taken is finished by the delivery's greenlet, which the append
    woke, before anything else), a QoS 1 one has room in flight. It stops,
    leaving the rest to the greenlet, at anything else (a QoS 2 message: its greenlet's); it does nothing on a TLS
    connection or for a paced user. ``staged``: the publisher's burst in this partition, ``[(queue offset, key in
    Decoded, MqttMessage)]``: from its first record on they are sent from it, nothing read from the log (a cursor
    behind it reads the log as the greenlet would). Order is the cursor's, as the greenlet's. True when it sent
    everything and left the cursor at the partition's end: the greenlet has nothing to do there (not so when a shared
    group of the session reads the partition too: the group's copy is the greenlet's).

    The caller (``MqttPort.deliver_now``) calls it only for a delivery whose greenlet waits with nothing of its own
    to send first (``Delivery._wait``). A QoS 1 PUBLISH of a message without properties, expiry or Subscription
    Identifiers to a connection without outbound topic aliases goes out in one step (``_plain``); every other one
    through ``_send``."""
    conn, session = out.conn, out.session
    if conn.closed or conn.tls:
        return False
    cursors = session.cursors
    offset = cursors.get(key)
    topic = key[0]
    if offset is None or not out.sendable(topic):
        return False  # a paced user's bytes wait in its own greenlet
    if staged and offset >= staged[0][0]:  # a partition's offsets in one burst follow one another
        records = staged[offset - staged[0][0]:] if offset > staged[0][0] else staged
    else:
        records = _records(out, key, offset)
        if records is None:
            return False
    decision = out.decision
    plain = conn.outbound_aliases is None
    for queue_offset, dkey, m in records:
        granted, ids, retain = decision(topic, m)
        if granted is None:
            pass
        elif plain and (granted == 1 and m.qos or m.qos == 1 and granted) and not ids and not m.properties \
                and m.expires_ms is None:  # at QoS 1, min(granted, its QoS)
            if not _plain(conn, session, key, queue_offset, m, retain):
                return False
        elif not _send(out, key, queue_offset, dkey, m, granted, ids, retain):
            return False
        cursors[key] = queue_offset + 1
        session.dirty = True
    if session.shared and any(key in group.cursors for group, _granted, _id in session.shared.values()):
        return False
    try:
        return cursors[key] >= out.store.max_offset(*key)
    except errors.MetaqError:
        return False


def _records(out, key, offset):
    """``(queue offset, key in Decoded, MqttMessage)`` of partition ``key`` from ``offset``, read from the log, each
    decoded as it is reached; None when the log cannot be read (the greenlet meets it and says why)."""
    topic, partition = key
    try:
        read, _next = out.store.read_records(topic, partition, offset, limits.MQTT_DELIVERY_BATCH, out.max_transfer)
    except errors.MetaqError:
        return None
    return _decoded(out.decoded, topic, read)


def _decoded(decoded, topic, records):
    """``(queue offset, key in Decoded, MqttMessage)`` of each of ``records`` (of metaq topic ``topic``), each
    decoded as it is reached."""
    message = decoded.message
    for rec in records:
        dkey = (rec.position, rec.msg_id)
        yield rec.queue_offset, dkey, message(dkey, topic, rec.flag, rec.data)


def _plain(conn, session, key, queue_offset, m, retain):
    """``_send`` of a QoS 1 PUBLISH of message ``m`` (no properties, expiry or Subscription Identifiers) to ``conn``
    (no outbound topic aliases), in one step: made as ``Outbound.prepare`` makes it (the window in flight, the packet
    id recorded in flight at once by ``MqttSession.sent_next`` and given back when nothing of it is written, the bytes
    of ``outbound.encode_publish``, the client's Maximum Packet Size) and written at once (``try_send``)."""
    if len(session.inflight) >= conn.inflight_window:
        return False  # no room in flight: the greenlet waits for it (``Outbound.prepare``'s HELD)
    packet_id = session.sent_next((1, key[0], key[1], queue_offset))
    if packet_id is None:
        return False
    data = publish_bytes(0x32 | retain, m.topic, packet_id, b"\x00" if conn.version == MQTT_5 else None, m.payload)
    size = len(data)
    most = conn.client_max_packet
    if most is not None and size > most:
        session.dropped(packet_id)  # past the client's Maximum Packet Size: not sent, as if delivered
        return True
    sent = conn.try_send(data)
    if not sent:
        session.dropped(packet_id)  # nothing of it went: the greenlet sends it
        return False
    if sent < size:  # the connection writes the rest before anything else
        session.cursors[key] = queue_offset + 1
        session.dirty = True
        return False
    return True


def _send(out, key, queue_offset, dkey, m, granted, ids, retain):
    """Send record ``queue_offset`` of partition ``key`` (message ``m``, ``dkey`` in Decoded) now if it needs no
    wait; True when the cursor moves past it (sent whole, or dropped as if delivered), False when it stops here (held,
    not taken, or begun: the connection writes the rest and the cursor is already past it)."""
    conn = out.conn
    prepared = out.prepare(m, granted, retain, ids, dkey, False)
    if prepared is HELD:
        return False
    if prepared is DROPPED:
        return True
    data, qos, packet_id, shared = prepared
    aliases = conn.outbound_aliases
    if aliases is not None:
        mark = aliases.mark()
        data = out.with_alias(aliases, data, m.topic, shared)
    sent = conn.try_send(data)
    if aliases is not None:
        if not sent:
            aliases.undo(mark)
        aliases.settle()
    if not sent:
        return False
    if qos:
        out.session.sent(packet_id, (qos, key[0], key[1], queue_offset))
    if sent < len(data):  # the connection writes the rest before anything else
        out.session.cursors[key] = queue_offset + 1
        out.session.dirty = True
        return False
    return True
