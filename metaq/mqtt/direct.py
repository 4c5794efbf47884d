"""Sending from a publisher's turn (docs/mqtt.md "Subscribing"): while a delivery's greenlet waits between passes,
a publisher's burst, once visible, has it send what the burst brought at once (``deliver_now``, called through
``WaitingDeliveries.serve``, the port's): non-blocking writes only, the QoS 1 window respected, each
message decided and encoded as the greenlet would (``outbound.Outbound``). What it cannot send so is left to the
greenlet, which the append woke as before. An MQTT cluster's copies of its peers' messages are served alike from
the turn that writes them to the inbox (``serve_copies``, through ``MqttPort.serve_copies``). A run of plain QoS 1
messages goes out in one step
(``direct_publishes``): their packet ids, their place in flight, their PUBLISHes and one write.

This module is compiled with Cython where it is built (``metaq.native``): the publisher's turn runs it for every
waiting subscriber of a burst; the bytes are made and written by the C helper (``wire.publish_bytes``,
``fanout.send_each``).
"""

from metaq import errors
from metaq.mqtt import limits as mqtt_limits
from metaq.mqtt.fanout import send_each
from metaq.mqtt.outbound import DROPPED, HELD
from metaq.mqtt.records import stored_message
from metaq.mqtt.session import PUBLISH_SENT
from metaq.mqtt.wire import MQTT_5, publish_bytes
from metaq.store.record import FIXED_OVERHEAD

#: ``direct_publishes``' states: every record up to ``stop`` went whole; it stopped before a record that is not one
#: it takes (``deliver_now`` decides that one by the general path); the write took less than all, or the window in
#: flight is full at a record it takes (the rest is the greenlet's).
DONE, DECIDE, SHORT = 0, 1, 2


class WaitingDeliveries:
    """The deliveries waiting on partitions now, served from a publisher's turn (``serve``). ``waiting``: ``{key:
    {Delivery: None}}``, where each delivery's greenlet lists itself while it waits with nothing of its own to send
    first (``Delivery._wait``); ``readers`` (the fan-out readers' partitions) and ``keep_decoded`` as
    ``serve_waiting`` takes them; at most ``most`` deliveries served a burst. The port holds one, and its ``serve`` is
    what the put path's wake runs first (``burst_written``'s ``deliver``): compiled where built, so no step between
    the publisher's turn and the subscribers' writes runs in the interpreter. ``follows``: what then serves the
    cluster's peers following this broker from the same turn (the seam's ``serve_follows``), set once the port has
    its seam; None: nothing."""

    __slots__ = ("waiting", "readers", "keep_decoded", "most", "follows")

    def __init__(self, waiting, readers, keep_decoded, most):
        self.waiting = waiting
        self.readers = readers
        self.keep_decoded = keep_decoded
        self.most = most
        self.follows = None

    def serve(self, keys, staged, runs, client_id, now):
        """``serve_waiting`` of the deliveries waiting now, the general path's step ``deliver_now``, for a burst just
        appended to partitions ``keys`` and made visible (``staged`` and ``runs``: ``MqttPort.write_burst``'s;
        published by ``client_id`` at ``now``), then ``follows`` (the peers' follows waiting on it). Returns ``{key:
        events}``, the waits the append's wake passes over."""
        caught_up = serve_waiting(self.waiting, self.readers, self.keep_decoded, deliver_now, self.most, keys, staged,
                                  runs, client_id, now)
        follows = self.follows
        if follows is not None:
            follows(keys, staged, runs, now, caught_up)
        return caught_up


