"""Named limits and name validation shared by every layer (stdlib only), and the registry of every limits module.

Each limit below is a default; the broker configuration (``limits:`` in
``conf/server.yaml``) may change the configurable ones. Every declared length
is checked against one of these before memory is allocated for it.

What every layer shares lives here: line and body sizes, the connection and open-files budget, timeouts, logging
in, TLS and proxies, name validation. A feature's own limits live beside its code, in a ``limits.py`` of its package
(metaq/mqtt/limits.py, metaq/store/limits.py, metaq/server/remoting/limits.py, ...): each a limits module like this
one (stdlib, errors and other limits modules only, so any layer may read it). ``modules`` finds them all, for what
reads every limit (the docs' checks).
"""

import os
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

#: File descriptors kept back from RLIMIT_NOFILE when computing the connection cap: the store's part and the
#: replication port's headroom. A broker in an MQTT cluster keeps its peers' links in and its own out too
#: (MQTT_CLUSTER_PEER_HEADROOM and MQTT_CLUSTER_LINK_FDS: ``fd_reserve_for``).
FD_RESERVE = FD_STORE_RESERVE + REPLICATION_HEADROOM

#: Connections one address may hold on a port with headroom of its own, so that one host cannot take the whole
#: headroom. On the replication port one host's brokers use one per slave of this master; the other masters of an
#: MQTT cluster count here only until they prove the secret (then MQTT_CLUSTER_PEERS_PER_ADDRESS).
HEADROOM_PER_ADDRESS = 16

#: Passes of the cyclic collector's middle generation between two of its full passes (Python's default: 10). A full
#: pass walks every object the broker holds, and with the default a broker that grows fast (a fleet connecting) walks
#: them every 70,000 objects it keeps. What the broker lets go is freed by reference counting (an ended connection
#: keeps no cycle) and short-lived cycles die in the young passes, so full passes find little: they run a tenth as
#: often, and a cycle that outlives the young passes waits longer for them.
GC_MIDDLE_PASSES_PER_FULL = 100

#: Seconds a connection may sit with no complete request before it is closed.
IDLE_TIMEOUT_S = 600.0

#: Seconds a request (line or body) may take to arrive, from its first byte (a completed request restarts it).
REQUEST_TIMEOUT_S = 30.0

#: Longest wait a long-polling get may ask for.
MAX_WAIT_MS = 60_000

#: Most partitions one topic may have.
MAX_PARTITIONS = 1024

#: Longest topic or group name, in bytes.
MAX_NAME_BYTES = 200

#: Largest broker id (MetaQ's IdWorker has a 10-bit worker id).
MAX_BROKER_ID = 1023

_NAME_RE = re.compile(r"[A-Za-z0-9_.%-]+")
#: Names ``validate_topic`` found legal, so that a name a client gives on every call is looked up, not matched
#: again (the rule never changes: a legal name stays legal); emptied when it holds ``_LEGAL_NAMES_KEPT``.
_legal_names = set()
_LEGAL_NAMES_KEPT = 4096


def replication_headroom_for(peer_headroom=0):
    """Connections the replication port takes past the connection cap: REPLICATION_HEADROOM (a master's slaves, and
    peers not yet proved) and ``peer_headroom`` more, every link its peers may open to it (an MQTT cluster's
    ``MQTT_CLUSTER_PEER_HEADROOM``), so that clients filling the cap never keep a peer out."""
    return REPLICATION_HEADROOM + peer_headroom


def fd_reserve_for(peer_headroom=0, link_fds=0):
    """Descriptors a broker keeps back from its open-files limit for everything but its clients' connections: the
    store's part and the replication port's headroom (``replication_headroom_for``: with ``peer_headroom``, its
    peers' links in), and ``link_fds``, its own links out to its peers (an MQTT cluster's
    ``MQTT_CLUSTER_LINK_FDS``). The connection cap is the limit less this, so a full headroom never runs the
    process out of descriptors."""
    return FD_STORE_RESERVE + replication_headroom_for(peer_headroom) + link_fds


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

#: Seconds one send of a zero-copy reply (a get's records sent straight from the segment maps: server/zerocopy.py)
#: may wait on a socket that takes no more bytes while it holds those maps (a segment retention deleted keeps its
#: disk space while held). Past it the unsent rest is copied out of the maps and sent as an ordinary buffer.
MAX_PINNED_SEND_S = 2.0

