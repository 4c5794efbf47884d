"""An MQTT client's CONNECT: its client id, its login, its will, its Keep Alive, its session (new, resumed or taken
over from another connection), and the CONNACK that says what the broker allows (docs/mqtt.md).

The client id's rules (empty: MQTT 5 gets one assigned; too long or holding a control character: 0x85 / 0x02), the
user name and password through the guard (``Guard.login_with_secret``, the decision HTTP Basic takes too; refused:
0x86 / 0x04, then closed), the takeover of a client id (``MqttPort.claim``); CONNACK says what the broker allows
(Receive Maximum, Maximum Packet Size, Topic Alias Maximum; retained messages, shared subscriptions and subscription
identifiers are served, enhanced authentication is not); the client's own Topic Alias Maximum gives the connection
its table of aliases the broker sends (``topics.OutboundAliases``, within ``mqtt.max_outbound_aliases``); a Keep
Alive past ``mqtt.max_keep_alive_s`` (or none) is answered Server Keep Alive (MQTT 5) or refused 0x02 (MQTT 3.1.1).
A slave refuses a CONNECT that needs a persistent session (one that outlives the connection, or resumes one): it
writes no session records, so the session would be lost; MQTT 5 gets 0x9C Use another server with the master's
address as Server Reference when it is known, MQTT 3.1.1 0x03 Server unavailable. A master that may write nothing
for want of a member to confirm it (``sync``, no in-sync member: ``MqttPort.unavailable``) refuses every CONNECT:
MQTT 5 0x88 Server unavailable, 3.1.1 0x03. Both are asked again after the CONNECT's waits (the cluster, a
takeover), before the CONNACK. A will that cannot be recorded (a full disk) refuses the CONNECT (0x88 / 0x03): a
will the log does not hold would be lost with this broker.
"""

import logging

from metaq import errors
from metaq.mqtt import wire
from metaq.mqtt.publishes import MAX_REASON_CHARS
from metaq.mqtt.records import RecordRefusal, placement
from metaq.mqtt.session import MqttSession
from metaq.mqtt.topics import OutboundAliases
from metaq.mqtt.wire import MQTT_5

log = logging.getLogger(__name__)

#: MQTT 3.1.1's CONNACK return code for an MQTT 5 CONNACK reason code (the others have none: closed without one).
CONNACK_311 = {wire.CLIENT_ID_NOT_VALID: 0x02, wire.BAD_USER_NAME_OR_PASSWORD: 0x04, wire.NOT_AUTHORIZED: 0x05,
               wire.SERVER_UNAVAILABLE: 0x03, wire.QUOTA_EXCEEDED: 0x03, wire.USE_ANOTHER_SERVER: 0x03}


def connect(conn, port, p):
    """Answer the CONNECT ``p`` on ``conn`` (its first packet), through ``port`` (the guard, the topic map, the
    sessions, the client ids, the cluster): False when it was refused (answered; the connection closes). Worked on
    once one of the port's MQTT_CONNECTS_AT_ONCE turns is free (``port.connects``), in the order they came."""
    with port.connects:
        return _connect(conn, port, p)


def _connect(conn, port, p):
    conn.version = p.version
    v5 = p.version == MQTT_5
    client_id = _client_id(conn, port, p)
    if client_id is None or not _login(conn, port.guard, p) or not _will(conn, port.topics, p.will):
        return False
    conn.expiry_s = p.properties.get("session_expiry_interval", 0) if v5 else 0
    if _refused_now(conn, port, client_id, p):
        return False
    _client_options(conn, p)
    keep_alive = keep_alive_of(conn, p.keep_alive)
    if keep_alive is None:
        return False
    if keep_alive:
        conn.idle_timeout = keep_alive * 1.5  # [MQTT-3.1.2-24]: closed as a network failure, the will fires
    refused = port.join_cluster(client_id, p.clean_start, conn.session.user)  # the cluster's id
    if refused is not None:
        return refuse(conn, *refused)
    refusal = port.claim(conn, client_id, p.clean_start)
    if refusal is not None:
        return refuse(conn, wire.CLIENT_ID_NOT_VALID, refusal)
    resumed, unrecorded = _open_session(conn, port, client_id, p)
    if _refused_now(conn, port, client_id, p):  # it became so while the cluster or a takeover was waited for
        conn.will = None  # the client is told it is not connected: nothing of it is published
        return False
    if unrecorded is not None:
        conn.will = None
        return refuse(conn, wire.SERVER_UNAVAILABLE, "client %s: its will could not be recorded in the sessions' "
                      "log (%s): not connected, so that no will is lost" % (client_id, unrecorded),
                      {"reason_string": ("will not recorded: %s" % unrecorded)[:MAX_REASON_CHARS]})
    props = _connack_properties(conn.settings, p, keep_alive, client_id if not p.client_id else None) if v5 else {}
    if not conn.send(wire.Connack(resumed, wire.SUCCESS, props)):
        return False
    conn.subscriptions.resume()
    return True


