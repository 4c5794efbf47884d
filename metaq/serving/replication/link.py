"""What the two ends of a replication link share (a slave's and its master's, a peer broker's MQTT follow and
its server): timing constants, the status code of a refusal, framing, a follower's next event and its side of the
handshake."""

import time

from metaq import errors
from metaq.protocol import replication as rp
from metaq.protocol.stream import CLOSED, NEED_DATA
from metaq.serving.replication import handshake

HEARTBEAT_S = 1.0
#: While streaming, a heartbeat (the master's ends and message count) goes out this often: the slave's lag figures
#: are at most this old when the master dies.
HEARTBEAT_BUSY_S = 0.1
POLL_S = 0.02
#: The master sends its consumer offsets that changed at most this often (and its whole table once per link, as soon
#: as the slave has caught up or this long after the link came up): a slave's copy is about this old.
OFFSETS_SYNC_S = 1.0
HELLO_TIMEOUT_S = 10.0
#: A link that hears nothing (no DATA, no HEARTBEAT) for this long is considered dead.
LINK_TIMEOUT_S = 10.0
#: A slave whose master was silent longer than this before the link went down does not know the master's end: the
#: master may have gone on acknowledging (another slave confirming a ``sync`` put, or ``async``), so it is not
#: "caught up" whatever it last heard (three heartbeats: a master that dies is heard of within one).
CAUGHT_UP_SILENCE_S = 3 * HEARTBEAT_S
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.1, 2.0
RECV_BYTES = 1 << 20

#: MetaQ-style status codes sent in ERROR frames.
ERR_REFUSED = 409


#: A frame of at most this many bytes is joined and written by one send (its header, its fields, a DATA's log bytes):
#: one system call, and on a TCP_NODELAY link no segment holding one part alone; a larger one goes part by part, its
#: log bytes not copied.
SEND_JOINED_BYTES = 64 * 1024


def send_event(sock, event):
    """Write ``event``'s frame to ``sock`` whole: up to SEND_JOINED_BYTES by one ``send`` (and ``sendall`` of what
    the socket did not take), past it part by part."""
    parts = rp.frame_parts(event)
    if sum(map(len, parts)) <= SEND_JOINED_BYTES:
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        sent = sock.send(data)  # one call: gevent's sendall asks the socket's buffer size first when it has a timeout
        if sent < len(data):
            sock.sendall(memoryview(data)[sent:])
        return
    for part in parts:
        sock.sendall(part)


def next_event(sock, parser, deadline=None, waiting_for=None):
    """A follower's next event from its master (a slave's, or a peer broker's MQTT follow); during the handshake
    (``deadline``, absolute) the wait for it ends there. An ERROR ends the link (Unauthenticated or Unavailable)."""
    while True:
        event = parser.next_event()
        if event is NEED_DATA:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError("no %s from the master within %.0f s of connecting (a master older "
                                       "than replication stream version %d says nothing first)"
                                       % (waiting_for, HELLO_TIMEOUT_S, rp.VERSION))
                sock.settimeout(remaining)
            try:
                data = sock.recv(RECV_BYTES)
            except TimeoutError:
                if deadline is not None:
                    continue  # the deadline check above names what was missing
                raise  # socket.timeout (an OSError) when the master is silent
            parser.receive_data(data)
            continue
        if event is CLOSED:
            raise ConnectionError("the master closed the replication link")
        if isinstance(event, rp.ErrorFrame):
            cls = errors.Unauthenticated if event.code == errors.Unauthenticated.code else errors.Unavailable
            raise cls("the master refused replication (%d): %s" % (event.code, event.text))
        return event


def authenticate(sock, parser, secret, ident, request, next_event_, after):
    """A follower's side of the handshake (``handshake``): the master's CHALLENGE, our PROOF (over ``ident``: a
    slave's id, a peer broker's id, with the peers' sides of the proof) and ``request`` (a slave's HELLO, a peer's
    ROUTES), the master's PROOF checked, all within HELLO_TIMEOUT_S; returns the event after its PROOF (``after``
    names it). Unauthenticated when either side refuses: nothing the master said has been acted on."""
    deadline = time.monotonic() + HELLO_TIMEOUT_S
    challenge = next_event_(sock, parser, deadline, "CHALLENGE")
    if not isinstance(challenge, rp.Challenge):
        raise errors.RemoteProtocolError("expected CHALLENGE, got %s" % type(challenge).__name__.upper(), fatal=True)
    peer = not isinstance(request, rp.Hello)  # a peer broker proves itself as peers do (handshake.peer_proof)
    ours, refusal = (handshake.peer_proof if peer else handshake.slave_proof)(secret, challenge, ident)
    if refusal is not None:
        send_event(sock, rp.ErrorFrame(errors.Unauthenticated.code, refusal))
        raise errors.Unauthenticated(refusal)
    send_event(sock, ours)
    send_event(sock, request)
    theirs = next_event_(sock, parser, deadline, "PROOF")
    refusal = "%s: it sent %s instead of its PROOF" % (handshake.SLAVE_REQUIRES, type(theirs).__name__.upper())
    if isinstance(theirs, rp.Proof):
        refusal = (handshake.check_callee if peer else handshake.check_master)(secret, challenge.nonce, ours.nonce,
                                                                               ident, theirs)
    elif secret is None:
        raise errors.RemoteProtocolError("expected PROOF, got %s" % type(theirs).__name__.upper(), fatal=True)
    if refusal is not None:
        send_event(sock, rp.ErrorFrame(errors.Unauthenticated.code, refusal))
        raise errors.Unauthenticated(refusal)
    return next_event_(sock, parser, deadline, after)