def serve_waiting(waiting, readers, keep_decoded, deliver, most, keys, staged, runs, client_id, now):
    """A burst just appended to partitions ``keys`` and made visible (``staged`` and ``runs``: ``MqttPort
    .write_burst``'s; published by ``client_id`` at ``now``): the deliveries in ``waiting`` (``{key: {Delivery:
    None}}``, each one's greenlet waiting between passes with nothing of its own to send first) send what it
    brought, at most ``most`` of them: each one's ``path`` (``DirectPath.send``: plain QoS 1 runs in one call), and when
    that does not decide, ``deliver`` (``deliver_now``) from the cursor it left, given ``made`` (the partition's
    ``staged_messages``, made once when one needs them). A partition that a waiting delivery was not served or left
    caught up on, or that a fan-out reader reads (``readers``), has its messages kept decoded for them
    (``keep_decoded(key, kruns, staged, client_id, now, made)``). Returns ``{key: events}``: the waits
    (``Delivery.event``) of the deliveries it left caught up on ``key``, which the append's wake passes over."""
    caught_up = {}
    if not waiting:
        return caught_up
    left = most
    found = None
    made = {}
    for key in keys:
        ds = waiting.get(key)
        if not ds:
            continue
        if found is None:  # {key: [BurstRun, ...]} of the partitions some delivery waits on, in log order
            found = {}
            for run in runs:
                if run.key in waiting:
                    found.setdefault(run.key, []).append(run)
        kruns = found.get(key)
        if kruns is None:
            continue
        served = 0
        for d in list(ds):  # (a path may take its delivery out of ``waiting``)
            if left <= 0:
                break
            left -= 1
            path = d.path
            went = path.send(key, kruns, staged, client_id)
            if went is None:
                went = deliver(d.out, key, kruns, staged, client_id, now, made)
            if went:
                caught_up.setdefault(key, set()).add(d.event)
                served += 1
        if served < len(ds) or key in readers:
            keep_decoded(key, kruns, staged, client_id, now, made)
    return caught_up


def deliver_now(out, key, runs, staged, client_id, now, made):
    """Send what partition ``key`` holds past the cursor of ``out``'s session (an ``Outbound``), each record as the
    greenlet decides it (``Outbound.decision``, ``Outbound.prepare``: filters, No Local, Retain As Published,
    Subscription Identifiers, Message Expiry, the Maximum Packet Size, the window in flight), but only while that
    needs no wait: the connection takes each PUBLISH whole at once (``try_send``, which first writes what an earlier
    write left of its packet, or takes nothing; a part taken is finished by the delivery's greenlet, which the append
    woke, before anything else), a QoS 1 one has room in flight. It stops,
    leaving the rest to the greenlet, at anything else (a QoS 2 message: its greenlet's); it does nothing on a TLS
    connection or for a paced user (``Outbound.plain_names``). ``runs``: the publisher's burst's ``BurstRun``s of
    this partition, in order, of ``staged`` (``MqttPort.write_burst``'s entries, published by ``client_id`` at
    ``now``); from their first record on they are sent from it, nothing read from the log (a cursor behind it reads
    the log as the greenlet would). ``made``: ``{key: staged_messages(...)}``, the messages made for the general path,
    shared by the partition's deliveries and the port. Order is the cursor's, as the greenlet's. True when it sent
    everything and left the cursor at the partition's end, the last run's (nothing yielded since the append: no
    other writer came after it): the greenlet has nothing to do there (not so when a shared group of the session
    reads the partition too: the group's copy is the greenlet's).

    The caller (``MqttPort.deliver_now``) calls it only for a delivery whose greenlet waits with nothing of its own
    to send first (``Delivery._wait``). A run of plain QoS 1 messages (no properties; a name ``plain_names`` holds)
    to a connection without outbound topic aliases that may be written by descriptor now (``Connection.fan_fd``)
    goes out in one step (``direct_publishes``); a record it does not take goes through the general path in its
    place (``_one``: ``_plain``, ``_send``, exactly as before) and the one step goes on after it; on a connection
    that may not be written so, every record goes that way."""
    conn, session = out.conn, out.session
    if conn.closed or conn.tls:
        return False
    cursors = session.cursors
    offset = cursors.get(key)
    if offset is None:
        return False
    topic = key[0]
    names = out.plain_names(topic, (client_id or None) == session.client_id)
    if names is None:
        return False  # a paced user's bytes wait in its own greenlet
    first = runs[0].first_offset
    end = runs[-1].first_offset + runs[-1].count
    plain = conn.outbound_aliases is None
    if offset < first:
        if not _behind(out, key, offset, plain):
            return False
    elif offset < end:
        fd = conn.fan_fd() if plain else None
        records = None
        for run in runs:
            start, count, entry = run.first_offset, run.count, run.first_frame
            stop = start + count
            while offset < stop:
                if fd is not None:
                    went, state, rest, err = direct_publishes(
                        fd, staged, entry + offset - start, entry + count, names, session, topic, key[1], offset,
                        conn.inflight_window, conn.version == MQTT_5, conn.client_max_packet)
                    offset += went
                    cursors[key] = offset
                    if state == DONE:
                        break
                    if state == SHORT:
                        return _short(conn, rest, err)
                # DECIDE (or a connection not written by descriptor): this record by the general path
                if records is None:
                    records = _made(made, key, staged, runs, client_id, now)
                queue_offset, dkey, m = records[offset - first]
                if not _one(out, key, queue_offset, dkey, m, plain):
                    return False
                offset += 1
    if session.shared and any(key in group.cursors for group, _granted, _id in session.shared.values()):
        return False
    return cursors[key] >= end


