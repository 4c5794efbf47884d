"""The HTTP port's (and the dashboard's) named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

from metaq import limits

#: HTTP reply bytes every connection of the HTTP port holds in all, produced but not yet taken by the kernel (clients
#: that do not read their answers). Past it a new request is answered 503 at once, its reply never produced, until
#: those clients read or their send deadline (``request_timeout_s``) closes them (server/http/server.UnsentReplies).
MAX_HTTP_UNSENT_BYTES = 64 * 1024 * 1024
#: The kernel send buffer of each HTTP connection (SO_SNDBUF; Linux doubles it): what a client that does not read
#: can leave in the kernel beyond ``MAX_HTTP_UNSENT_BYTES`` (without it the kernel grows it to ``tcp_wmem``'s
#: maximum, several MiB per connection).
HTTP_SEND_BUFFER_BYTES = 256 * 1024

#: Bytes one receive of an HTTP connection takes: the WSGI handler parses what it took before the connection can
#: share the loop again (``share_loop``), and a chunked body of 1-byte chunks costs microseconds a byte to parse, so
#: a receive is kept to what parses within about one turn.
HTTP_RECV_BYTES = 32 * 1024

#: Group rows (group, topic, partition) one ``/metrics`` scrape shows (two series each); past it the rest are left
#: out and ``metaq_group_rows_left_out`` says how many (100,000 committed offsets made a 15 MB scrape of 2.9 s).
MAX_METRICS_GROUP_ROWS = 10_000

#: An unfiltered ``/metrics`` answer that took more than METRICS_COSTLY_S to build is reused for ten times that, at
#: most METRICS_REUSE_S: a flood of costly scrapes spends at most a tenth of the event loop on them, and a cheap
#: answer is always fresh.
METRICS_COSTLY_S = 0.05
METRICS_REUSE_S = 1.0

# -- the HTTP port (metaq/server/http/, docs/operating.md "The HTTP port") ---------------------------------------------
#: Bytes of an HTTP request line, its CRLF included: past it the port answers 414 and closes. gevent.pywsgi's
#: ``MAX_REQUEST_LINE`` is the same figure (its handler answers the 414; tests/server/test_http_unit.py checks).
HTTP_MAX_REQUEST_LINE = 8192

#: Bytes of an HTTP request's header lines together: past it the port answers 431 and closes.
HTTP_MAX_HEADER_BYTES = 16 * 1024

#: Bytes of an HTTP request body (an HTTP put's payload and attribute): a larger Content-Length is answered
#: 413 without reading the body, and the connection closed. The text port's default ``max_body_bytes``.
HTTP_MAX_BODY_BYTES = limits.MAX_BODY_BYTES

#: Most messages one HTTP get returns (its ``max_bytes`` is also held to ``store.max_transfer_size``).
HTTP_MAX_GET_MESSAGES = 1000

# The dashboard's live topic page (metaq/server/http/topicview.py, docs/operating.md "A topic, live over MQTT"): the
# page's own MQTT client keeps these in the browser; the broker writes them into the page.

#: Messages the topic page shows: past it the oldest row is removed as a new one comes.
DASHBOARD_MAX_MESSAGES = 200
#: Largest MQTT packet the topic page's client reads (fixed header included): a longer one closes its connection,
#: refused at its length field, before its bytes are gathered. Also the largest it publishes.
DASHBOARD_MAX_PACKET_BYTES = 256 * 1024
#: Payload bytes the topic page keeps and shows of one message (as text or hex): the rest is left out, said so.
DASHBOARD_SHOWN_PAYLOAD_BYTES = 2048
#: QoS 1 PUBLISHes the topic page may have unacknowledged: one more is refused in the page until a PUBACK comes.
DASHBOARD_MAX_INFLIGHT = 16
#: Seconds of the topic page's MQTT keep-alive: it sends a PINGREQ when it sent nothing for that long.
DASHBOARD_KEEPALIVE_S = 30
