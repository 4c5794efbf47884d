"""Named limits and name validation shared by every layer (stdlib only).

Each limit below is a default; the broker configuration (``limits:`` in
``conf/server.yaml``) may change the configurable ones. Every declared length
is checked against one of these before memory is allocated for it.

Long because it is one table: every layer's named limits, each with the reason for its value, where the
configuration schema and the docs' limits page read them.
"""

import re
import resource

from metaq.errors import InvalidTopic, InvalidPartition

#: Longest command line (without CRLF) a peer may send. A put line with an XA
#: transaction key is about 300 bytes, so 2 KiB leaves room and stops abuse.
MAX_LINE_BYTES = 2048

#: Largest put body (attribute block + payload). RocketMQ's maxMessageSize.
MAX_BODY_BYTES = 4 * 1024 * 1024

#: Most messages one ``putb`` frame (a batch of puts, protocol/putbatch.py) may carry: past it the batch is refused
#: whole (400). Its bytes are a body's, bounded by ``limits.max_body_bytes``. The broker stores a batch in one step
#: of its loop, so this also bounds how long one batch keeps the loop from other clients.
MAX_BATCH_MESSAGES = 10_000

#: Default upper bound for one ``get`` reply; a single larger message is still
#: returned whole (no message can become unconsumable).
MAX_TRANSFER_BYTES = 1024 * 1024

#: File descriptors kept back from RLIMIT_NOFILE for what a broker holds besides connections: the store's files
#: (the lock, the journals, the commit log segment being written; segment and index files are mapped and their
#: descriptors closed, so their number costs none), what a put or a flush opens for a moment, the log, the
#: listeners, the event loop's own, the ZooKeeper session and a slave's link to its master.
FD_STORE_RESERVE = 448

#: Connections the replication port may take past the connection cap (they come out of FD_RESERVE): clients
#: that fill the cap never lock a slave out of its master. A broker in an MQTT cluster takes its peers' links past
#: it too (MQTT_CLUSTER_PEER_HEADROOM, ``replication_headroom_for``).
REPLICATION_HEADROOM = 64

#: Connections on the replication port that have not proved the replication secret yet (a slave or a peer master
#: before its PROOF checked out, and every stranger), in all and from one address: counted apart
#: (``connections.Strangers``), within the port's headroom, so that they never take the slots of a slave or a peer
#: that proved it. At the cap in all the oldest of the address holding the most is closed for a new one once
#: STRANGER_EVICTION_AGE_S old (a slave or a peer proves within milliseconds), else the new one is refused.
REPLICATION_STRANGERS = REPLICATION_HEADROOM // 2
REPLICATION_STRANGERS_PER_ADDRESS = 8
#: Seconds a connection on the replication port has, from its accept, to prove the secret (its PROOF and its first
#: frame after it: a slave's HELLO, a peer's ROUTES or PEER_CALL); past it the connection is closed.
REPLICATION_PROOF_TIMEOUT_S = 5.0
#: Bytes of one frame the replication port reads before its sender proved the secret (the handshake's frames: a
#: PROOF, a HELLO of MAX_REPLICATION_EPOCHS entries, a peer's first ROUTES part or PEER_CALL): a larger one is
#: refused at its header, before a byte of its body is read. Peers send a larger first request after a small one.
REPLICATION_HANDSHAKE_FRAME_BYTES = 128 * 1024

#: File descriptors kept back from RLIMIT_NOFILE when computing the connection cap: the store's part and the
#: replication port's headroom. A broker in an MQTT cluster keeps its peers' links in and its own out too
#: (MQTT_CLUSTER_PEER_HEADROOM and MQTT_CLUSTER_LINK_FDS: ``fd_reserve_for``).
FD_RESERVE = FD_STORE_RESERVE + REPLICATION_HEADROOM

#: Connections one address may hold on a port with headroom of its own, so that one host cannot take the whole
#: headroom. On the replication port one host's brokers use one per slave of this master; the other masters of an
#: MQTT cluster count here only until they prove the secret (then MQTT_CLUSTER_PEERS_PER_ADDRESS).
HEADROOM_PER_ADDRESS = 16

#: Seconds a connection may sit with no complete request before it is closed.
IDLE_TIMEOUT_S = 600.0

#: Seconds a request (line or body) may take to arrive, from its first byte (a completed request restarts it).
REQUEST_TIMEOUT_S = 30.0

#: Longest wait a long-polling get may ask for.
MAX_WAIT_MS = 60_000

#: Most partitions one topic may have.
MAX_PARTITIONS = 1024

#: Most topics a broker holds (``limits.max_topics``): a put that would create one more through a pattern
#: such as the default ``*`` is refused (400 on the text port). Topics named exactly in the config are
#: counted but always accepted.
MAX_TOPICS = 1024

#: Most partitions a broker holds across all its topics (``limits.max_partitions``), refused as above. Each
#: costs an index file (from 4 KiB, growing with use), a map and a checkpoint entry.
MAX_TOTAL_PARTITIONS = 4096

#: Largest topic table file (``<data_dir>/topics.json``, topics/table.py) and its copy in a replication frame, with
#: the owners of the topics users' puts created (replication_topics.py: what bounds how many a frame carries).
MAX_TOPIC_TABLE_BYTES = 1 << 20

#: Longest topic or group name, in bytes.
MAX_NAME_BYTES = 200

#: Consumer groups the group settings table (``<data_dir>/groups.json``, groups/table.py) holds at most: a setting
#: for one more group is refused (its entries and the topic table travel in one replication frame, bounded by
#: MAX_TOPIC_TABLE_BYTES).
MAX_GROUP_SETTINGS = 1024
#: Largest ``max_retries`` a group may be given (RocketMQ's retryMaxTimes; its delay levels end at 18 retries, later
#: retries wait the last level's 2 hours).
MAX_GROUP_RETRIES = 1000

#: Largest broker id (MetaQ's IdWorker has a 10-bit worker id).
MAX_BROKER_ID = 1023

_NAME_RE = re.compile(r"[A-Za-z0-9_.%-]+")
#: Names ``validate_topic`` found legal, so that a name a client gives on every call is looked up, not matched
#: again (the rule never changes: a legal name stays legal); emptied when it holds ``_LEGAL_NAMES_KEPT``.
_legal_names = set()
_LEGAL_NAMES_KEPT = 4096


def replication_headroom_for(mqtt_cluster):
    """Connections the replication port takes past the connection cap: REPLICATION_HEADROOM (a master's slaves, and
    peers not yet proved), and in an MQTT cluster MQTT_CLUSTER_PEER_HEADROOM more, every link its peers may open to
    it, so that clients filling the cap never keep a peer out."""
    return REPLICATION_HEADROOM + (MQTT_CLUSTER_PEER_HEADROOM if mqtt_cluster else 0)


def fd_reserve_for(mqtt_cluster):
    """Descriptors a broker keeps back from its open-files limit for everything but its clients' connections: the
    store's part and the replication port's headroom (``replication_headroom_for``: in an MQTT cluster its peers'
    links in), and in an MQTT cluster its own links out to its peers (MQTT_CLUSTER_LINK_FDS). The connection cap
    is the limit less this, so a full headroom never runs the process out of descriptors."""
    return (FD_STORE_RESERVE + replication_headroom_for(mqtt_cluster)
            + (MQTT_CLUSTER_LINK_FDS if mqtt_cluster else 0))


#: Connections a broker whose ``limits.max_connections`` is unset makes room for when it raises its soft open-files
#: limit at start (``nofile_target_for``): Redis's default maxclients, thousands of clients on one broker. Not the
#: hard limit itself (the JVM's way): an unset cap follows the limit, and a hard limit of a million would make the
#: cap, and what is derived from it (the per-address and unauthenticated shares), no bound at all. A soft limit
#: already higher is kept (the cap follows it); more room than this is ``limits.max_connections``.
DEFAULT_CONNECTION_ROOM = 10_000


def nofile_target_for(soft, hard, reserve, max_connections=None):
    """The soft RLIMIT_NOFILE a broker raises its own to at start: room for what it keeps back (``reserve``) plus
    its connection cap (``max_connections``; unset, DEFAULT_CONNECTION_ROOM), never above the ``hard`` limit and
    never below the ``soft`` one it was given. ``resource.RLIM_INFINITY`` is no limit, for either."""
    if soft == resource.RLIM_INFINITY:
        return soft
    wanted = reserve + (DEFAULT_CONNECTION_ROOM if max_connections is None else max_connections)
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    return max(soft, wanted)


def max_connections_for(nofile_limit, reserve=FD_RESERVE):
    """Connection cap derived from the open-file limit, never below 1."""
    return max(1, nofile_limit - reserve)


#: Share of the connection cap one peer address may hold by default, so that one host (however many
#: sockets it opens) never takes every slot; ``limits.max_connections_per_address`` sets it outright.
PER_ADDRESS_SHARE = 0.5


def max_per_address_for(max_connections):
    """Default per-address connection cap for a broker allowing ``max_connections``, never below 1."""
    return max(1, int(max_connections * PER_ADDRESS_SHARE))


#: Reply bytes one connection may hold, read from the store but not yet taken by the kernel (its
#: socket's send buffer full: a client that does not read). Past it the connection's reads of the store,
#: and so the parsing of its requests, wait for the replies to drain (serving/connections.ReplyBudget).
#: One record larger than this is still served whole.
MAX_REPLY_BYTES = 4 * 1024 * 1024

#: HTTP reply bytes every connection of the HTTP port holds in all, produced but not yet taken by the kernel (clients
#: that do not read their answers). Past it a new request is answered 503 at once, its reply never produced, until
#: those clients read or their send deadline (``request_timeout_s``) closes them (server/http/server.UnsentReplies).
MAX_HTTP_UNSENT_BYTES = 64 * 1024 * 1024
#: The kernel send buffer of each HTTP connection (SO_SNDBUF; Linux doubles it): what a client that does not read
#: can leave in the kernel beyond ``MAX_HTTP_UNSENT_BYTES`` (without it the kernel grows it to ``tcp_wmem``'s
#: maximum, several MiB per connection).
HTTP_SEND_BUFFER_BYTES = 256 * 1024