#: Milliseconds a connection's greenlet handles the requests of one receive buffer (up to 256 KiB of pipelined
#: requests) before it lets the other connections run (``connections.share_loop``): a pipeline of requests that
#: each cost milliseconds (``get_tags`` scanning ``MAX_FILTER_SCAN_UNITS`` units, a ``get_prio`` over eight
#: backlogged levels) would otherwise stall every other client for the whole buffer; it stalls them about this long.
MAX_TURN_MS = 20

#: Seconds between two probes of how late the event loop runs the work queued in it (``serving.looplag``, stat
#: ``loop_lag_ms``): often enough that a stall of a fraction of a second shows, rarely enough to cost nothing.
LOOP_LAG_PROBE_S = 0.25
#: Seconds of probes the stat ``loop_lag_ms`` is the worst of: a scrape every 15-60 s sees every stall between two.
LOOP_LAG_WINDOW_S = 60.0

#: Bursts of replies one text connection may have waiting for their flush (``sync`` mode) before it stops
#: reading more requests (bounds memory per pipelining producer).
MAX_PENDING_BURSTS = 8

#: After a refusal that closes a text connection (an HTTP request on the text port, a body announced past the
#: limit): the most bytes, and seconds, of what the client still sends read and dropped before the close, so the
#: close does not reset the connection and the client reads the refusal (a refused body of up to this size is read
#: whole).
CLOSE_DRAIN_BYTES = 4 * MAX_BODY_BYTES
CLOSE_DRAIN_S = 1.0

#: Long-polling gets (``get ... maxWaitMs``) one text connection may have parked at once: one per
#: partition it consumes is the normal use. Past it the get is answered 503 at once.
MAX_PARKED_GETS_PER_CONNECTION = 1024

#: Long polls parked at once on the whole broker, text gets and remoting pulls together (each holds a
#: greenlet). Past it a get is answered 503 and a pull SYSTEM_BUSY at once.
MAX_PARKED_GETS = 20_000


def modules():
    """The dotted name of every limits module: this one and each package's ``limits.py``, found in the package's
    directory, so that no list of them is kept by hand (a new package's limits.py is among them once it exists)."""
    top = os.path.dirname(os.path.abspath(__file__))
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = [d for d in dirnames if d.isidentifier()]
        if "limits.py" in filenames:
            package = os.path.relpath(dirpath, os.path.dirname(top)).split(os.sep)
            found.append(".".join(package + ["limits"]))
    return sorted(found)


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


#: Bytes of requests begun but not yet whole (a frame or a put's body still arriving) the broker holds in all, over
#: every connection; past it a connection that would hold more stops reading until there is room, or its request
#: deadline passes: connections that each send most of a large frame and stop hold no more together.
MAX_PARTIAL_REQUEST_BYTES = 1 << 30

#: Lines of one template (logger + format string) the broker logs per LOG_WINDOW_S; past it they are
#: dropped and counted (server/logflood.py), so a client cannot fill the disk with log lines.
LOG_LINES_PER_TEMPLATE = 100
LOG_WINDOW_S = 10.0
#: Distinct templates tracked at once by that filter.
LOG_TEMPLATES = 10_000

#: Topic names the broker keeps realtime counters for (``stats topic``); names past it (clients may ask for
#: any name) share one set of counters.
MAX_STATS_TOPICS = 4096

# -- logging in, TLS and proxies (docs/security.md) ------------------------------------------------

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

#: Largest certificate, key or CA file (``security.tls.cert``/``key``/``ca``) the broker reads (a PEM bundle of
#: a few hundred CAs fits); a larger one is refused at start.
MAX_TLS_FILE_BYTES = 1024 * 1024

#: Bytes read (without waiting) from a plaintext client on a port that requires TLS before its refusal is sent
#: and the connection closed (a close with unread bytes resets the connection, which could lose the refusal).
TLS_PLAINTEXT_DRAIN_BYTES = 64 * 1024

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

#: Greenlets the connection core keeps waiting for a woken parked connection's turn (``ConnectionCore.wake``): a
#: device's message, a turn of its own each time, runs in one kept from an earlier turn instead of a greenlet made and
#: ended (and the interpreter's frame memory each new greenlet maps and gives back). More turns at once make more;
#: past this many idle, a finished one ends.
MAX_IDLE_TURN_GREENLETS = 16
