"""A peer's follow served from the turn that writes what it follows (docs/architecture.md "MQTT across the cluster"):
while a peer's follow waits caught up (its greenlet in its wait, nothing of its own to send first), a publisher's
burst just made visible is sent to that peer from the publisher's turn itself, as a subscriber waiting on this
broker is sent it (``direct.WaitingDeliveries``): the record's RECORDS frame made from the bytes the turn holds
(``PeerFollow.turn_entries``: the same entries ``PeerFollow.batch`` would read back from the log), written without
waiting, the cursor moved; the follow's greenlet is then not woken. Anything it does not take (a frame written in
part aside, which the greenlet finishes) is left to the greenlet, which the append's wake wakes.
"""

import os

from gevent import socket as gsocket

from metaq.protocol import replication as rp
from metaq.protocol.replication_mqtt import POSITION, Records


class TurnFollows:
    """The peers' follows waiting caught up now (``waiting``/``busy``, by the follow's greenlet around its wait), served
    from a writing turn (``serve``). ``confirmed_end()``: what may leave this broker (``Roles.confirmed_end``: None,
    all). ``sent_records``: the records (not POSITIONs) sent from a turn."""

    def __init__(self, confirmed_end=lambda: None):
        self.confirmed_end = confirmed_end
        self._idle = {}  # id(PeerFollow) -> (PeerFollow, its link's socket, its wait's event), while it waits
        self.sent_records = 0
        self.frames = 0  # frames sent whole or in part from a turn

    def waiting(self, follow, sock, wake):
        """``follow``'s greenlet waits on ``wake`` now, caught up: a turn may send it what the turn wrote."""
        self._idle[id(follow)] = (follow, sock, wake)

    def busy(self, follow):
        """``follow``'s greenlet runs again (its wait ended, or its link did): no turn sends for it."""
        self._idle.pop(id(follow), None)

    def serve(self, keys, staged, runs, now, quiet):
        """A burst just appended and made visible (``runs``: its ``BurstRun``s over ``staged``, the port's entries,
        written at ``now`` ms): each follow waiting caught up on the one run of it that it follows is sent that run's
        frame now (``send_now``), its cursor moved past it; when the frame went whole its wait is added to ``quiet``
        (``{key: events}``, the waits the append's wake passes over). A follow it does not serve is woken by the
        append's wake."""
        if not self._idle:
            return
        confirmed = self.confirmed_end()
        for follow, sock, wake in list(self._idle.values()):
            if wake.is_set():
                continue  # woken already: its greenlet reads what came
            run = follow.lone_run(runs)
            if run is None:
                continue
            entries = follow.turn_entries(run, staged, now, confirmed)
            if entries is None:
                continue
            frame = rp.joined(Records(tuple(entries)))
            n = send_now(sock, frame)
            if n <= 0:
                continue  # nothing went: the greenlet sends it, read back from the log
            self.frames += 1
            self.sent_records += sum(1 for e in entries if e.kind != POSITION)
            follow.advance(run.key, run.first_offset + run.count)
            if n < len(frame):
                follow.unsent = frame[n:]  # its greenlet, woken by the append, writes it before anything else
                continue
            caught = quiet.get(run.key)
            if caught is None:
                quiet[run.key] = {wake}
            else:
                caught.add(wake)


def send_now(sock, frame):
    """Write ``frame`` to the peer's link without waiting: how many bytes went (0: none, the buffer full, or the
    link not one written by descriptor: TLS). A failed write sends nothing: the greenlet's own send then fails and
    ends the link."""
    if type(sock) is not gsocket.socket:
        return 0
    try:
        return os.write(sock.fileno(), frame)  # gevent's descriptor is non-blocking
    except OSError:
        return 0