#: Seconds one send of a zero-copy reply (a get's records sent straight from the segment maps: server/zerocopy.py)
#: may wait on a socket that takes no more bytes while it holds those maps (a segment retention deleted keeps its
#: disk space while held). Past it the unsent rest is copied out of the maps and sent as an ordinary buffer.
MAX_PINNED_SEND_S = 2.0

#: Cuts of the commit log (a slave's, before its epoch handshake) whose positions the log remembers: a zero-copy
#: reply read before that many cuts ago cannot tell which of its records they reached and is never sent (its
#: connection closes). Replies hold their records for ``MAX_PINNED_SEND_S`` at most; cuts are rare.
MAX_CUTS_REMEMBERED = 64

#: Milliseconds a connection's greenlet handles the requests of one receive buffer (up to 256 KiB of pipelined
#: requests) before it lets the other connections run (``connections.share_loop``): a pipeline of requests that
#: each cost milliseconds (``get_tags`` scanning ``MAX_FILTER_SCAN_UNITS`` units, a ``get_prio`` over eight
#: backlogged levels) would otherwise stall every other client for the whole buffer; it stalls them about this long.
MAX_TURN_MS = 20

#: Bytes one receive of an HTTP connection takes: the WSGI handler parses what it took before the connection can
#: share the loop again (``share_loop``), and a chunked body of 1-byte chunks costs microseconds a byte to parse, so
#: a receive is kept to what parses within about one turn.
HTTP_RECV_BYTES = 32 * 1024

#: Bursts of replies one text connection may have waiting for their flush (``sync`` mode) before it stops
#: reading more requests (bounds memory per pipelining producer).
MAX_PENDING_BURSTS = 8

#: RocketMQ half messages waiting for their END_TRANSACTION or check-back at once (``remoting.max_half_messages``);
#: a half message past it is refused (TRANSACTION_FAILED). They also count as open transactions
#: (``transactions.max_open``), so the default leaves half of those to the text protocol's transactions.
MAX_HALF_MESSAGES = 5_000

#: Half messages one check-back round acts on (checks sent and rollbacks after the last check together),
#: oldest first; the others due wait for the next round (``metaq.transactions.policy``).
MAX_CHECKS_PER_ROUND = 1_000

#: Longest ``CHECK_IMMUNITY_TIME_IN_SECONDS`` a half message may ask for before its first check-back (a day).
MAX_CHECK_IMMUNITY_S = 86_400

#: Long-polling gets (``get ... maxWaitMs``) one text connection may have parked at once: one per
#: partition it consumes is the normal use. Past it the get is answered 503 at once.
MAX_PARKED_GETS_PER_CONNECTION = 1024

#: Long polls parked at once on the whole broker, text gets and remoting pulls together (each holds a
#: greenlet). Past it a get is answered 503 and a pull SYSTEM_BUSY at once.
MAX_PARKED_GETS = 20_000

# -- request-reply (docs/messaging.md "Request-reply") ----------------------------------------

#: Text-protocol ``request``s one connection may have waiting for their replies at once
#: (``limits.max_pending_requests_per_connection``); past it a request is answered 503 at once, not stored.
MAX_PENDING_REQUESTS_PER_CONNECTION = 1024

#: Timed messages (``put_at``, RocketMQ 5's timer properties) pending on the whole broker
#: (``limits.max_pending_timers``; each a row of timers.db); past it a timed put is answered 503 at once, nothing
#: stored. Users' ``timers`` quotas divide it (docs/security.md "Quotas").
MAX_PENDING_TIMERS = 10_000_000

#: Text-protocol ``request``s waiting for their replies on the whole broker (``limits.max_pending_requests``;
#: each holds a greenlet and a table entry); past it a request is answered 503 at once, not stored.
MAX_PENDING_REQUESTS = 20_000

#: Longest a ``request`` may wait for its reply (``limits.max_request_timeout_ms``); a longer timeout is cut to it.
MAX_REQUEST_TIMEOUT_MS = 300_000

#: Longest ``METAQ_REPLY_ERROR`` (what a failed handler raised) a reply carries; longer text is cut.
MAX_REPLY_ERROR_BYTES = 1024


def validate_topic(topic):
    """Return ``topic`` if it is a legal topic name, else raise InvalidTopic.

    Legal: 1..MAX_NAME_BYTES characters from ``A-Z a-z 0-9 _ . - %``, not
    ``.`` or ``..``. No path separator can pass, so a topic never reaches
    outside the data directory.
    """
    if topic.__class__ is str and topic in _legal_names:
        return topic
    if not isinstance(topic, str):
        raise InvalidTopic("topic must be text, got %r" % (topic,))
    if not topic or len(topic.encode("utf-8")) > MAX_NAME_BYTES:
        raise InvalidTopic("topic name must be 1..%d bytes, got %d" % (MAX_NAME_BYTES, len(topic.encode("utf-8"))))
    if not _NAME_RE.fullmatch(topic) or topic in (".", ".."):
        raise InvalidTopic("illegal topic name %r: use letters, digits, '_', '-', '.', '%%'" % (topic,))
    if topic.__class__ is str:  # (a subclass may compare as it likes: never kept)
        if len(_legal_names) >= _LEGAL_NAMES_KEPT:
            _legal_names.clear()
        _legal_names.add(topic)
    return topic


def validate_group(group):
    """Return ``group`` if it is a legal consumer group name (same alphabet as topics)."""
    if group.__class__ is str and group in _legal_names:  # found legal by ``validate_topic`` already
        return group
    try:
        return validate_topic(group)
    except InvalidTopic as exc:
        raise InvalidTopic(str(exc).replace("topic", "group")) from None


def validate_partition(partition, partitions):
    """Return ``partition`` if ``0 <= partition < partitions``, else raise InvalidPartition."""
    if not 0 <= partition < partitions:
        raise InvalidPartition("wrong partition %d: the topic has partitions 0..%d" % (partition, partitions - 1))
    return partition


#: Largest RocketMQ remoting frame, counting its 4-byte length field (Java's
#: ``com.rocketmq.remoting.frameMaxLength`` default, compared the same way Netty's
#: LengthFieldBasedFrameDecoder does: length field value + 4).
MAX_REMOTING_FRAME = 16 * 1024 * 1024

#: Largest header (JSON or ROCKETMQ binary) of a remoting frame. Java has no
#: separate cap; a send header carries at most 32 KiB of properties, which JSON
#: escaping (``\u0001``) can grow sixfold, so 1 MiB leaves ample room.
MAX_REMOTING_HEADER = 1024 * 1024

#: Most log bytes one replication DATA frame may carry (``metaq.protocol.replication``).
#: A chunk holds whole records and blank tails, so this must exceed the largest
#: record (MAX_BODY_BYTES + topic + 62 bytes of header) and the largest blank
#: tail (smaller than the record that caused the roll).
MAX_REPLICATION_DATA_BYTES = 16 * 1024 * 1024

#: What a master reads per DATA frame by default (``MessageStore.read_log`` max_bytes).
REPLICATION_READ_BYTES = 1024 * 1024

#: Longest text of a replication ERROR frame, in bytes.
MAX_REPLICATION_ERROR_TEXT = 4096

#: Most entries an epoch history may hold, on disk and in a HELLO/EPOCHS frame
#: (one entry per master start or promotion; 16 bytes each on the wire).
MAX_REPLICATION_EPOCHS = 4096
#: Requests one remoting connection may have in progress at once (long-polling
#: pulls and sends waiting for their flush included); reading pauses at the cap.
MAX_REMOTING_INFLIGHT = 256
#: Request bytes (bodies) one remoting connection's requests in progress may hold; reading pauses past it (one
#: request is always let in): a producer that pipelines sends and never reads the answers holds no more.
MAX_REMOTING_INFLIGHT_BYTES = 32 << 20
#: The same over every remoting connection together (thousands of connections holding 32 MiB each).
MAX_REMOTING_INFLIGHT_BYTES_TOTAL = 512 << 20

#: Bytes of requests begun but not yet whole (a frame or a put's body still arriving) the broker holds in all, over
#: every connection; past it a connection that would hold more stops reading until there is room, or its request
#: deadline passes: connections that each send most of a large frame and stop hold no more together.
MAX_PARTIAL_REQUEST_BYTES = 1 << 30

#: Transactions open at once on the broker (active and prepared, local and XA); a BEGIN past it fails
#: with XAER_RMERR (``transactions.max_open``).
MAX_OPEN_TRANSACTIONS = 10_000

#: Message bytes all open transactions may hold together in the broker's memory until they end; a
#: transactional put past it fails with XAER_RMERR (``transactions.max_held_bytes``).
MAX_TX_HELD_BYTES = 1 << 30
#: Transaction journal records (``%TX%``) a slave's manager learns in one call of the log follower
#: (``JournalFollow.learn``, on the event loop); the rest wait for the follower's next step, other greenlets served
#: between.
TX_LEARN_BATCH = 1_000
#: ... and at most this many bytes of their log records (one record at least: a PUT may hold a message of up to
#: ``MAX_BODY_BYTES``).
TX_LEARN_BATCH_BYTES = 8 << 20
#: Live transaction branches (and heuristic outcomes) a journal snapshot writes in one turn of the event loop
#: (``TransactionManager.maintain``); it yields between two such steps, so a broker with many branches open keeps
#: serving while it writes one.
TX_SNAPSHOT_STEP = 1_000

#: Committed consumer offsets the broker keeps, one per (group, topic, partition): a commit that would add
#: one more is refused (400). All are written at every checkpoint, so they are bounded like any state.
MAX_CONSUMER_OFFSETS = 100_000