def refuse(conn, code, why, props=None):
    """Answer the CONNECT with ``code`` (its 3.1.1 return code in 3.1.1), then close; one log line. False."""
    log.info("mqtt %s: CONNECT refused: %s (reason 0x%02X); closing", conn.peer, why, code)
    if conn.version == MQTT_5:
        conn.send(wire.Connack(False, code, props or {}))
    elif code in CONNACK_311:
        conn.send(wire.Connack(False, CONNACK_311[code]))
    return False


def _client_id(conn, port, p):
    """The CONNECT's client id (empty: one assigned, ``MqttPort.assign_id``); None: refused (answered), as enhanced
    authentication is."""
    if p.version == MQTT_5 and "authentication_method" in p.properties:
        return refuse(conn, wire.BAD_AUTHENTICATION_METHOD, "enhanced authentication (%s) is not supported"
                      % p.properties["authentication_method"]) or None
    client_id = p.client_id
    most = conn.settings.max_client_id_bytes
    if len(client_id.encode("utf-8")) > most:
        return refuse(conn, wire.CLIENT_ID_NOT_VALID, "a client identifier of %d bytes is past the limit of %d "
                      "(mqtt.max_client_id_bytes)" % (len(client_id.encode("utf-8")), most)) or None
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in client_id):
        return refuse(conn, wire.CLIENT_ID_NOT_VALID, "a client identifier holding a control character") or None
    return client_id or port.assign_id()


def _login(conn, guard, p):
    """The CONNECT's user name and password through the guard (authentication on); False: refused, answered."""
    if not guard.enabled:
        return True
    if p.username is None:
        return refuse(conn, wire.NOT_AUTHORIZED, "no user name (authentication is on)")
    try:
        guard.login_with_secret(conn.session, p.username, p.password or b"", "mqtt")
    except errors.QuotaExceeded as exc:
        return refuse(conn, wire.QUOTA_EXCEEDED, str(exc))
    except errors.Unauthenticated as exc:
        return refuse(conn, wire.BAD_USER_NAME_OR_PASSWORD, str(exc))
    return True


def _will(conn, topics, will):
    """The CONNECT's will (or None) kept on the connection when its topic name has a place (``records.placement``);
    False: refused, answered."""
    if will is not None:
        try:
            placement(topics, will.topic)
        except RecordRefusal as exc:
            return refuse(conn, wire.TOPIC_NAME_INVALID, "will topic %r: %s" % (will.topic, exc))
    conn.will = will
    return True


def _client_options(conn, p):
    """What the client allows the broker: its Receive Maximum, Maximum Packet Size, Request Problem Information and
    Topic Alias Maximum (within ``mqtt.max_outbound_aliases``; a table of its own, none kept across connections)."""
    props = p.properties
    conn.receive_maximum(props.get("receive_maximum", 65535))
    conn.client_max_packet = props.get("maximum_packet_size")
    conn.problem_information = props.get("request_problem_information", 1) == 1
    bound = conn.settings.max_outbound_aliases
    most = min(props.get("topic_alias_maximum", 0), bound) if p.version == MQTT_5 else 0
    conn.outbound_aliases = OutboundAliases(most, bound) if most else None


