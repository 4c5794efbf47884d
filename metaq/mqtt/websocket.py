"""MQTT over WebSocket (docs/mqtt.md "Over WebSocket"): the ``ws://`` and ``wss://`` listeners of the MQTT port.

Each accepted socket (for ``wss://`` the core's TLS socket, ``security.tls``) is wrapped in a ``wsio.WsStream`` and
handed to the same ``connection.Connection`` as a TCP client's: one MQTT session per WebSocket, the same login,
permissions, quotas, limits, sessions, cluster and takeover, for the MQTT code reads and writes bytes as on TCP.
The subprotocols are MQTT's own (``mqtt``, MQTT 3.1.1 and 5 §6) and ``mqttv3.1`` (older Paho JavaScript clients).
Behind a trusted proxy the upgrade's ``X-Forwarded-For`` names the client: the stream hands it to the core's
``claim`` for its connection, so limits, logs, ``stats`` and permissions see the client (docs/mqtt.md).
"""

import functools
import time

from metaq.serving import limits as serving_limits
from metaq.mqtt.connection import Connection
from metaq.serving.wsio import WsRules, WsStream

__all__ = ["SUBPROTOCOLS", "listen_websocket"]

#: The WebSocket subprotocols accepted, the first a client offers chosen.
SUBPROTOCOLS = ("mqtt", "mqttv3.1")


def listen_websocket(core, port, settings, name, host, number):
    """Start the MQTT port ``port``'s WebSocket listener ``name`` ("mqtt-ws" or "mqtt-wss": the core makes the latter
    TLS) on ``host:number`` with the ``mqtt:`` ``settings``; returns the Listener."""
    rules = WsRules(settings.ws_path, SUBPROTOCOLS, settings.ws_allowed_origins,
                    settings.max_packet_bytes + serving_limits.WS_FRAME_MARGIN_BYTES,
                    min(serving_limits.WS_HANDSHAKE_TIMEOUT_S, core.rules.request_s), core.proxies)

    def make(sock, address, conn_id):
        stream = WsStream(sock, rules, address, time.monotonic())
        conn = Connection(stream, address, conn_id, port)
        stream.claim = functools.partial(core.claim, conn)
        return conn

    return core.listen(name, host, number, make)