#: Lines of one template (logger + format string) the broker logs per LOG_WINDOW_S; past it they are
#: dropped and counted (server/logflood.py), so a client cannot fill the disk with log lines.
LOG_LINES_PER_TEMPLATE = 100
LOG_WINDOW_S = 10.0
#: Distinct templates tracked at once by that filter.
LOG_TEMPLATES = 10_000

#: (consumer group, client id) entries the remoting port keeps from heartbeats; a heartbeat that would add
#: more is refused (INVALID_PARAMETER), so clients inventing ids and groups cannot grow the registry.
MAX_REMOTING_MEMBERS = 100_000

#: Corrupt records the store logs (one line each, the first time one is read); past that many a read
#: of one more is still refused and counted (``stats`` ``corrupt_reads``) but logged no more.
MAX_CORRUPT_LOGGED = 1024

#: Topic names the broker keeps realtime counters for (``stats topic``); names past it (clients may ask for
#: any name) share one set of counters.
MAX_STATS_TOPICS = 4096

#: Group rows (group, topic, partition) one ``/metrics`` scrape shows (two series each); past it the rest are left
#: out and ``metaq_group_rows_left_out`` says how many (100,000 committed offsets made a 15 MB scrape of 2.9 s).
MAX_METRICS_GROUP_ROWS = 10_000

#: Rows one ``stats groups`` answer holds (a consumer group's position in a partition, of any protocol: committed
#: offsets, POP groups, MQTT shared groups and persistent sessions); past it the most behind are kept and a last
#: ``left_out <n>`` line says how many were not sent (``metaq-admin groups`` and ``metaq-spark-report`` say so).
MAX_GROUP_LAG_ROWS = 10_000
#: Bytes of the rows one ``stats groups`` answer holds (an MQTT shared group's name holds its filter, up to
#: MQTT_MAX_TOPIC_BYTES): past them the rest is left out as past MAX_GROUP_LAG_ROWS, the most behind kept.
MAX_GROUP_LAG_BYTES = 2 << 20

#: An unfiltered ``/metrics`` answer that took more than METRICS_COSTLY_S to build is reused for ten times that, at
#: most METRICS_REUSE_S: a flood of costly scrapes spends at most a tenth of the event loop on them, and a cheap
#: answer is always fresh.
METRICS_COSTLY_S = 0.05
METRICS_REUSE_S = 1.0

#: Consumer groups one RocketMQ heartbeat may name (real clients send a handful); more is INVALID_PARAMETER.
MAX_HEARTBEAT_GROUPS = 1024

#: Oneway notifications (NOTIFY_CONSUMER_IDS_CHANGED) waiting to be sent to one remoting connection; past it
#: they are dropped (a client that does not read cannot hold the broker's memory or another client's request).
MAX_PENDING_NOTIFIES = 16
#: Bytes of the broker's own requests (pushed replies, check-backs with their message) waiting to be sent on one
#: remoting connection, and on the whole broker; past either a new one is not queued (one is always let through
#: on a connection with none): connections that never read hold no more of the broker's memory.
MAX_PENDING_NOTIFY_BYTES = 8 << 20
MAX_PENDING_NOTIFY_BYTES_TOTAL = 256 << 20

#: Queues one LOCK_BATCH_MQ / UNLOCK_BATCH_MQ body may name (a real client names the queues of one topic on one
#: broker, at most MAX_PARTITIONS, plus its retry queue); more is INVALID_PARAMETER, the request is not applied.
MAX_LOCK_BATCH_QUEUES = MAX_PARTITIONS + 64

#: Queue locks of orderly consumers the broker keeps, one per (group, topic, queue) (``remoting.max_locks``);
#: past it a lock on one more queue is refused (not in ``lockOKMQSet``) until locks are released or expire.
MAX_REMOTING_LOCKS = 100_000

# -- security (docs/security.md) ------------------------------------------------

#: Largest users-and-permissions file (``security.acl_file``) the broker reads; a larger one is refused.
MAX_ACL_FILE_BYTES = 1024 * 1024

#: Most users (and, apart, roles) one permissions file may define.
MAX_ACL_USERS = 10_000

#: Most topic or group rules one user or role may list, and entries in one address allow-list.
MAX_ACL_RULES = 1024

#: Names (topics, groups) whose permission one user's table remembers; past it the oldest answer is forgotten.
MAX_ACL_DECISIONS_CACHED = 4096

#: Seconds a server nonce of the text ``auth`` handshake stays valid (it is used once, in any case).
AUTH_NONCE_TTL_S = 30.0

#: Failed authentications one address may make in ``AUTH_FAILURE_WINDOW_S`` before each further one is
#: answered only after a delay (``AUTH_FAILURE_DELAY_S``): a password guesser is slowed, a typo is not.
AUTH_FAILURES_BEFORE_DELAY = 5
AUTH_FAILURE_WINDOW_S = 60.0
AUTH_FAILURE_DELAY_S = 1.0

#: Failed authentications one address prefix (an IPv4 /24, an IPv6 /64: ``AUTH_PREFIX_V4``, ``AUTH_PREFIX_V6``)
#: may make in ``AUTH_FAILURE_WINDOW_S`` before each further one from it is delayed: a guesser rotating its
#: source address within its network is slowed like one that keeps it.
AUTH_PREFIX_FAILURES_BEFORE_DELAY = 20
AUTH_PREFIX_V4 = 24
AUTH_PREFIX_V6 = 64

#: Addresses and prefixes whose recent failures are remembered (the oldest is forgotten past it).
MAX_AUTH_FAILURE_ADDRESSES = 10_000

#: Fewest bytes of a user's secret in the permissions file: shorter is refused when the file is read (a
#: guesser's work doubles with each random bit; RocketMQ refuses a secretKey of 6 characters or fewer).
MIN_USER_SECRET_BYTES = 12

#: Seconds a connection to a port with authentication on has to log in (text ``auth``, a signed RocketMQ request,
#: an HTTP request with a user's credentials) before it is closed: a stranger holds a connection only that long.
LOGIN_TIMEOUT_S = 10.0

#: Connections not yet logged in that one address may hold, and the share of the connection cap all of them
#: may (``max_unauthenticated_for``): counted apart from logged-in connections, so strangers never fill the cap.
MAX_UNAUTHENTICATED_PER_ADDRESS = 16
UNAUTHENTICATED_SHARE = 0.25

#: With strangers at their cap in all, a new connection closes the oldest stranger of the address holding the most
#: (``Strangers.room``) instead of being refused, so that a user with credentials always gets in; a stranger is
#: never closed so before it has been open this long: a client that logs in within it is never evicted.
STRANGER_EVICTION_AGE_S = 2.0

#: A text request's body before its connection has logged in (``auth``, ``version`` and ``quit`` have none; a
#: pipelined small put after ``auth`` fits): a larger one closes the connection before a byte of it is held.
MAX_PRELOGIN_BODY_BYTES = 64 * 1024

#: Bytes of unfinished requests all connections not yet logged in may hold, in all: their own budget, apart from
#: logged-in users' ``MAX_PARTIAL_REQUEST_BYTES``, so strangers never make a user's request wait.
MAX_PRELOGIN_PARTIAL_BYTES = 16 << 20


def max_unauthenticated_for(max_connections):
    """Connections not yet logged in the whole broker may hold: ``UNAUTHENTICATED_SHARE`` of the cap (at least 16)."""
    return max(16, int(max_connections * UNAUTHENTICATED_SHARE))


#: TLS handshakes one address may start a second on a TLS port (``limits.tls_handshakes_per_address_s``), with
#: bursts of up to twice that: a handshake costs the broker's one core far more than the client, so a flood from
#: one address would slow every other client; past it the connection is closed before its handshake.
TLS_HANDSHAKES_PER_ADDRESS_S = 50
#: Addresses whose handshake rate is remembered (the longest idle is forgotten past it).
MAX_TLS_RATE_ADDRESSES = 10_000

#: Seconds an accepted connection has to send its first byte and finish a TLS handshake.
TLS_HANDSHAKE_TIMEOUT_S = 10.0

#: The longest PROXY protocol v1 header (its specification's bound, CRLF included): a line not ended by then is
#: refused (docs/security.md "Behind a proxy").
PROXY_V1_MAX_BYTES = 107
#: The longest PROXY protocol v2 header the broker reads (its 16 fixed bytes, addresses and TLVs): the format allows
#: 64 KiB; a proxy's addresses and usual TLVs (ALPN, authority, a TLS summary, a cloud's endpoint id) fit well within.
PROXY_V2_MAX_BYTES = 4096
#: Networks ``security.trusted_proxies`` may list.
MAX_TRUSTED_PROXIES = 256

#: Seconds a permissive replication port waits for a slave's first byte (a TLS hello) before it takes the slave
#: for a plaintext one (which says nothing until the master's CHALLENGE).
TLS_DETECT_WAIT_S = 1.0

#: Longest shared secret or secret key (bytes) the broker accepts, and the shortest replication secret.
MAX_SECRET_BYTES = 1024
MIN_REPLICATION_SECRET_BYTES = 16

#: Longest user name (UTF-8 bytes) a transaction branch records as its owner, in memory and in the transaction
#: journal, and a committed offset's or a created topic's owner in the replication stream's OFFSETS and TOPICS
#: frames (the permissions file's names are at most 128 characters of ``[A-Za-z0-9_.@-]``).
MAX_TX_OWNER_BYTES = 128

#: Distinct topics and groups one RocketMQ request may need permissions for (a heartbeat names its groups and
#: their subscriptions; real clients name a handful): past it the request is refused (INVALID_PARAMETER).
MAX_ACL_RESOURCES_PER_REQUEST = 1024

#: Largest client credentials file (``--credentials``, ``METAQ_CREDENTIALS``) or secret file a client reads.
MAX_CREDENTIALS_FILE_BYTES = 64 * 1024