def serve_copies(waiting, decoded, most, copies):
    """The MQTT cluster's copies of its peers' messages just appended to the inbox and made visible, from the turn
    that wrote them (``MqttPort.serve_copies``): ``copies`` ``{inbox partition: [(queue offset, key in Decoded,
    metaq topic, flag, data, message), ...]}`` in log order, each ``(topic, flag, data)`` a record whose message
    (``records.message_of``) is the copy's, ``message`` that message when the cluster made it already (None: decoded
    here). The deliveries of ``waiting`` on those partitions (``MqttPort.waiting``),
    at most ``most`` of them, send what the copies bring from their cursors (``deliver_copies``). The copies of a
    partition some delivery waits on are decoded once, into ``decoded`` (``Decoded.message``), where a delivery that
    reads them back from the log after finds them. Returns ``({key: events}, copies served)``: the waits of the
    deliveries it left at the partition's end, which the append's wake passes over, and how far it moved the
    cursors."""
    caught_up = {}
    served = 0
    if not waiting:
        return caught_up, served
    left = most
    message = decoded.message
    for key, found in copies.items():
        ds = waiting.get(key)
        if not ds:
            continue
        records = [(offset, dkey, message(dkey, topic, flag, data, m)) for offset, dkey, topic, flag, data, m in found]
        for d in list(ds):
            if left <= 0:
                return caught_up, served
            left -= 1
            cursors = d.out.session.cursors
            before = cursors.get(key)
            if deliver_copies(d.out, key, records):
                caught_up.setdefault(key, set()).add(d.event)
            if before is not None:
                served += cursors.get(key, before) - before
    return caught_up, served


def deliver_copies(out, key, records):
    """Send inbox partition ``key``'s copies ``records`` (``[(queue offset, key in Decoded, MqttMessage)]``, in log
    order, just written) to ``out``'s session from its cursor, each as the greenlet decides it (``_one``: the
    session's filters, the copy's own permission, the window in flight, a write that never waits), while the cursor
    meets them one after the other. It stops, leaving the rest to the greenlet, at a record between them (a marker),
    at one not sent now (held, or not taken whole) and at a cursor behind them; it does nothing on a TLS connection
    or for a paced user (``Outbound.sendable``), as ``deliver_now``. True when it left the cursor at the partition's
    end and no shared group of the session reads the partition (the group's copy is the greenlet's)."""
    conn, session = out.conn, out.session
    if conn.closed or conn.tls:
        return False
    cursors = session.cursors
    offset = cursors.get(key)
    if offset is None or not out.sendable(key[0]):
        return False
    plain = conn.outbound_aliases is None
    for queue_offset, dkey, m in records:
        if queue_offset < offset:
            continue
        if queue_offset != offset or not _one(out, key, queue_offset, dkey, m, plain):
            return False
        offset += 1
    if session.shared and any(key in group.cursors for group, _granted, _id in session.shared.values()):
        return False
    return cursors[key] >= out.store.max_offset(*key)


