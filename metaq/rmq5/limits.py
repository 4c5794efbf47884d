"""The gRPC port's (RocketMQ 5) named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

from metaq import limits
from metaq.auth import limits as auth_limits

# -- the gRPC port (metaq/rmq5/: RocketMQ 5's MessagingService; docs/rocketmq5.md) --------------------------------
#: Streams one HTTP/2 connection of the gRPC port may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS, which the
#: port announces; grpc clients queue calls past it). A stream a client opens past it anyway is refused
#: (RST_STREAM REFUSED_STREAM, which a gRPC client retries); the connection goes on. Each open stream may hold one
#: unfinished message (GRPC_MAX_MESSAGE_BYTES).
GRPC_MAX_STREAMS_PER_CONNECTION = 100
#: Largest gRPC message a client may send (the length in its 5-byte prefix, checked before a byte of it is kept): a
#: message body of MAX_BODY_BYTES and room for its properties. Past it the call ends with grpc-status 8
#: (RESOURCE_EXHAUSTED), as grpc's own servers answer; the connection goes on.
GRPC_MAX_MESSAGE_BYTES = limits.MAX_BODY_BYTES + 64 * 1024
#: Size of one request's header list as HTTP/2 measures it (each field's name and value, plus 32):
#: SETTINGS_MAX_HEADER_LIST_SIZE. A larger header block ends the connection (GOAWAY): its HPACK state cannot be
#: kept in step without decoding it.
GRPC_MAX_HEADER_BYTES = 16 * 1024
#: A header block's encoded bytes (a HEADERS frame and its CONTINUATIONs) may be this many times
#: GRPC_MAX_HEADER_BYTES; past it the connection ends with GOAWAY ENHANCE_YOUR_CALM as the frame header arrives,
#: before the block is buffered further (the CONTINUATION flood). More than 1 because HPACK's Huffman strings may be
#: longer than their text when an encoder does not pick the shorter form.
GRPC_HEADER_BLOCK_FACTOR = 2
#: Distinct request header blocks (and checked header lists) a gRPC connection keeps decoded while the HPACK table
#: stands still: a client calls a few methods on one connection (a POP consumer alternates ReceiveMessage and
#: AckMessage), each with its own repeated block. Past it the oldest kept block goes and is decoded again when it
#: comes back; each kept block is within GRPC_HEADER_BLOCK_FACTOR * GRPC_MAX_HEADER_BYTES, so a connection holds at
#: most this many of them.
GRPC_CACHED_HEADER_BLOCKS = 8
#: WINDOW_UPDATE frames a gRPC client may send free for each DATA frame the port sent it (one for the stream's window,
#: one for the connection's); one past its credit counts against GRPC_MAX_CONTROL_FRAMES, so a client that returns
#: window it was never sent floods into that budget. The credit is held to GRPC_MAX_CONTROL_FRAMES.
GRPC_WINDOW_UPDATES_PER_DATA = 2
#: PING frames a gRPC client may send free for each DATA frame the port sent it: clients measure the bandwidth-delay
#: product with a PING as they read data (grpc-java at each read with none in flight, grpcio paced), which gRPC's own
#: servers never count as abuse; past the credit a PING counts against GRPC_MAX_CONTROL_FRAMES. Held to it too.
GRPC_PINGS_PER_DATA = 1
#: A DATA frame of at least this many bytes is payload delivered, free of the control budget (and pays for one small
#: frame); a shorter one, and HEADERS on a stream opened before, is a small frame, paid by GRPC_SMALL_FRAMES_PER_STREAM
#: for each stream opened and one for each such full DATA frame, past that counted against GRPC_MAX_CONTROL_FRAMES
#: (the flood of 1-byte DATA frames). A header-block part this short that does not end its block (HEADERS or
#: CONTINUATION without END_HEADERS) always counts: clients split a block only at the maximum frame size.
GRPC_SMALL_FRAME_BYTES = 1024
#: Small frames each stream a gRPC client opens pays for (its request message, the empty DATA that ends it, its
#: trailers, with room to spare): a unary call never counts against GRPC_MAX_CONTROL_FRAMES.
GRPC_SMALL_FRAMES_PER_STREAM = 4
#: Streams reset before their client ended them, and runs of stream ids the client skipped, a gRPC connection
#: remembers (each, the last so many): HEADERS on a lower stream id is a stream error STREAM_CLOSED on one reset, a
#: connection error PROTOCOL_ERROR on one skipped, else STREAM_CLOSED (a stream the client ended). Past the bound
#: the oldest is forgotten and taken for one the client ended: still a connection error.
GRPC_CLOSED_STREAMS_KEPT = 2 * GRPC_MAX_STREAMS_PER_CONNECTION
#: Bytes one receive of a gRPC connection takes: h2 parses all it is handed before the connection can share the loop
#: again (``share_loop``), and 16 KiB of the smallest frames parse within about one turn (MAX_TURN_MS).
GRPC_RECV_BYTES = 16 * 1024
#: The window in which a gRPC connection's control frames and new streams are counted (GRPC_MAX_CONTROL_FRAMES,
#: GRPC_MAX_NEW_STREAMS); a window starts with the first frame after the last one ended.
GRPC_FLOOD_WINDOW_S = 10.0
#: Frames that do no work for a request (PING, SETTINGS, RST_STREAM, PRIORITY, GOAWAY and unknown frames, empty and
#: tiny frames that end nothing, small frames past their credit, frames refused on their stream: port.FloodBudget)
#: one gRPC connection may send in GRPC_FLOOD_WINDOW_S: past it the connection ends with GOAWAY ENHANCE_YOUR_CALM (the
#: HTTP/2 ping, settings, rapid-reset, tiny-frame and closed-stream floods). A client sends a few (its SETTINGS,
#: keepalive and flow-control pings, a cancelled call's reset) each second.
GRPC_MAX_CONTROL_FRAMES = 1000
#: Streams (calls) one gRPC connection may open in GRPC_FLOOD_WINDOW_S: past it the connection ends with GOAWAY
#: ENHANCE_YOUR_CALM (a client opening streams as fast as it can), and the client reconnects.
GRPC_MAX_NEW_STREAMS = 20_000
#: Seconds an address whose gRPC connection was cut for frames that do no work (GRPC_MAX_CONTROL_FRAMES, a header
#: block past GRPC_HEADER_BLOCK_FACTOR) is refused new connections to the port (``grpc.flood_penalty_s``): a flood
#: that reconnects after each cut would get a fresh budget each time. Doubled at each cut while the address keeps
#: being cut, up to GRPC_FLOOD_PENALTY_MAX_S; forgotten once the address goes that long past its cooldown uncut.
GRPC_FLOOD_PENALTY_S = 1.0
#: The longest cooldown of an address cut again and again (GRPC_FLOOD_PENALTY_S doubled at each cut).
GRPC_FLOOD_PENALTY_MAX_S = 60.0
#: Addresses in cooldown the broker remembers (``connections.Penalties``): past it the one cut longest ago is
#: forgotten (a flood from more addresses than this gets a fresh budget on the addresses forgotten).
MAX_PENALIZED_ADDRESSES = 10_000
#: Bytes a gRPC connection cut for flooding still reads after its GOAWAY ENHANCE_YOUR_CALM before it closes (one
#: receive's worth, so that the GOAWAY most often reaches the client before the close resets the connection); a
#: connection ended otherwise lingers up to port.LINGER_S, reading what its client still sends.
GRPC_CALM_LINGER_BYTES = 64 * 1024
#: Longest wait a unary call's grpc-timeout may ask for (none given: this): a send waiting for its flush or a
#: slave is answered DEADLINE_EXCEEDED past it.
GRPC_MAX_CALL_S = 60.0
#: Consumer clients whose Telemetry Settings (FIFO group, max delivery attempts) the gRPC port keeps for their
#: receives; each user's share of it is its ``consumer_clients`` quota (half by default). Past either, the client
#: heard from longest ago (the user's own for its quota) is forgotten when idle (GRPC_CLIENT_IDLE_MS), else the new
#: client's Settings ends its stream RESOURCE_EXHAUSTED. With authentication off the oldest is forgotten, idle or not
#: (it receives with the defaults until it sends its Settings again, as every client does every 30 s or so).
GRPC_MAX_CONSUMER_CLIENTS = 4096
#: Topic names one producer's Telemetry Settings may name (its ``publishing.topics``, each one a topic whose half
#: messages' check-backs may ask it). A Settings naming more ends its stream INVALID_ARGUMENT before any name is kept;
#: each Settings replaces the names of the one before on its stream, never adds to them.
GRPC_MAX_TOPICS_PER_SETTINGS = 1024
#: Topic names the gRPC port keeps over every producer's Telemetry stream (the producer table the check-backs ask);
#: each user's share of it is its ``producer_topics`` quota (half by default). A Settings that would pass either ends
#: its stream RESOURCE_EXHAUSTED, naming the bound; a closed stream's names go with it.
GRPC_MAX_PRODUCER_TOPICS = 65_536
#: Messages one gRPC PullMessage returns at most: a larger ``batch_size`` is served as this many (RocketMQ's broker
#: caps a pull's messages at 32 alike), ``next_offset`` naming where the rest starts.
GRPC_PULL_MAX_BATCH = 32
#: Admin questions to connected gRPC clients (``metaq-admin clients stack|verify``: a PrintThreadStackTraceCommand or
#: a VerifyMessageCommand on the client's Telemetry stream) awaiting their answers on a broker at once; one more is
#: refused (503) until one is answered or times out.
GRPC_MAX_PENDING_CLIENT_COMMANDS = 8
#: How long such a question waits for the client's answer by default (``metaq-admin clients --timeout``).
GRPC_CLIENT_COMMAND_TIMEOUT_MS = 10_000
#: The longest wait such a question may ask for; past it the client is answered 504 (no answer).
GRPC_CLIENT_COMMAND_MAX_TIMEOUT_MS = 60_000
#: Auto-renew: how long a push consumer's message (an ``auto_renew`` receive's) is invisible from its delivery and from
#: each renewal, by default (the gRPC port's ``renew_invisible_ms``; RocketMQ's proxy: 60 s).
GRPC_RENEW_INVISIBLE_MS = 60_000
#: Auto-renew (a push consumer's ``auto_renew`` receives, metaq/rmq5/renewer.py): the longest time since its delivery
#: a message is kept invisible for its client (RocketMQ's proxy: 3 h); past it the broker no longer renews it and
#: it is delivered again at its last deadline, unless acknowledged first.
GRPC_RENEW_MAX_MS = 3 * 3600 * 1000
#: Messages the broker renews at once, over every client; a message delivered past it is not renewed (it is
#: delivered again after its invisible duration, as without auto-renew), one log line saying so.
GRPC_MAX_RENEWED = 100_000
#: Messages the broker renews at once for one client (its ``x-mq-client-id``); past it as past GRPC_MAX_RENEWED.
#: The official clients cache at most a few thousand messages per consumer.
GRPC_MAX_RENEWED_PER_CLIENT = 10_000
#: Messages the broker renews at once for one user's clients (authentication on), so that one user's many client
#: ids leave the rest of GRPC_MAX_RENEWED to the others (QUOTA_DEFAULT_SHARE of it); past it as past GRPC_MAX_RENEWED.
GRPC_MAX_RENEWED_PER_USER = int(GRPC_MAX_RENEWED * auth_limits.QUOTA_DEFAULT_SHARE)
#: A client not heard from for this long (no Heartbeat, Telemetry command, receive or ack; clients heartbeat every
#: 10 s, RocketMQ's proxy counts a consumer gone after 120 s) is taken for ended: its renewed messages are released.
GRPC_CLIENT_IDLE_MS = 120_000
#: A message held by a client that ended (NotifyClientTermination, its last Telemetry stream closed, or idle) is
#: visible again this soon (RocketMQ's proxy: 1 s), not after its whole invisible duration.
GRPC_RELEASE_INVISIBLE_MS = 1000
#: How far a RocketMQ 5 call's signed ``x-mq-date-time`` may be from the broker's clock, before or after: the
#: signature covers only that date, so an older one (a captured ``authorization`` header replayed) or one further
#: ahead is refused UNAUTHORIZED, naming the bound. Clients sign each call with the time they make it.
GRPC_AUTH_MAX_SKEW_MS = 15 * 60 * 1000