#: Largest reply body a client accepts during the ``auth`` handshake (a nonce, a proof or a refusal's text).
MAX_AUTH_REPLY_BYTES = 4096

#: Seconds a client connection waits, after a broker refused its credentials (or could not prove it holds
#: them), before it offers them again; requests made meanwhile fail at once with the same ``Unauthenticated``.
CLIENT_AUTH_RETRY_S = 10.0

#: Plaintext a client encrypts at a time before sending it (a TLS connection's write buffer is at most about this).
CLIENT_TLS_WRITE_BYTES = 256 * 1024

#: A nonce of the replication handshake (``CHALLENGE`` and ``PROOF`` frames, lowercase hex text): at least
#: 32 characters (16 random bytes), at most 64.
MIN_REPLICATION_NONCE_CHARS = 32
MAX_REPLICATION_NONCE_CHARS = 64

#: Longest proof of the replication secret in a ``PROOF`` frame (hex HMAC-SHA256: 64 characters).
MAX_REPLICATION_PROOF_CHARS = 64

#: Largest certificate, key or CA file (``security.tls.cert``/``key``/``ca``) the broker reads (a PEM bundle of
#: a few hundred CAs fits); a larger one is refused at start.
MAX_TLS_FILE_BYTES = 1024 * 1024

#: Bytes read (without waiting) from a plaintext client on a port that requires TLS before its refusal is sent
#: and the connection closed (a close with unread bytes resets the connection, which could lose the refusal).
TLS_PLAINTEXT_DRAIN_BYTES = 64 * 1024

# -- automatic failover (replication.ha: auto; docs/replication.md) -----------------------------------
#: Samples of the master's written end kept to judge whether a member is in sync (one per leader tick, 0.1 s):
#: enough for replication.insync_lag_ms up to 60 s.
MAX_INSYNC_SAMPLES = 600
#: Bytes of one ZooKeeper node the election reads (leader, insync, a candidate): a larger one is refused.
MAX_ELECTION_NODE_BYTES = 4096
#: Members of one broker id's group an insync node may list.
MAX_GROUP_MEMBERS = 64
#: Epochs a group's persistent epoch record (``ids/<id>/epochs``) keeps, the latest last: older ones are dropped
#: as new ones are added (only the latest decides who may be master).
MAX_RECORDED_EPOCHS = 64
#: Bytes of the epoch record node read or written: a larger one is refused (read: treated as unreadable).
MAX_EPOCH_RECORD_BYTES = 32768

#: Longest RocketMQ client id (``ip@instance``) a heartbeat may carry (UTF-8 bytes); the registry keeps it, and a
#: longer one is refused with the heartbeat (its group names: ``MAX_NAME_BYTES``).
MAX_CLIENT_ID_BYTES = 255

# -- consumer offsets on the replication stream (the OFFSETS frame; docs/replication.md) ----------------
#: Committed offsets one OFFSETS frame may carry (the master's table, up to MAX_CONSUMER_OFFSETS entries, goes
#: in as many frames as it needs).
MAX_REPLICATION_OFFSETS_PER_FRAME = 1000
#: Bytes of entries one OFFSETS frame may carry (22 bytes and the two names each, and with owners 1 byte and the
#: owner's name: 1000 entries with 100-byte names fit; longer names and owners make more frames).
MAX_REPLICATION_OFFSETS_BYTES = 256 * 1024

#: Puts one Spark sink task keeps in flight (its ``maxInFlight`` option: 1 .. this).
MAX_SINK_IN_FLIGHT = 4096

#: Rows one Arrow batch of the Spark source may hold (its ``maxRecordsPerBatch`` option: 1 .. this): a batch is
#: built in memory whole, values and all, before Spark takes it.
MAX_ARROW_BATCH_ROWS = 100_000

#: Spark tasks one micro-batch of the streaming source is cut into at most (its ``minPartitions`` option).
MAX_STREAM_TASKS = 10_000

# -- idempotent producers (put_idem; docs/spark.md "The idempotent producer") ------------------------------------------
#: Sequences of one producer-partition the broker remembers (``metaq.idempotence.window``): a resend of one of
#: them is answered as a duplicate; an older one is refused. The client never has more than this many
#: sequences of one partition unanswered, so its resends always fall inside.
IDEMPOTENCE_WINDOW = 1024
#: Most messages one ``putb_idem`` frame (a batch of idempotent puts: idempotence/wire.py) may carry: past it the
#: batch is refused whole (400). A batch is answered once, so its sequences are all unanswered while it is in
#: flight: the window bounds it, and a resent batch's duplicates are all answered with their original offsets.
MAX_IDEMPOTENT_BATCH_MESSAGES = IDEMPOTENCE_WINDOW
#: Producer-partitions ``(pid, topic, partition)`` the broker keeps windows for; past it the least recently
#: written is evicted (its resends are then stored again, as a new producer's). Worst case about 25 KiB each.
MAX_IDEMPOTENT_PRODUCERS = 4096
#: Default of ``store.producer_ttl_s`` in ms: a producer-partition with no record for this long (by the
#: records' store times) is forgotten (Kafka's transactional.id.expiration default: one day).
IDEMPOTENT_PRODUCER_TTL_MS = 86_400_000
#: A store checkpoint writes the idempotent producers' snapshot when their table changed, or else once the log
#: grew this much since the last one: a restart replays at most about this much log (``mmap.find`` skips log
#: without an idempotent record at memory speed) while a broker without idempotent producers writes it rarely.
IDEMPOTENCE_SNAPSHOT_BYTES = 64 << 20
#: Evicted producer-partitions whose owner the table remembers (``metaq.idempotence.window``), so that such a
#: producer's next put is refused with its reason (its window went past its user's quota) rather than stored as
#: a new producer's; past it the oldest is forgotten. 24 bytes and a topic name each.
MAX_EVICTED_PRODUCERS = 4096

# -- quotas per user (metaq/auth/quotas.py; docs/security.md "Quotas") -------------------------------------------
#: A user's default quota of a broker-wide limit, as a share of it (when the permissions file sets none): no single
#: user can hold more than this share of any limit a quota divides.
QUOTA_DEFAULT_SHARE = 0.5

# -- recovery (store/recovery.py, store/recovery_scan.py) ------------------------------------------------------
#: Records recovery's scan checks in one call (``recovery_scan.scan_log``, in C when built) before it hands their
#: index units to the rebuilder: the call's arrays and the batch of units it returns (16 bytes a record) stay
#: bounded however large a segment is.
RECOVERY_SCAN_RECORDS = 65536
#: Bytes of log a read may scan on the event loop to rebuild an index unit that does not name its record
#: (``unitcheck.repair_resident``): the stretch between the records before and after it, every page of it (and of
#: theirs) already in memory. A longer stretch, or a page not resident, is left to the next start or catch-up
#: (``unitcheck.check_units``) and the read answers 512 meanwhile: the loop never reads the disk for it.
UNIT_REPAIR_READ_BYTES = 256 * 1024

# -- the broker's put-burst fast path (server/text/fastput.py) -------------------------------------------------
#: Frames the fast path scans first at the head of a receive buffer; while every frame scanned is taken it scans
#: twice as many next. So a pipeline of puts the general path must answer one by one (refused: a partition the
#: topic does not have, a forbidden topic) costs a scan of at most this many frames each, not of the whole rest
#: of the buffer (which made such a pipeline quadratic), and a producer's pipeline of 64 is one scan.
BURST_SCAN_FRAMES = 64

# -- compressed bodies (protocol/compression.py, loop/inflate.py) ----------------------------------------------
#: A compressed body arriving at the broker is decompressed this many bytes at a time, other clients served
#: between two steps (a step is shorter than a thread hop), never past ``limits.max_body_bytes`` in all: a zip bomb
#: costs the broker at most that much output before it is refused. zstd decompresses a frame in one step.
INFLATE_STEP_BYTES = 256 * 1024

# -- tag filtering in the broker (docs/messaging.md "Tag filtering") ---------------------------------------------------
#: Index units one filtered read (a remoting pull with a TAG subscription, a text ``get_tags``) looks at past its
#: offset, matching or not (256 KiB of index). A read that meets no wanted record within them answers with the
#: offset after them (PULL_RETRY_IMMEDIATELY / an empty ``get_tags`` reply), so a long run of unwanted records
#: costs a bounded scan per request and never looks like the partition's end.
MAX_FILTER_SCAN_UNITS = 16384
#: Longest tag expression (UTF-8 bytes) a filtered read accepts; it fits a text line with the longest names.
MAX_TAG_EXPRESSION_BYTES = 1024
#: Most distinct tags one expression may name.
MAX_FILTER_TAGS = 64
#: Longest SQL92 filter expression (characters) the broker compiles (filters/sql.py): it fits a text line, and
#: compiling one costs a bounded time.
MAX_SQL_FILTER_CHARS = 4096
#: Deepest nesting of a SQL92 filter: parentheses, prefix operators (NOT, + and -) and chained comparisons
#: (``a = b = c``) each count one level; the parser and the compiled predicate recurse once per level.
MAX_SQL_FILTER_DEPTH = 32
#: Body bytes a text ``get_sql`` may announce for its expression: the longest expression in 4-byte characters.
MAX_SQL_FILTER_BYTES = 4 * MAX_SQL_FILTER_CHARS
#: Most string literals of one SQL92 ``IN (...)`` list.
MAX_SQL_FILTER_IN_ITEMS = 256
#: Records a SQL92-filtered read (a RocketMQ pull, a text ``get_sql``) reads and evaluates at most per request
#: (each one read and its properties decoded: no index hash can skip it, as a tag's can); a read that finds no
#: match within them answers the offset after them (PULL_RETRY_IMMEDIATELY / an empty ``get_sql`` reply), as a
#: tag filter's scan does.
MAX_SQL_FILTER_SCAN = 1024
#: (consumer group, topic) pairs whose SQL92 subscription the remoting port keeps from heartbeats
#: (filters/remoting.py); when full, pairs of groups without a live member go first, then a heartbeat adding
#: one more is refused.
MAX_SQL_SUBSCRIPTIONS = 10_000
#: SQL92 subscriptions one RocketMQ heartbeat may carry (over all its groups; real clients carry a handful): each
#: new or changed one is compiled on the loop (up to a few ms for the longest), so more is INVALID_PARAMETER and
#: nothing of the heartbeat recorded.
MAX_HEARTBEAT_SQL_SUBSCRIPTIONS = 16
#: Compiled SQL92 expressions the broker keeps by their text (filters/sql.py ``compiled``; RocketMQ's parser
#: keeps 100): a pull consumer's every pull, and a text consumer's every get_sql, carry the same expression.
SQL_FILTER_CACHE = 256
#: Parsed tag expressions the broker keeps by their text (filters/wire.py ``parse_tag_expression``): a consumer's
#: every receive or pull carries the same expression.
TAG_FILTER_CACHE = 256

