"""The in-sync set of an elected master (``replication.ha: auto``), in memory: who must confirm a ``sync`` put.

Kafka calls it the ISR, RocketMQ's controller the SyncStateSet. Its members are slave (member) ids that hold
every message this master has acknowledged; in ``sync`` mode only a member may be elected master after this
one (``election.py``), so a put is acknowledged only when **every** member has confirmed it (at least one
slave must be a member: an empty set refuses sync puts with ``SLAVE_NOT_AVAILABLE``, as manual mode does
with no slave connected).

The set changes in one order that keeps that promise whatever fails in between:

* **Joining**: a slave whose confirmed position covers everything acknowledged so far (``acked``) joins the
  in-memory set *first* (from then on puts wait for it too), and ZooKeeper's ``insync`` node is written
  *after* (until then it is not electable: only conservative).
* **Leaving**: a member not connected for ``insync_lag_ms``, or holding less than this master had
  ``insync_lag_ms`` ago, is removed from ZooKeeper's node *first*, and from the in-memory set only once that
  write succeeded (until then puts keep waiting for it and time out: never acknowledged without it while it
  is still electable).
* **Coming back** takes more than joining first did: the copy must also cover what this master had a quarter
  of ``insync_lag_ms`` ago, so a member at the edge does not leave and rejoin at every check.

No I/O here: ``leadership.Term`` does the ZooKeeper writes and calls ``join``/``leave``; the replication
server calls ``required``, ``confirmed`` and ``acknowledged``.
"""

import collections
import time

from metaq.server.replication import limits as replication_limits


class InSyncSet:
    def __init__(self, me, lag_s):
        self.me = me  # the master's own member id (always a member of the ZooKeeper node, never waited for)
        self.lag_s = lag_s
        self.waiting_for = set()  # slave member ids every sync put waits for
        self.acked = 0  # the highest log position acknowledged to a producer in sync mode
        self.last_seen = {}  # member -> when it was last connected (monotonic)
        # (monotonic time, master's written end)
        self._ends = collections.deque(maxlen=replication_limits.MAX_INSYNC_SAMPLES)

    # -- the replication server's questions ----------------------------------------------

    def required(self):
        """The slaves a sync put must hear from now (a copy: the set may change while a put waits)."""
        return set(self.waiting_for)

    def confirmed(self, pos, positions):
        """Every required slave's confirmed position (``positions``: member id -> written) covers ``pos``."""
        need = self.waiting_for
        return bool(need) and all(positions.get(m, -1) >= pos for m in need)

    def acknowledged(self, pos):
        if pos > self.acked:
            self.acked = pos

    # -- the leader's decisions (it writes ZooKeeper around them) ------------------------

    def sample(self, written_end, now=None):
        """Record the master's written end now (one sample per tick of the leader's loop)."""
        self._ends.append((time.monotonic() if now is None else now, written_end))

    def end_lag_ago(self, now=None, ago=None):
        """The master's written end ``ago`` (default ``lag_s``) seconds ago: a member holding less than this has
        been behind for at least that long. None while this term is younger than that (nobody has been behind
        for so long); the oldest sample kept when the samples do not reach that far back (stricter)."""
        now = time.monotonic() if now is None else now
        ago = self.lag_s if ago is None else ago
        old = None
        for at, end in self._ends:
            if now - at < ago:
                break
            old = end
        if old is None and len(self._ends) == self._ends.maxlen:
            return self._ends[0][1]
        return old

    def seen(self, positions, now=None):
        now = time.monotonic() if now is None else now
        for m in positions:
            self.last_seen[m] = now

    def may_join(self, member, written, now=None):
        """A connected slave not yet required whose copy covers everything acknowledged so far, and what this
        master had a quarter of ``lag_s`` ago."""
        recent = self.end_lag_ago(now, self.lag_s / 4.0)
        return (member != self.me and member not in self.waiting_for and written >= self.acked
                and (recent is None or written >= recent))

    def join(self, member, seen=None):
        self.waiting_for.add(member)
        if seen is not None:
            self.last_seen[member] = seen

    def lagging(self, positions, now=None):
        """Required members gone for ``lag_s`` or behind for ``lag_s`` (``positions``: connected member ->
        written)."""
        now = time.monotonic() if now is None else now
        floor = self.end_lag_ago(now)
        return sorted(m for m in self.waiting_for
                      if (m not in positions and now - self.last_seen.get(m, 0.0) >= self.lag_s)
                      or (m in positions and floor is not None and positions[m] < floor))

    def leave(self, member):
        self.waiting_for.discard(member)