class DirectPath:
    """A waiting subscriber's share of a publisher's burst in one call, the common case of ``deliver_now`` kept per
    subscriber (``Delivery.path``, made once its CONNECT fixed the connection's version, Maximum Packet Size, topic
    aliases and TLS): ``send(key, runs, staged, client_id)`` sends the plain QoS 1 runs of partition ``key`` from the
    cursor on in one step each (``direct_publishes``) and answers as ``deliver_now`` does: True (all went, the cursor
    at the partition's end), False (a write took less than all, or the window is full: the greenlet's; what it
    left is handled as ``_short`` handles it). None whenever the general path is to decide, from the cursor as it is
    left: the connection is closed, TLS, has outbound topic aliases or may not be written by descriptor now
    (``Connection.direct_fd``, ``fan_fd``'s answer kept as it changes); the cursor is behind the burst, past it or
    unknown; the topic is not ``sendable``; a record is not one ``direct_publishes`` takes; the session is in a
    shared group. The plain names it passes are those ``Outbound.plain_names`` answered, kept (one topic and
    publisher at a time) while the stamp ``plain_names`` keeps them by stands (the put path's version, the user, the
    subscriptions' changes), and dropped when the outbound drops its own (``drop``)."""

    __slots__ = ("out", "conn", "session", "put_path", "client_id", "cursors", "usable", "v5", "max_packet",
                 "kept_names", "kept_topic", "kept_own", "kept_version", "kept_user", "kept_changes")

    def __init__(self, out):
        conn = self.conn = out.conn
        self.out = out
        self.session = out.session
        self.put_path = out.port.put_path
        self.client_id = out.session.client_id
        self.cursors = out.session.cursors  # (the session's, never replaced)
        self.usable = not conn.tls and conn.outbound_aliases is None
        self.v5 = conn.version == MQTT_5
        self.max_packet = conn.client_max_packet
        self.kept_names = None  # kept for (kept_topic, kept_own) at the stamp (kept_version, kept_user, kept_changes)
        self.kept_topic = self.kept_version = self.kept_user = self.kept_changes = None
        self.kept_own = False

    def drop(self):
        """Forget the plain names kept (the outbound dropped its own)."""
        self.kept_names = self.kept_topic = self.kept_version = self.kept_user = self.kept_changes = None

    def _names(self, topic, own):
        version, user, changes = self.put_path.version, self.conn.session.user, self.session.changes
        if self.kept_names is not None and self.kept_own == own and self.kept_topic == topic \
                and self.kept_version == version and self.kept_user == user and self.kept_changes == changes:
            return self.kept_names
        self.drop()
        names = self.out.plain_names(topic, own)
        if names is None:
            return None
        self.kept_names, self.kept_topic, self.kept_own = names, topic, own
        # (the stamp read again: plain_names made its own current; nothing yields in it)
        self.kept_version, self.kept_user = self.put_path.version, self.conn.session.user
        self.kept_changes = self.session.changes
        return names

    def send(self, key, runs, staged, client_id):
        conn = self.conn
        if not self.usable or conn.closed:
            return None
        fd = conn.direct_fd
        if fd < 0:
            return None
        session = self.session
        cursors = self.cursors
        offset = cursors.get(key)
        if offset is None:
            return None
        first = runs[0].first_offset
        end = runs[-1].first_offset + runs[-1].count
        if offset < first or offset >= end:
            return None
        topic = key[0]
        names = self._names(topic, (client_id or None) == self.client_id)
        if names is None:
            return None
        window = conn.inflight_window
        for run in runs:
            start, count, entry = run.first_offset, run.count, run.first_frame
            if offset >= start + count:
                continue
            went, state, rest, err = direct_publishes(
                fd, staged, entry + offset - start, entry + count, names, session, topic, key[1], offset, window,
                self.v5, self.max_packet)
            offset += went
            cursors[key] = offset
            if state == DONE:
                continue
            if state == SHORT:
                return _short(conn, rest, err)
            return None  # DECIDE: the general path takes that record, from the cursor
        return None if session.shared else True