# -- the key index (keys/index.py; docs/messaging.md "Key index") --------------------------------------------------
#: Keys of one message the key index takes (RocketMQ's space-separated ``KEYS`` words, then ``UNIQ_KEY``); the
#: ones past it are stored with the message but not indexed, so a message with 10,000 keys costs 32 entries.
MAX_KEYS_PER_MESSAGE = 32
#: Longest key (UTF-8 bytes) the key index takes; a longer one is not indexed, and a lookup of one is refused.
MAX_KEY_BYTES = 128
#: Messages one key lookup returns at most (a page: QUERY_MESSAGE's maxNum and a text ``lookup``'s count are
#: cut to it); the rest comes with the cursor the page ends with.
MAX_KEY_QUERY_RESULTS = 64
#: Record bytes one lookup page returns at most (at least one record): a page of 64 large messages stays bounded.
MAX_KEY_QUERY_BYTES = 4 << 20
#: Index entries one lookup page walks at most, matching or not (hash collisions, other times, gone records):
#: a page that meets no more within them ends with a cursor, so a popular key in a narrow time window costs a
#: bounded walk per request.
MAX_KEY_SCAN_ENTRIES = 8192
#: Commit-log bytes the key index takes in one step (``MessageStore.follow_log``, driven by the flusher's indexer
#: greenlet after each flush round's waiters are answered, other greenlets running between two steps, until it
#: reaches the flushed end). Records without a key are passed over at memory speed whatever the step; a step of
#: keyed records (every RocketMQ message holds a UNIQ_KEY, indexed in Python) holds the loop well under a turn.
KEY_INDEX_STEP_BYTES = 256 << 10
#: Seconds after a failed step of the log follower (a full disk while the key index made a file, say) before it is
#: tried again, besides after each flush round: a broker (an idle slave) that writes nothing after space returns
#: still brings its derived indexes up to the log.
LOG_FOLLOW_RETRY_S = 1.0
#: Most log bytes one call of the key index's C walk (``keyed_records``) covers: it returns the offsets of the
#: records with attributes in one list, so an open that indexes a whole 1 GiB segment of small keyed records
#: holds at most this many bytes' worth of them (a Python int per record), not the segment's.
KEY_INDEX_WALK_BYTES = 4 << 20
#: Longest lookup cursor (``<file>:<entry>``, two decimal numbers) a request may carry.
MAX_KEY_CURSOR_BYTES = 48

# -- the HTTP port (metaq/server/http/, docs/operating.md "The HTTP port") ---------------------------------------------

#: Bytes of an HTTP request line, its CRLF included: past it the port answers 414 and closes. gevent.pywsgi's
#: ``MAX_REQUEST_LINE`` is the same figure (its handler answers the 414; tests/server/test_http_unit.py checks).
HTTP_MAX_REQUEST_LINE = 8192

#: Bytes of an HTTP request's header lines together: past it the port answers 431 and closes.
HTTP_MAX_HEADER_BYTES = 16 * 1024

#: Bytes of an HTTP request body (an HTTP put's payload and attribute): a larger Content-Length is answered
#: 413 without reading the body, and the connection closed. The text port's default ``max_body_bytes``.
HTTP_MAX_BODY_BYTES = MAX_BODY_BYTES

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

# -- MQTT (metaq/mqtt/: the codec and the topic rules) ----------------------------------------------------------------

#: Largest MQTT control packet a peer may send, its fixed header included (MQTT 5's Maximum Packet Size counts the
#: same bytes): a Remaining Length that would pass it is refused (MQTT 5 reason 0x95) as soon as the length field is
#: read, before a byte of the body is kept. A message's payload lands in the log, so the log's body limit is the
#: figure; the protocol's own ceiling is 268,435,460 bytes.
MQTT_MAX_PACKET_BYTES = MAX_BODY_BYTES
#: Longest MQTT topic name or topic filter, in UTF-8 bytes: the protocol's own ceiling (a string's two-byte length).
MQTT_MAX_TOPIC_BYTES = 65_535
#: Most levels (``/``-separated) an MQTT topic name or filter may have: a filter's match walks its levels, so one
#: topic of 30,000 empty levels does not cost 30,000 steps per message matched.
MQTT_MAX_TOPIC_LEVELS = 128
#: QoS 1 and 2 PUBLISHes a client may have unacknowledged on one connection (``mqtt.receive_maximum``; MQTT 5's
#: Receive Maximum, told in the CONNACK): a QoS 1 until its PUBACK, a QoS 2 until its PUBCOMP. One more is refused
#: (MQTT 5: DISCONNECT 0x93; 3.1.1: closed). It bounds each session's QoS 2 packet-id state too.
MQTT_RECEIVE_MAXIMUM = 64
#: QoS 0 and 1 PUBLISHes (not retained) of one connection stored together as one burst (the store's burst path: one
#: append, the stats counted once, their PUBACKs sent together once the burst's flush and replication modes let them
#: be acknowledged). A socket read's PUBLISHes are gathered until the burst holds this many, or
#: ``MQTT_PUBLISH_BURST_BYTES`` of records, or another packet, the end of the read or the reader's turn comes: then
#: they are stored, in their order, before anything after them is handled.
MQTT_PUBLISH_BURST = 128
#: Record bytes one MQTT publish burst gathers at most (``MQTT_PUBLISH_BURST``): past it the burst is stored at once.
MQTT_PUBLISH_BURST_BYTES = 1024 * 1024
#: Metaq topics an MQTT connection keeps the write decision of across its turns (``Publishes.decided``: asked again
#: only once something it reads changed, ``PutPath.decision_stands``): a device publishes to a few; past the count
#: the kept decisions start again.
MQTT_KEPT_DECISIONS = 32
#: Topic names whose staging plans (``records.plain_plan``) and metaq topics whose write decisions an MQTT connection
#: keeps while it is parked (``Publishes.parked``): a device's next PUBLISH to one of them is split and staged in one
#: step from the first packet of its next turn. A connection that used more keeps none (its next turn makes them).
MQTT_PARKED_PLANS = 2
#: How long an idle MQTT connection keeps its greenlet before it parks (the connection core's ``park_after_s``): a
#: client that sends again within it is read at once (a busy publisher, a subscriber's acknowledgements), one whose
#: next packet is later (a device's telemetry, its keep-alive) holds no greenlet meanwhile.
MQTT_PARK_AFTER_S = 0.05

