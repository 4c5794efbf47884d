"""MQTT over WebSocket's named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

# -- MQTT over WebSocket (metaq/serving/wsio.py, docs/mqtt.md "Over WebSocket") -----------------------------------
#: Seconds a WebSocket client has to finish its HTTP upgrade request from its connection's accept (a request
#: trickled a byte at a time or never finished is closed then; the login deadline, when shorter, applies too).
WS_HANDSHAKE_TIMEOUT_S = 10.0
#: Most bytes of the HTTP upgrade request (request line and headers): a longer one is refused with 431.
WS_MAX_HANDSHAKE_BYTES = 16 * 1024
#: Bytes a WebSocket frame's payload may declare beyond the MQTT port's max_packet_bytes (the frame is refused at its
#: header, close 1009, past that): room for the other small packets a client packs into the frame with the largest.
WS_FRAME_MARGIN_BYTES = 64 * 1024
#: Most frames (the first and its continuations) of one WebSocket message: a fragment flood is closed with 1008.
WS_MAX_FRAGMENTS = 1024
#: Control frames (PING, PONG) a WebSocket client may send a second, with bursts of as many: past that, close 1008.
WS_CONTROL_FRAMES_PER_S = 50
#: Most control frames (PING, PONG) a WebSocket client may send with no MQTT bytes between (one more: close 1008):
#: a client that only pings holds its connection's greenlet, as a packet under way does, for no longer.
WS_CONTROL_FRAMES_WITHOUT_DATA = 32
#: Seconds after a WebSocket client's last control frame past which its next starts the count of
#: WS_CONTROL_FRAMES_WITHOUT_DATA again: a subscriber that only receives, whose library pings every 20 s or so, is
#: never closed for it.
WS_CONTROL_QUIET_S = 5.0
#: Most hops of a WebSocket upgrade's X-Forwarded-For from a trusted proxy (one more: the upgrade is refused 400).
FORWARDED_MAX_HOPS = 16
#: Most entries of mqtt.ws_allowed_origins.
WS_MAX_ALLOWED_ORIGINS = 256