def _behind(out, key, offset, plain):
    """Send from the log what partition ``key`` holds from ``offset``, a cursor behind the burst (``_records``, each
    record by ``_one``); True when all it read went."""
    records = _records(out, key, offset)
    if records is None:
        return False
    for queue_offset, dkey, m in records:
        if not _one(out, key, queue_offset, dkey, m, plain):
            return False
    return True


def _short(conn, rest, err):
    """What ``direct_publishes`` left when its write took less than all: the rest of the PUBLISH it began is the
    connection's to write before anything else (``Connection.keep_unsent``); a failed send closes it
    (``Connection.send_failed``). False: the rest is the greenlet's."""
    if rest is not None:
        conn.keep_unsent(rest)
    elif err:
        conn.send_failed(err)
    return False


def _made(made, key, staged, runs, client_id, now):
    """``staged_messages`` of partition ``key``'s ``runs``, made once per burst (``made``)."""
    records = made.get(key)
    if records is None:
        records = made[key] = staged_messages(staged, runs, client_id, now)
    return records


def _one(out, key, queue_offset, dkey, m, plain):
    """Send record ``queue_offset`` of partition ``key`` (message ``m``, ``dkey`` in Decoded) by the general path,
    as the greenlet decides it (``Outbound.decision``; ``plain``: the connection has no outbound topic aliases): not
    matched, passed over; a QoS 1 one without properties, expiry or Subscription Identifiers by ``_plain``; any
    other by ``_send``. True when the cursor moved past it."""
    granted, ids, retain = out.decision(key[0], m)
    if granted is None:
        pass
    elif plain and (granted == 1 and m.qos or m.qos == 1 and granted) and not ids and not m.properties \
            and m.expires_ms is None:  # at QoS 1, min(granted, its QoS)
        if not _plain(out.conn, out.session, key, queue_offset, m, retain):
            return False
    elif not _send(out, key, queue_offset, dkey, m, granted, ids, retain):
        return False
    out.session.cursors[key] = queue_offset + 1
    out.session.dirty = True
    return True


def staged_messages(staged, runs, client_id, now):
    """``[(queue offset, key in Decoded, MqttMessage)]`` of the records of ``runs`` (a partition's ``BurstRun``s of
    the burst ``staged``, published by ``client_id`` at ``now``), each message as ``records.stored_message`` makes it
    and its place in the log from its run's: a run's records lie one after the other in the log, ending at its log
    end."""
    out = []
    for _key, count, nbytes, first_id, first_offset, first, end in runs:
        overhead = FIXED_OVERHEAD + len(_key[0])  # metaq topic names are ASCII
        position = end - nbytes - count * overhead
        for k in range(count):
            entry = staged[first + k]  # (topic, partition, flag, data, Publish, MQTT topic name)
            p = entry[4]
            out.append((first_offset + k, (position, first_id + k),
                        stored_message(entry[5], p.payload, p.qos, client_id, p.properties, False, now)))
            position += overhead + len(entry[3])
    return out


def _records(out, key, offset):
    """``(queue offset, key in Decoded, MqttMessage)`` of partition ``key`` from ``offset``, read from the log, each
    decoded as it is reached; None when the log cannot be read (the greenlet meets it and says why)."""
    topic, partition = key
    try:
        read, _next = out.store.read_records(topic, partition, offset, mqtt_limits.MQTT_DELIVERY_BATCH,
                                             out.max_transfer)
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