#: Greenlets the connection core keeps waiting for a woken parked connection's turn (``ConnectionCore.wake``): a
#: device's message, a turn of its own each time, runs in one kept from an earlier turn instead of a greenlet made and
#: ended (and the interpreter's frame memory each new greenlet maps and gives back). More turns at once make more;
#: past this many idle, a finished one ends.
MAX_IDLE_TURN_GREENLETS = 16
#: QoS 1 and 2 messages the broker has sent one connection and not yet had acknowledged (``mqtt.max_inflight``;
#: lower when the client's own Receive Maximum is): delivery to it waits until an acknowledgement makes room.
MQTT_MAX_INFLIGHT = 32
#: Topic filters one MQTT session may hold (``mqtt.max_subscriptions``): one more is refused in the SUBACK (MQTT 5:
#: 0x97 Quota exceeded; 3.1.1: 0x80).
MQTT_MAX_SUBSCRIPTIONS = 64
#: Topics a filter that starts with a wildcard (``#``, ``+/x``) reads (``mqtt.max_wildcard_topics``): such a filter
#: reads every topic its user may read; a SUBSCRIBE that would read more is refused (0x97 / 0x80), and topics that
#: appear later past the bound are not read (logged once).
MQTT_MAX_WILDCARD_TOPICS = 256
#: Rules of ``mqtt.topic_map`` (MQTT topic filter -> metaq topic, first match wins; docs/mqtt.md "Topics"): a
#: configuration with more is refused at the start. Each new topic name is matched against them once (the broker
#: remembers a name's topic), each SUBSCRIBE's filter against all of them.
MQTT_MAX_TOPIC_RULES = 256
#: MQTT topic names whose metaq topic the broker remembers (``TopicMap.place``; the most recent, a device repeats
#: the same few): a name not among them is matched against the rules again.
MQTT_PLACED_NAMES = 4096
#: Longest MQTT client identifier, in UTF-8 bytes (``mqtt.max_client_id_bytes``; the specification asks for 23 at
#: least): a longer one is refused in the CONNACK (0x85 / 0x02).
MQTT_MAX_CLIENT_ID_BYTES = 128
#: Topic aliases one MQTT 5 client may set on a connection (``mqtt.topic_alias_maximum``, told in the CONNACK): an
#: alias past it is refused (DISCONNECT 0x94).
MQTT_TOPIC_ALIAS_MAXIMUM = 16
#: Topic aliases the broker sends one MQTT 5 connection at most (``mqtt.max_outbound_aliases``; never past the Topic
#: Alias Maximum of the client's CONNECT, 0 there: none): a name's first delivery takes a free one. Past them the
#: alias least recently used goes to a name delivered again, sent with it again, when that alias was not used since
#: the name's previous delivery; the topic names delivered without an alias it remembers per connection until then
#: are bounded by this too (each a reference to a name, so a connection holds at most twice this many)
#: (``mqtt.topics.OutboundAliases``).
MQTT_MAX_OUTBOUND_ALIASES = 64
#: The longest Keep Alive the broker accepts, in seconds (``mqtt.max_keep_alive_s``; 0: no bound, the default). An
#: MQTT 5 client asking for more, or for none (0), is told this one in the CONNACK (Server Keep Alive) and held to
#: it (closed after 1.5 times it without a packet); an MQTT 3.1.1 one is refused (CONNACK 0x02), as Mosquitto's
#: ``max_keepalive`` does, 3.1.1 having no way to tell it.
MQTT_MAX_KEEP_ALIVE_S = 0
#: Will messages the broker holds for their MQTT 5 Will Delay at once (``mqtt.max_delayed_wills``): past it a will is
#: published at once, as if its delay were 0.
MQTT_MAX_DELAYED_WILLS = 10_000
#: Records one MQTT delivery read takes from a partition (its bytes are bounded by the reply budget and
#: ``store.max_transfer_size``).
MQTT_DELIVERY_BATCH = 64
#: Subscribers a publisher's burst serves itself, at most, right after its append (``MqttPort.deliver_now``): those
#: whose delivery waits caught up on the burst's partitions, each with one read of at most ``MQTT_DELIVERY_BATCH``
#: records and writes that never wait; the others (and anything the writes cannot take) are their deliveries' own.
MQTT_DIRECT_DELIVERIES = 8
#: Records the MQTT deliveries keep decoded, with their QoS 0 PUBLISHes encoded, for the other subscribers that get
#: the same message (``mqtt.decoded.Decoded``): the most recently read ones; past it the oldest is decoded again.
MQTT_SHARED_DECODES = 1024
#: Topic names one MQTT delivery keeps the match of against its session's filters (``Outbound.decision``): past it
#: all are matched again; a change of the session's subscriptions drops them at once.
MQTT_KEPT_MATCHES = 64
#: The longest topic name (characters) the broker keeps anything for: a delivery's match (``MQTT_KEPT_MATCHES``),
#: the name's metaq topic (``MQTT_PLACED_NAMES``), its record attribute
#: (``MQTT_ATTRIBUTE_CACHE``), a connection's staging plan (``MQTT_PLAIN_PLANS``). A longer one (names may be 65,535
#: bytes) is matched, placed and encoded at every message, so what is kept stays within those counts times this.
MQTT_KEPT_NAME = 256
#: Attributes of PUBLISHes without MQTT 5 properties remembered, by (topic name, QoS, client id, retain): the most
#: recent ones (``records.record_data``; names up to ``MQTT_KEPT_NAME``).
MQTT_ATTRIBUTE_CACHE = 4096
#: Bytes (payloads and encoded PUBLISHes) those records may hold together, for each of the two kinds: past it the
#: oldest go first, so large messages are kept fewer.
MQTT_SHARED_DECODES_BYTES = 2 * 1024 * 1024
#: How often a connection whose filters start with a wildcard looks for topics created since (seconds); it is also
#: the longest a delivery waits for an append before it looks again.
MQTT_TOPIC_RESCAN_S = 1.0
#: How often a persistent MQTT session's read positions and messages in flight are written to the sessions' log
#: (``%MQTT%``) while they change (seconds): one record per session per interval at most, whatever it delivers, so
#: the log's write amplification is bounded; after a kill -9 what was delivered in the last interval is delivered
#: again (at least once). Subscriptions, QoS 2 packet ids and ends of sessions are written at once.
MQTT_SESSION_SAVE_INTERVAL_S = 1.0
#: How often the MQTT port looks whether this broker may keep sessions and wills (seconds): a master that stops
#: being one (deposed, its lease run out, isolated) closes the connections holding them within this much, and one
#: that becomes master publishes the wills left in the sessions' log as soon.
MQTT_ROLE_CHECK_S = 0.1
#: How often a will whose publish a passing refusal stopped (a full disk, a write no slave could confirm) is tried
#: again while its broker keeps sessions (seconds); it stays in the sessions' log until published.
MQTT_WILL_RETRY_S = 1.0
#: Wills waiting for a passing refusal to end whose record the sessions' log no longer holds (their client id
#: recorded a newer will meanwhile): kept in memory, tried again with the others; past it the oldest is dropped
#: (logged). Those the log still holds are bounded by the log.
MQTT_MAX_DETACHED_WILLS = 10_000
#: How long a master that may confirm no write (``sync``, no member in sync; ``mqtt.unconfirmable_grace_s``) keeps
#: the connections holding a persistent session or a will open (seconds): a slave's restart does not close every
#: device. New CONNECTs are refused meanwhile; past it they are closed (Use another server), and their wills wait
#: this long again once it may write, for their clients to come back, before they are published.
MQTT_UNCONFIRMABLE_GRACE_S = 10.0
#: Sessions kept for clients that are not connected (``mqtt.max_offline_sessions``): when one more goes offline, the
#: one offline longest is ended (its client's next CONNECT gets Session Present 0).
MQTT_MAX_OFFLINE_SESSIONS = 10_000
#: Longest a session is kept for a client that is not connected (``mqtt.offline_session_max_age_s``, seconds): an
#: MQTT 3.1.1 persistent session (which has no expiry of its own) and an MQTT 5 one with a longer expiry interval
#: end then.
MQTT_OFFLINE_SESSION_MAX_AGE_S = 7 * 24 * 3600
#: How far (bytes of log) a session's last record may fall behind the log's written end before it is written again
#: at the end, so that retention can delete the segments below it: the sessions' log needs only each session's last
#: record, and this bounds how much log the sessions keep (the rewrite costs one record per session per this much).
MQTT_SESSION_REWRITE_BYTES = 64 * 1024 * 1024
#: Retained messages the broker keeps (``mqtt.max_retained``): a retained PUBLISH to one more topic name is refused
#: (MQTT 5: 0x97 Quota exceeded in its PUBACK or PUBREC; 3.1.1: closed, as every refused PUBLISH).
MQTT_MAX_RETAINED = 10_000
#: Payload and property bytes of every retained message together (``mqtt.max_retained_bytes``): a retained PUBLISH
#: that would pass it is refused as one past ``mqtt.max_retained`` is.
MQTT_MAX_RETAINED_BYTES = 64 * 1024 * 1024
#: Largest record of one session (its subscriptions, read positions, packet ids): a session that would need more is
#: not saved (logged; it lives as long as its connection), the bound being what a replay holds per record.
MQTT_MAX_SESSION_RECORD_BYTES = 1024 * 1024

#: A client id is the cluster's (metaq/mqttcluster/; docs/mqtt.md "A client id across the cluster").
#: Client ids one home broker's registry holds at most (id -> the broker holding its session), the default of
#: ``mqtt.cluster_max_ids``: a CONNECT whose id would be one more is refused (MQTT 5: 0x97 Quota exceeded; 3.1.1:
#: 0x03 Server unavailable). It bounds the home's memory for the registry (an entry per id).
MQTT_CLUSTER_MAX_IDS = 1_000_000
#: ``mqtt.cluster_holder_share_percent``: the share of a home's registry (``mqtt.cluster_max_ids``) one other member
#: may hold, in percent (at least one id),
#: so that no member (busy, or lying in its ``hold`` calls) takes every slot from the others and the home's own
#: devices: past it its CONNECT of an id homed there is refused as by a full registry, its holds not registered.
MQTT_CLUSTER_HOLDER_SHARE_PERCENT = 50
#: Seconds a broker-to-broker call (a takeover's registration, a holder giving its session up, a batch of ids)
#: waits for its answer, the connection and the handshake included; then the peer counts as unreachable.
MQTT_CLUSTER_CALL_TIMEOUT_S = 5.0
#: Bytes of one broker-to-broker call or answer (the PEER_CALL / PEER_REPLY frames' JSON): a session handed over
#: with its messages must fit (MQTT_HANDOVER_MAX_BYTES, base64 and the frame around it).
MQTT_CLUSTER_MAX_CALL_BYTES = 32 * 1024 * 1024
#: Messages a session taken over from another broker brings along at most (in flight and queued: what it has not
#: acknowledged); past it the oldest are kept and the rest are dropped, counted and logged.
MQTT_HANDOVER_MAX_MESSAGES = 10_000
#: Bytes of the messages a session brings along at most (their stored records), likewise.
MQTT_HANDOVER_MAX_BYTES = 16 * 1024 * 1024
#: Seconds a broker taking a session over from another waits at most, before its CONNACK, for the takeover's end:
#: its peers acting on its route with the session's filters (ROUTED), then the old broker's handover of what reached
#: it for the session after it gave it up. Well within the holder's wait for a CONNECT to go live (a move back
#: meanwhile waits for this one); past it the CONNECT goes on with what came (logged, counted).
MQTT_HANDOVER_END_S = 0.5
#: Seconds a broker that gave a session up keeps the session's filters in its route (its peers go on copying for
#: it) and the place its handover ended, for the taking broker's call for the rest (the takeover's end).
MQTT_HANDOVER_LINGER_S = 10.0
#: Sessions given up whose filters and handover end a broker keeps at once for their takeover's end; past it the
#: oldest is forgotten (logged: what reached this broker for it after its handover is not handed on).
MQTT_HANDOVER_MAX_LINGERING = 10_000
#: Seconds a broker keeps a connection of a client id whose home broker it has not reached for that long (a lease,
#: renewed by a call to each member every quarter of it; ``mqtt.cluster_id_lease_s``): past it the connection is
#: closed. A home gives the id to another broker, while the holder does not answer, only once the holder's lease
#: surely ran out since the home last heard from it: two live connections of one id never overlap.
MQTT_CLUSTER_ID_LEASE_S = 4.0
#: Seconds between two readings of the cluster's members in ZooKeeper (the masters' ``replication`` nodes): a
#: broker joining or leaving is seen within this.
MQTT_CLUSTER_MEMBERS_POLL_S = 1.0
#: Client ids one re-registration call carries at most (the ids a broker holds, sent to their new home when the
#: members change), and ids one release call carries.
MQTT_CLUSTER_ID_BATCH = 1000
#: Seconds a broker gathers the ids whose sessions ended before telling their homes (one call per home).
MQTT_CLUSTER_RELEASE_S = 0.5
#: Call links one broker takes from another at most (a broker opens one to each peer and pipelines its calls on it;
#: a broker of the version before took one call a link, up to this many links): the replication port's room for them.
MQTT_CLUSTER_PEER_CONNECTIONS = 4
#: Calls one broker has in flight on its link to another at once, each with an id its answer names (answers come in
#: any order): past it a caller waits its turn, in order, within MQTT_CLUSTER_CALL_TIMEOUT_S, then is told the
#: peer is unreachable; a callee answers a call past it on one link at once with an error saying so.
MQTT_CLUSTER_CALLS_IN_FLIGHT = 16
#: Batches of CONNECTs' registrations one broker has in flight to one home at once (each a call of at most
#: MQTT_CLUSTER_ID_BATCH): a CONNECT past them joins the next batch, sent when one of them is answered.
MQTT_CLUSTER_REGISTER_BATCHES = 4
#: Of MQTT_CLUSTER_CALLS_IN_FLIGHT, the calls to one peer kept for the client ids' lease renewals: a storm of
#: registrations and handovers to that peer never starves them (the others take the rest).
MQTT_CLUSTER_LEASE_CONNECTIONS = 1
#: Seconds a master of an MQTT cluster that begins keeping sessions (its start, a promotion) holds its CONNACKs and
#: wills until every other member follows it again, its route in (``mqtt.cluster_start_hold_s``): a message published
#: before then on a topic new here since a peer last followed would reach none of that peer's subscribers. Past it
#: the broker goes on without the peers still away (logged); they bound how long a restart keeps devices waiting.
MQTT_CLUSTER_START_HOLD_S = 10.0