def keep_alive_of(conn, asked):
    """The Keep Alive the connection is held to, from the CONNECT's (``asked``, seconds; 0: none) and the broker's
    bound (``mqtt.max_keep_alive_s``, 0: none): MQTT 5 past the bound, or asking for none, gets the bound (told
    in the CONNACK as Server Keep Alive); MQTT 3.1.1, which cannot be told, is refused with 0x02 as Mosquitto's
    ``max_keepalive`` refuses it (None: answered, closing)."""
    bound = conn.settings.max_keep_alive_s
    if not bound or 0 < asked <= bound:
        return asked
    if conn.version == MQTT_5:
        return bound
    refuse(conn, wire.CLIENT_ID_NOT_VALID, "a Keep Alive of %s is past the bound of %d s (mqtt.max_keep_alive_s), "
           "and MQTT 3.1.1 cannot be told another" % ("%d s" % asked if asked else "0 (none)", bound))
    return None


def _use_another_server(conn, master, client_id, refusal):
    """A broker that keeps no session now (``MqttPort.session_refusal``: a slave, or a master that may not
    acknowledge) cannot keep a persistent session: refused, the master (``master``, its address or None) named."""
    props = {"server_reference": master} if master else {}
    return refuse(conn, wire.USE_ANOTHER_SERVER, "client %s asks for a persistent session and this broker keeps none "
                  "now (%s): connect to the master%s" % (client_id, refusal, " (%s)" % master if master else ""),
                  props)


def _unavailable(conn, client_id, refusal):
    """A master that may write nothing now (``MqttPort.unavailable``) serves no device: refused with Server
    unavailable. No other broker is named: no other member of its group serves in its place (a member that would
    is elected master only once this one is not), and the other brokers of an MQTT cluster hold other client ids."""
    return refuse(conn, wire.SERVER_UNAVAILABLE, "client %s: this broker may write nothing now (%s): its session "
                  "could not be saved, nor anything published to it" % (client_id, refusal),
                  {"reason_string": refusal[:MAX_REASON_CHARS]})


def _refused_now(conn, port, client_id, p):
    """True when the CONNECT ``p`` is refused (answered) for what this broker may keep now: nothing at all
    (``MqttPort.unavailable``), or no persistent session (``MqttPort.session_refusal``) when it asks for one.
    Asked before the CONNECT's waits and again after them, before the CONNACK: the broker may have stopped
    meanwhile, and a CONNACK 0 would then promise a session or a will that is not kept."""
    down = port.unavailable()
    if down is not None:
        return not _unavailable(conn, client_id, down)
    refusal = port.session_refusal()
    v5 = p.version == MQTT_5
    if refusal is not None and ((conn.expiry_s if v5 else not p.clean_start) or
                                (not p.clean_start and client_id in port.table.sessions)):
        return not _use_another_server(conn, port.master_reference(), client_id, refusal)
    return False


def _open_session(conn, port, client_id, p):
    """The connection's session (``conn.mqtt``): new, or resumed from what the port saved; its will recorded.
    ``(resumed, unrecorded)``: True when a session was resumed (CONNACK's Session Present); why the will could not
    be recorded while this broker keeps wills (the CONNECT is then refused), else None."""
    v5 = p.version == MQTT_5
    session = conn.mqtt = MqttSession(client_id, p.version, conn.settings.receive_maximum)
    session.user = conn.session.user
    session.expiry_s = conn.expiry_s if v5 else None
    session.persistent = bool(conn.expiry_s) if v5 else not p.clean_start
    saved = port.resume(client_id, p.clean_start, session.persistent)
    if saved is not None:
        session.restore(saved)
        conn.acks.unacked = len(session.qos2_received)  # its QoS 2 PUBLISHes waiting for their PUBREL
    if session.persistent:
        port.connected(session)
    unrecorded = None
    if conn.will is not None:
        conn.will_origin, unrecorded = port.wills.record_will(client_id, conn.will, conn.session,
                                                        conn.will_delay(conn.will))
    return saved is not None, unrecorded


def _connack_properties(s, p, keep_alive, assigned):
    """An MQTT 5 CONNACK's properties: what the broker allows (settings ``s``), the Server Keep Alive when it is not
    the CONNECT's, the client id ``assigned`` (None: the client's own)."""
    props = {"receive_maximum": s.receive_maximum, "maximum_packet_size": s.max_packet_bytes}
    if s.topic_alias_maximum:
        props["topic_alias_maximum"] = s.topic_alias_maximum
    if keep_alive != p.keep_alive:
        props["server_keep_alive"] = keep_alive  # [MQTT-3.2.2-21]: the client uses it instead of its own
    if assigned:
        props["assigned_client_identifier"] = assigned
    return props
