"""The epoch history: which master wrote which stretch of the commit log (Kafka's leader epochs, RocketMQ's EpochFile).

An entry ``(epoch, start)`` says: the log bytes from position ``start`` up to
the next entry's start (or the log end) were written by the master of
``epoch``. A fresh broker holds ``[(0, 0)]``. A master begins a new epoch at
its log end every time it starts (except the first start of a fresh, empty
data dir) and when a slave is promoted (``begin``); a slave takes its master's
entries at each handshake (``adopt``) and records the later ones as its copy
reaches their start (``learn``).

**Where two logs agree** (``agreed_position``): find the latest entry both
histories hold (same epoch *and* same start, so two brokers that happened to
number an epoch alike do not match by accident); the logs are identical up to
the lower of the two ends of that epoch (each end is the next entry's start
in that history, or that log's end). A slave cuts its log there at every
connection: this is the epoch handshake. If nothing matches, the logs are
unrelated and the master refuses the slave.

Entries are strictly increasing in epoch and in start: beginning or learning
an epoch at a position drops the entries starting at or after it (an epoch
that wrote nothing is forgotten). ``max_epoch`` only grows, so this broker
never hands out an epoch number twice, even after its entry was cut.
``led`` is true while the latest epoch is one this broker began itself: its
log may then end in a tail no other broker confirmed, so, started as a slave,
it serves no read before its first handshake (README "Replication").

Persisted in the data dir's ``epochs`` state file (JSON behind a magic, length
and CRC, replaced atomically like every state file): ``{"epochs": [[e, s],
...], "max_epoch": n, "led": bool}``. A missing or damaged file counts as
``[(0, 0)]``: the handshake then cuts at worst more than needed (it never keeps
a divergent tail), and the broker copies it again. BLOCKING: every change
writes and fsyncs the file.
"""

import logging

from metaq import limits
from metaq.protocol.replication import history_problem

log = logging.getLogger(__name__)

EPOCHS_MAGIC = b"MQEP"
FRESH = ((0, 0),)


def epoch_end(entries, i, log_end):
    """Where entry ``i``'s stretch ends: the next entry's start, or ``log_end`` for the latest."""
    return entries[i + 1][1] if i + 1 < len(entries) else log_end


def agreed_position(mine, my_end, theirs, their_end):
    """The log position up to which two logs with these histories agree, or None when they share no entry."""
    index = {tuple(entry): i for i, entry in enumerate(mine)}
    for k in range(len(theirs) - 1, -1, -1):
        i = index.get(tuple(theirs[k]))
        if i is not None:
            return min(epoch_end(theirs, k, their_end), epoch_end(mine, i, my_end))
    return None


class EpochHistory:
    """The history of one data dir (see the module docstring)."""

    def __init__(self, dirs):
        self._dirs = dirs
        self._path = dirs.epochs
        self.entries = list(FRESH)
        self.max_epoch = 0
        self.led = False
        self.found = False  # a valid file was read

    @property
    def latest(self):
        return self.entries[-1]

    @property
    def epoch(self):
        return self.entries[-1][0]

    def load(self, log_end):
        """Read the file and forget entries past ``log_end`` (data lost since); writes the file if that changed it."""
        state = self._dirs.read_state(self._path, EPOCHS_MAGIC)
        entries = None
        if state is not None:
            try:
                entries = [(int(e), int(s)) for e, s in state.get("epochs", ())]
                problem = history_problem(entries)
                if problem is None:
                    self.entries = entries
                    self.max_epoch = max(int(state.get("max_epoch", 0)), entries[-1][0])
                    self.led = bool(state.get("led", False))
                    self.found = True
                else:
                    log.warning("epoch history %s is invalid (%s): starting from [(0, 0)]", self._path, problem)
            except (TypeError, ValueError):
                log.warning("epoch history %s is malformed: starting from [(0, 0)]", self._path)
        changed = self._drop_after(log_end)
        if changed:
            log.warning("epoch history: forgot the entries starting past the log end %d (data lost since)", log_end)
        if changed or not self.found:
            self.save()
        return self

    def begin(self, position):
        """Start a new epoch at ``position`` (this broker becomes its master); returns its number."""
        epoch = self.max_epoch + 1
        self._add(epoch, position)
        self.max_epoch = epoch
        self.led = True
        self.save()
        log.info("epoch %d begins at log position %d (history %s)", epoch, position, self.entries)
        return epoch

    def lead(self):
        """This broker is the master of its latest epoch (the first start of a fresh master keeps epoch 0)."""
        if not self.led:
            self.led = True
            self.save()

    def adopt(self, entries, position):
        """Take a master's history for our log up to ``position`` (the logs agree there); returns the later entries."""
        mine = [tuple(e) for e in entries if e[1] <= position]
        if mine:
            self.entries = mine
        self.max_epoch = max([self.max_epoch] + [e for e, _s in entries])
        self.led = False
        self.save()
        return [tuple(e) for e in entries if e[1] > position]

    def learn(self, epoch, start):
        """Record a master's entry once our copy reaches ``start``."""
        self._add(epoch, start)
        self.max_epoch = max(self.max_epoch, epoch)
        self.led = False
        self.save()

    def truncate(self, position):
        """The log was cut back to ``position``: forget the entries starting after it."""
        if self._drop_after(position):
            self.save()

    def _drop_after(self, position):
        kept = [e for e in self.entries if e[1] <= position] or [(self.entries[0][0], min(self.entries[0][1], position))]
        changed = kept != self.entries
        self.entries = kept
        return changed

    def _add(self, epoch, start):
        kept = [e for e in self.entries if e[1] < start]
        if kept and kept[-1][0] >= epoch:
            raise ValueError("epoch %d at %d does not follow the entry %s" % (epoch, start, kept[-1]))
        kept.append((epoch, start))
        if len(kept) > limits.MAX_REPLICATION_EPOCHS:
            kept = kept[-limits.MAX_REPLICATION_EPOCHS:]
        self.entries = kept

    def save(self):
        """BLOCKING: write the file (atomically, fsynced)."""
        self._dirs.write_state(self._path, EPOCHS_MAGIC, {
            "epochs": [list(e) for e in self.entries], "max_epoch": self.max_epoch, "led": self.led})