# -- the gRPC port (metaq/rmq5/: RocketMQ 5's MessagingService; docs/rocketmq5.md) --------------------------------

#: Streams one HTTP/2 connection of the gRPC port may have open at once (SETTINGS_MAX_CONCURRENT_STREAMS, which the
#: port announces; grpc clients queue calls past it). A stream a client opens past it anyway is refused
#: (RST_STREAM REFUSED_STREAM, which a gRPC client retries); the connection goes on. Each open stream may hold one
#: unfinished message (GRPC_MAX_MESSAGE_BYTES).
GRPC_MAX_STREAMS_PER_CONNECTION = 100
#: Largest gRPC message a client may send (the length in its 5-byte prefix, checked before a byte of it is kept): a
#: message body of MAX_BODY_BYTES and room for its properties. Past it the call ends with grpc-status 8
#: (RESOURCE_EXHAUSTED), as grpc's own servers answer; the connection goes on.
GRPC_MAX_MESSAGE_BYTES = MAX_BODY_BYTES + 64 * 1024
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
GRPC_MAX_RENEWED_PER_USER = int(GRPC_MAX_RENEWED * QUOTA_DEFAULT_SHARE)
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

# -- admin operations (docs/operating.md "Admin commands"; admin/service.py) ----------------

#: Dead letters one ``dlq_list`` answers at most (``metaq-admin dlq list --max``); ``"more": true`` says there are more.
MAX_DLQ_LIST = 1_000
#: Dead letters one ``dlq_list`` or ``dlq_resend`` sees per partition of the dead-letter topic: the newest this
#: many (older ones are reported by ``more``). Bounds what one admin request holds; the group's resent journal is
#: read whole, in ``DLQ_SCAN_STEP`` steps, keeping only the positions of those dead letters.
MAX_DLQ_SCAN = 10_000
#: Records a dead-letter scan reads and decodes before it lets the broker's other greenlets run (a scan of
#: ``MAX_DLQ_SCAN`` in one go would hold the loop far past a turn; tests/hostile/test_i19_admin_attacks.py).
DLQ_SCAN_STEP = 256
#: Bytes of a dead letter's body a listing shows (the rest is counted in ``body_bytes``).
DLQ_BODY_PREVIEW_BYTES = 64
#: Text connections remembered as members of a group (they committed or queried its offsets and are still open):
#: past it the oldest is forgotten, so clients inventing group names cannot grow the table.
MAX_TEXT_GROUP_MEMBERS = 10_000

# -- where is my message (docs/operating.md "Where is my message"; trace/service.py) ----------------

#: Messages one trace answers at most (``metaq-admin trace --max``; a key many messages carry: the newest this many,
#: ``"more": true`` saying there are more). A request asking for more is refused.
TRACE_MAX_RESULTS = 20
#: Records of the consumer groups' retry and dead-letter topics one trace reads per message (from the message's
#: store time on) looking for its copies; past it the answer says ``"copies_complete": false``.
TRACE_MAX_COPY_SCAN = 10_000
#: Records of a partition a trace by metaq id reads from the first one stored in the id's millisecond.
TRACE_ID_SCAN = 4096
#: RocketMQ message-trace records (``RMQ_SYS_TRACE_TOPIC``) one trace shows per message; past it
#: ``"traces_complete": false``.
TRACE_MAX_RECORDS = 100

# -- consumer priorities (docs/messaging.md "Priorities"; priorities/wire.py) ----------------

#: Most priority levels a topic may have (``metaq-admin topics create --priorities L``: 2..this). Each level past
#: 0 is a partition of its own behind every partition of the topic (an index file, a map), and a ``get_prio``
#: carries one offset per level.
MAX_PRIORITY_LEVELS = 8
#: A priority topic's default ``priority_max_wait_ms``: a message at the head of its level that has waited longer
#: competes by age with the other levels (the starvation bound, docs/messaging.md "Priorities").
DEFAULT_PRIORITY_MAX_WAIT_MS = 10_000
#: The largest ``priority_max_wait_ms`` a topic may set (one day); the smallest is 1.
MAX_PRIORITY_MAX_WAIT_MS = 86_400_000

# -- timers: any delivery time (docs/messaging.md "Delayed delivery", "Any delivery time") -----------------------------

#: Furthest ahead a message may be scheduled (about 10 years): due times stay far inside int64, and a typo is caught.
MAX_DELIVER_AHEAD_MS = 10 * 366 * 86_400_000

#: The delivery greenlet keeps in memory the pending messages due within this many milliseconds of now.
TIMER_WINDOW_MS = 60_000

#: Most rows the in-memory delivery window holds (the rest wait in timers.db for the next load).
MAX_TIMER_WINDOW_ROWS = 10_000

#: ... and at most this many bytes of their messages' data (10,000 messages of ``MAX_BODY_BYTES`` due at once would
#: be 40 GB); a single message is always taken.
MAX_TIMER_WINDOW_BYTES = 64 << 20

#: Most ids one DONE record lists (a larger delivered batch writes several).
MAX_TIMER_DONE_IDS = 1_000

#: Rows of recent outcomes (delivered / cancelled) kept so a cancel can say which one happened.
MAX_TIMER_OUTCOMES = 100_000

#: Most pending timers one ``timers`` listing returns.
MAX_TIMER_LIST = 1_000

#: TIMER_TOPIC records the indexer applies per SQLite transaction.
TIMER_INDEX_BATCH = 1_000
#: Bytes of message data a batch of the timer index holds at most (one record at least): what the log follower
#: collects on the event loop for the timer service's next transaction (timers/follow.py).
TIMER_INDEX_BATCH_BYTES = 8 << 20

#: Bytes of timers.db pages SQLite keeps in memory (``PRAGMA cache_size``). Each entry adds a row to the due-time
#: index at a random place: with SQLite's default cache, a million pending meant a read of an index page per insert.
TIMER_INDEX_CACHE_BYTES = 32 << 20
#: Pages of timers.db's write-ahead log before SQLite copies them into the file (``PRAGMA wal_autocheckpoint``;
#: its default is 1,000). One batch of 1,000 entries dirties hundreds of index pages: with the default, every
#: batch was checkpointed, writing each page twice; with more, a page changed by many batches is copied once.
TIMER_INDEX_CHECKPOINT_PAGES = 16_384
#: Bytes the write-ahead log file is cut back to after a checkpoint (``PRAGMA journal_size_limit``): without it
#: the file keeps its largest size for good (a batch far larger than usual). Above a full log at the checkpoint
#: (16,384 pages of 4,120 bytes: 64.4 MiB, and the batch that crossed it), so the file is not cut and grown again
#: every cycle.
TIMER_INDEX_WAL_BYTES = 80 << 20

#: TIMER_TOPIC records a master's timer service keeps, decoded, as it writes them, so that its indexer applies them
#: without reading them back from the log and decoding them (timers/service.py ``written``). Past this many not yet
#: indexed, the newest are not kept and the indexer reads those from the log, as a slave's always does.
MAX_TIMER_FRESH = 20_000
#: ... and at most this many bytes of their messages' data (a put_at body may be up to ``max_body_bytes``).
MAX_TIMER_FRESH_BYTES = 32 << 20

#: Least milliseconds between two of the indexer's transactions (each one fsyncs timers.db): a pipeline of put_at
#: is indexed in a few large batches, not one per flush round, and its fsyncs do not crowd the log's. A message
#: due sooner than this after its put may be delivered up to this much later than due.
TIMER_INDEX_INTERVAL_MS = 20

#: Least seconds between two records of the timer store's ``scan_from`` by the delivery (an SQLite transaction each).
TIMER_SCAN_FROM_INTERVAL_S = 1.0