def direct_publishes(fd, staged, i, stop, names, session, topic, partition, offset, window, v5, max_packet):
    """A run of plain QoS 1 messages of a publisher's burst written to a waiting subscriber in one step:
    ``staged[i:stop]`` (``MqttPort.write_burst``'s entries, ``(topic, partition, flag, data, Publish, name)``, the
    first at queue offset ``offset`` of partition ``(topic, partition)``), from the first while each is one it takes:
    its PUBLISH at QoS 1 (``Publish.qos`` 1) without properties, its name in ``names`` (``Outbound.plain_names``),
    and room in flight (fewer than ``window`` in ``session.inflight``). Each is given a packet id by the session's
    rule (``MqttSession.next_packet_id``: the first after ``last_id`` not in flight) and recorded in flight as
    ``MqttSession.sent_next`` records it (``inflight``, ``where``: ``(1, topic, partition, its offset)``); its PUBLISH
    is ``wire.publish_bytes``'s (RETAIN 0; MQTT 5 when ``v5``: an empty property block). One past ``max_packet``
    (None: no bound) is not sent, as if delivered, its id given back (``MqttSession.dropped``). Their PUBLISHes are
    written together by one non-blocking ``send`` on socket descriptor ``fd`` (``Connection.fan_fd``: nothing of an
    earlier packet unsent, no writer inside one). Those the write did not take whole are as if never begun, as the
    one-at-a-time send leaves them (``direct._plain``): their ids given back and ``last_id`` the id of the first of
    them; the one begun stays in flight and its unsent bytes are returned for the connection to write first.

    Returns ``(went, state, rest, err)``: ``went`` the records the cursor moves past (sent, begun, or dropped as too
    large); ``state`` ``DONE`` (all of ``staged[i:stop]`` went), ``DECIDE`` (``staged[i + went]`` is not one it
    takes: for the general path) or ``SHORT`` (the write took less than all, or the window is full at a record it
    takes: the rest is the greenlet's); ``rest`` the unsent bytes of the PUBLISH begun (None when none was);
    ``err`` the errno of a failed send (0: none; nothing of it then went). ``session.dirty`` is set when an id was
    taken."""
    prop = b"\x00" if v5 else None
    inflight = session.inflight
    room = window - len(inflight)
    last = session.last_id
    ids, chunks = [], []  # what it takes, decided and made before anything changes
    total = 0
    state = DONE
    for k in range(i, stop):
        entry = staged[k]
        p, name = entry[4], entry[5]
        if p.qos != 1 or p.properties or name not in names:
            state = DECIDE
            break
        if room <= 0:
            publish_bytes(0x32, name, 1, prop, p.payload)  # (one it could not encode says so first)
            state = SHORT
            break
        packet_id = last % 65535 + 1
        while packet_id in inflight:  # (room left: one is free)
            packet_id = packet_id % 65535 + 1
        data = publish_bytes(0x32, name, packet_id, prop, p.payload)
        last = packet_id
        ids.append(packet_id)
        if max_packet is not None and len(data) > max_packet:
            chunks.append(b"")  # not sent, as if delivered: its id is not recorded in flight
            continue
        room -= 1
        chunks.append(data)
        total += len(data)
    taken = len(ids)
    if not taken:
        return 0, state, None, 0
    where = session.where
    for j in range(taken):
        if chunks[j]:
            inflight[ids[j]] = PUBLISH_SENT
            where[ids[j]] = (1, topic, partition, offset + j)
    session.last_id = last
    session.dirty = True
    n, err = send_now(fd, chunks[0] if taken == 1 else b"".join(chunks)) if total else (0, 0)
    if n == total:
        return taken, state, None, err
    went, pos, rest = 0, 0, None
    for chunk in chunks:
        after = pos + len(chunk)
        if after <= n:
            went += 1
            pos = after
            continue
        if pos < n:  # begun: in flight, the cursor past it, its rest the connection's
            rest = chunk[n - pos:]
            went += 1
        break
    session.last_id = ids[went - (rest is not None)]  # the first not written whole
    for packet_id in ids[went:]:
        if inflight.pop(packet_id, None) is not None:
            where.pop(packet_id, None)
    return went, SHORT, rest, err


def send_now(fd, data):
    """``(bytes taken, errno)`` of one non-blocking send of ``data`` on socket descriptor ``fd`` (nothing when
    ``data`` is empty; 0 taken when its buffer is full): a write by descriptor (here and ``plainturn.pubacks_now``),
    ``fanout.send_each``'s to one socket."""
    if not data:
        return 0, 0
    short = send_each((data,), (fd,))
    if not short:
        return len(data), 0
    n = short[0][1]
    return (0, -n) if n < 0 else (n, 0)
