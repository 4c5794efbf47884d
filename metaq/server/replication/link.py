"""What the two ends of replication share: timing constants, the status code of a refusal, framing."""

from metaq.protocol import replication as rp

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


def send_event(sock, event):
    for part in rp.frame_parts(event):
        sock.sendall(part)