#: Records a consumer's fetcher remembers per partition (offset and id) to find where a broker's log and the
#: one it read diverge after a failover (client/divergence.py): per bit of a 64-bit offset, the first record read
#: in the current and in the previous block of that size, and the last one; the newest densely, older ones ever
#: sparser, back to where the fetcher began. Each is one probe at most, once per divergence.
MAX_FETCH_CHECKPOINTS = 129

#: Partitions whose fetchers' records read (``MAX_FETCH_CHECKPOINTS`` each) a consumer keeps after a rebalance
#: took them away, for the next fetcher of the same partition and offset (client/divergence.py ``ReadsKept``): a
#: failover unregisters a broker's partitions and registers them again, and without them a divergence found then
#: would go back by time (``DIVERGENCE_REWIND_MS``) instead of to the last record both logs hold. The oldest kept
#: is dropped past this many. A priority topic's partition takes one per level (priorities/client.py).
MAX_KEPT_FETCH_READS = 1024

#: When none of those records is held by the broker as read, a consumer goes back to the first message stored
#: this long before the oldest of them (client/divergence.py): longer than any election takes, so a new
#: master's first messages are not skipped (they are read again rather than lost).
DIVERGENCE_REWIND_MS = 120_000

#: Log bytes one step of a recovery's id scan reads (store/lookup.py ``IdScan``: which due timers were delivered
#: before a crash, at a start or a promotion): the event loop yields between steps, and each step's cold pages
#: are brought in off it first.
ID_SCAN_STEP_BYTES = 1 << 20

#: Bytes of the log below the flushed position whose maps stay as they are at a checkpoint (the writer, the flusher
#: and readers at the tail work there); the log before them gives its page tables back (store/coldmaps.py), so the
#: broker's resident memory does not grow with its log.
HOT_MAP_BYTES = 64 << 20

#: Record bytes read from the log after which the cold maps give their page tables back again, without waiting for
#: the disk check's second (store/coldmaps.py ``cold_reads_due``). Reading a partition touches every page of the
#: shared log its records lie on (16 partitions: about 16× the bytes read), so a consumer reading a cold backlog
#: at full speed maps gigabytes of file pages within a second; checked every ``COLD_READ_CHECK_S``.
COLD_READ_DROP_BYTES = 16 << 20
COLD_READ_CHECK_S = 0.1

#: Per-message acknowledgement (POP, metaq/pop/; docs/messaging.md "Per-message acknowledgement (POP)").
#: Messages one receive hands out at most (RocketMQ's proxy caps a receive's batch at 32).
POP_MAX_BATCH = 32
#: Messages of one group and topic handed out and not acknowledged at most (in flight, expired ones included): a
#: receive past it hands out only redeliveries.
POP_MAX_IN_FLIGHT = 4096
#: Offsets of one partition a group may be ahead of its lowest unacknowledged one: bounds the acknowledgements kept
#: out of order (one slow message does not let the set grow without end).
POP_MAX_SPAN = 8192
#: (group, topic) pairs the POP state holds at most: a receive for one more is refused (503).
POP_MAX_GROUPS = 1024
#: The invisible duration a receive or change_invisible may ask for, inclusive (RocketMQ: up to 12 hours).
POP_MIN_INVISIBLE_MS = 100
POP_MAX_INVISIBLE_MS = 12 * 3600 * 1000
#: Deliveries of one message before it goes to its group's dead-letter topic (RocketMQ's default is 16 retries).
POP_MAX_ATTEMPTS = 16
#: Bytes of POP journal records written since the last snapshot after which the next call writes a snapshot (the
#: journal's retention floor moves up to it).
POP_SNAPSHOT_BYTES = 8 << 20
#: Characters of a message group (FIFO) the POP state keeps; a longer name is kept as its start and a checksum.
POP_MAX_MESSAGE_GROUP_CHARS = 128
#: Receipt handles one ack takes at most (a text ack line holds them, comma-separated, within MAX_LINE_BYTES).
POP_MAX_ACK_HANDLES = 32

# -- MQTT across a cluster (metaq/mqttcluster, docs/architecture.md "MQTT across the cluster") ----------------------
#: MQTT filters one broker's route holds (the union of its sessions' filters, sent to every peer): past it the route
#: names whole metaq topics (``<topic>/#`` and ``<topic>``, or ``#``) instead, so a peer sends more than is wanted
#: (the subscriber's broker filters as ever) and nothing is missed.
MQTT_CLUSTER_MAX_FILTERS = 10_000
#: Bytes of one ROUTES frame (the filters, resume positions and groups a broker sends a peer) at most. A route past it
#: (MQTT_CLUSTER_MAX_POSITIONS positions of long topic names, long filters) goes in as many ROUTES frames as it takes,
#: joined by the peer before it acts on them, within MQTT_CLUSTER_MAX_FILTERS, _POSITIONS and _GROUPS in all.
MQTT_CLUSTER_ROUTES_BYTES = 4 * 1024 * 1024
#: Bytes of records a peer puts in one RECORDS frame (it stops adding at the first record past it; one record alone
#: may be larger, within MQTT_CLUSTER_FRAME_BYTES).
MQTT_CLUSTER_BATCH_BYTES = 1024 * 1024
#: Bytes of one RECORDS frame at most (checked from its header before it is buffered).
MQTT_CLUSTER_FRAME_BYTES = 16 * 1024 * 1024
#: (topic, partition) pairs a peer's link follows at most; past it the topics that do not fit are not followed (the
#: serving broker logs it). Also the partitions a serving broker remembers of a peer's ended follow (where it started
#: those the peer sent no position for: ``serve.PeerServer.since``).
MQTT_CLUSTER_MAX_FOLLOWED = 65_536
#: Peers (other masters) a broker keeps a link to at most; past it the lowest broker ids are kept and it logs it.
#: Also the peers whose ended follows a serving broker remembers (the oldest forgotten past it).
MQTT_CLUSTER_MAX_PEERS = 64
#: Connections the other masters of an MQTT cluster on one host may hold on a broker's replication port once each
#: proved the replication secret (a follow link and MQTT_CLUSTER_PEER_CONNECTIONS call links from each of up to
#: MQTT_CLUSTER_MAX_PEERS): a proved peer leaves its address's HEADROOM_PER_ADDRESS share for this one, so one host
#: may run as many brokers of a cluster as it has cores. Past it the peer is refused and retries.
MQTT_CLUSTER_PEERS_PER_ADDRESS = (1 + MQTT_CLUSTER_PEER_CONNECTIONS) * MQTT_CLUSTER_MAX_PEERS
#: File descriptors a broker of an MQTT cluster keeps for its outgoing links at most (a follow link and
#: MQTT_CLUSTER_PEER_CONNECTIONS call links to each of MQTT_CLUSTER_MAX_PEERS peers), on top of FD_RESERVE.
MQTT_CLUSTER_LINK_FDS = (1 + MQTT_CLUSTER_PEER_CONNECTIONS) * MQTT_CLUSTER_MAX_PEERS
#: Connections the replication port of a broker in an MQTT cluster takes past the connection cap besides
#: REPLICATION_HEADROOM: its peers' links in, what each of up to MQTT_CLUSTER_MAX_PEERS peers opens to it (its own
#: MQTT_CLUSTER_LINK_FDS seen from this side), so that clients filling the cap never keep a peer out. Kept back
#: from the open-files limit too (``fd_reserve_for``); one host still holds at most HEADROOM_PER_ADDRESS of it
#: unproved and MQTT_CLUSTER_PEERS_PER_ADDRESS proved.
MQTT_CLUSTER_PEER_HEADROOM = MQTT_CLUSTER_LINK_FDS
#: Partitions of the inbox (``%MQTTIN%``), the internal topic a broker copies its peers' messages into.
MQTT_CLUSTER_INBOX_PARTITIONS = 8
#: (origin broker, topic, partition) resume positions a broker keeps at most (recovered from its inbox).
MQTT_CLUSTER_MAX_POSITIONS = 262_144
#: Retained messages of peers a broker keeps at most (with their clears), beside its own ``mqtt.max_retained``.
MQTT_CLUSTER_MAX_RETAINED = 100_000
#: ``$share`` groups (share name, filter) one broker's route carries at most; past it the others are not sent (their
#: members on this broker receive only what is published here) and it logs it. A decoded ROUTES holds at most as many.
MQTT_CLUSTER_MAX_GROUPS = 10_000
#: Membership changes of one ``$share`` group a broker keeps at most, in its sessions' log (from which log position on,
#: which brokers had members): a message is assigned by the brokers of the last change at or before its place in the
#: log. A change goes once the log's start passes the change after it (nothing it assigns can be read); past this
#: bound the oldest goes sooner, counted (``mqtt_cluster_share_changes_forgotten``), and a record older than the
#: oldest kept change, read by a reader that far behind, is assigned as by it.
MQTT_CLUSTER_SHARE_HISTORY = 64
#: Largest weight of a broker in a ``$share`` group's assignment: its members in the group, counted up to this (a
#: broker's share of the group's messages is its weight over the sum; 0: the group is kept there for persistent members
#: away, and takes a share only while no broker has a member connected). A ROUTES or a history with a weight outside
#: 0..this is refused.
MQTT_CLUSTER_SHARE_WEIGHT_MAX = 65_535
#: Seconds a change in the number of a group's members on a broker waits before it goes into its weight (the route
#: sent again, a change in each group's history in the sessions' log): a burst of members joining costs one change per
#: group, not one per member. A group's first member here or its last leaving goes at once.
MQTT_CLUSTER_SHARE_SETTLE_S = 10.0
#: How far (percent of the weight a route carries) a group's members on a broker may move before its weight changes:
#: members coming and going around a count change nothing, so a group's history (at most MQTT_CLUSTER_SHARE_HISTORY
#: changes) spans its real changes, not its members' churn. A broker's share is so within this of its members' share.
MQTT_CLUSTER_SHARE_WEIGHT_STEP_PERCENT = 25

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
