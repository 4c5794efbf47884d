"""The epoch history: which master wrote which stretch of the commit log (Kafka's leader epochs, RocketMQ's EpochFile).

An entry ``(epoch, start, origin)`` says: the log bytes from position ``start``
up to the next entry's start (or the log end) were written by the master of
``epoch``. ``origin`` is a random 63-bit number drawn when that epoch began
(``new_origin``): the epoch's identity. Epoch *numbers* may collide — two
brokers promoted or restarted independently each pick one more than the
highest they have seen — but two begun epochs never share an origin, so an
entry names exactly one master's stretch of log. A fresh broker holds the root
``[(0, 0, 0)]`` (an empty log, common to every broker). A master begins a new
epoch at its log end every time it starts (the first start of a fresh data dir
too: epoch 1 from position 0) and when it is promoted or elected (``begin``);
a slave takes its master's entries at each handshake (``adopt``) and records
the later ones as its copy reaches their start (``learn``). With
``replication.ha: auto`` the epoch number comes from ZooKeeper (one counter
per broker id), so numbers are unique there too.

**Where two logs agree** (``agreed_position``): find the latest entry both
histories hold (same epoch, same start *and* same origin); the logs are
identical up to the lower of the two ends of that epoch (each end is the next
entry's start in that history, or that log's end). A slave cuts its log there
at every connection: this is the epoch handshake. If nothing matches, the logs
are unrelated and the master refuses the slave — unless the slave's log is
empty (a fresh slave agrees with anything at 0). A master's first epoch
begins at 0 and replaces the root, so two brokers that each started fresh as
masters share nothing and are refused, never cut one against the other.

Entries are strictly increasing in epoch and in start: beginning or learning
an epoch at a position drops the entries starting at or after it (an epoch
that wrote nothing is forgotten). ``max_epoch`` only grows, so this broker
never hands out an epoch number twice, even after its entry was cut.
``led`` is true while the latest epoch is one this broker began itself: its
log may then end in a tail no other broker confirmed, so, started as a slave,
it serves no read before its first handshake (docs/replication.md).

Persisted in the data dir's ``epochs`` state file (JSON behind a magic, length
and CRC, replaced atomically like every state file): ``{"epochs": [[e, s, o],
...], "max_epoch": n, "led": bool}``. A file written before origins existed
holds ``[e, s]`` pairs: they load with origin 0 (such entries match only their
like, as before). A missing or damaged file counts as ``[(0, 0, 0)]``: the
handshake then cuts at worst more than needed (it never keeps a divergent
tail), and the broker copies it again. BLOCKING: every change writes and
fsyncs the file.
"""

import logging
import secrets

from metaq.server.replication import limits as replication_limits
from metaq.protocol.replication import history_problem
from metaq.store.files import DISK_FULL_ERRNOS

log = logging.getLogger(__name__)

EPOCHS_MAGIC = b"MQEP"
FRESH = ((0, 0, 0),)
ORIGIN_BITS = 63  # an origin fits a signed 64-bit field on the wire


def new_origin():
    """A fresh epoch identity: random, never 0 (0 is the root's and pre-origin entries')."""
    while True:
        origin = secrets.randbits(ORIGIN_BITS)
        if origin:
            return origin


def origin_text(origin):
    return "%016x" % origin


def _entry(item):
    """A stored entry: ``[e, s, o]``, or ``[e, s]`` from before origins (origin 0)."""
    if len(item) == 2:
        return int(item[0]), int(item[1]), 0
    epoch, start, origin = item
    return int(epoch), int(start), int(origin)


def took_part(entries, led, recorded):
    """Whether a history (``entries``, ``led``) took part in ``recorded``, the group's latest recorded epoch
    ``(epoch, start, origin)`` (None: no record): it holds that entry (it led it, or its copy reached its
    start), or it began a later epoch itself (one not recorded yet: its record write failed). A member that did
    not is behind a later master: it may neither be elected nor start as master (docs/replication.md, "Epochs
    outlive the brokers")."""
    if recorded is None:
        return True
    if tuple(recorded[:3]) in {tuple(e) for e in entries}:
        return True
    return led and entries[-1][0] > recorded[0]


def leads_record(entries, led, recorded):
    """Whether ``recorded`` (the group's latest recorded epoch, None: no record) is this history's own: the latest
    entry here, begun here (``led``), or an unrecorded later one begun here. With ``ha: manual`` only that member
    starts as master; every other follows the recorded master."""
    if recorded is None:
        return True
    return led and (tuple(entries[-1]) == tuple(recorded[:3]) or entries[-1][0] > recorded[0])


def epoch_end(entries, i, log_end):
    """Where entry ``i``'s stretch ends: the next entry's start, or ``log_end`` for the latest."""
    return entries[i + 1][1] if i + 1 < len(entries) else log_end


def agreed_position(mine, my_end, theirs, their_end):
    """The log position up to which a master's log (``mine``, ending at ``my_end``) and a slave's (``theirs``)
    agree, or None when they share no entry. An empty slave log agrees with any master at 0."""
    index = {tuple(entry): i for i, entry in enumerate(mine)}
    for k in range(len(theirs) - 1, -1, -1):
        i = index.get(tuple(theirs[k]))
        if i is not None:
            return min(epoch_end(theirs, k, their_end), epoch_end(mine, i, my_end))
    return 0 if their_end == 0 else None


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
                entries = [_entry(item) for item in state.get("epochs", ())]
                problem = history_problem(entries)
                if problem is None:
                    self.entries = entries
                    self.max_epoch = max(int(state.get("max_epoch", 0)), entries[-1][0])
                    self.led = bool(state.get("led", False))
                    self.found = True
                else:
                    log.warning("epoch history %s is invalid (%s): starting from [(0, 0, 0)]", self._path, problem)
            except (TypeError, ValueError):
                log.warning("epoch history %s is malformed: starting from [(0, 0, 0)]", self._path)
        changed = self._drop_after(log_end)
        if changed:
            log.warning("epoch history: forgot the entries starting past the log end %d (data lost since)", log_end)
        if changed or not self.found:
            try:
                self.save()
            except OSError as exc:  # a full disk: the history in memory is right, and the next load drops them again
                if exc.errno not in DISK_FULL_ERRNOS:
                    raise
                log.warning("epoch history: not saved at open (%s); saved with its next change", exc.strerror)
        return self

    def begin(self, position, epoch=None):
        """Start a new epoch at ``position`` (this broker becomes its master), with a fresh origin; returns its
        number. ``epoch``: the number to use (assigned through ZooKeeper), above ``max_epoch``; None picks
        ``max_epoch + 1``."""
        if epoch is None:
            epoch = self.max_epoch + 1
        elif epoch <= self.max_epoch:
            raise ValueError("epoch %d is not above the highest this broker has seen (%d)" % (epoch, self.max_epoch))
        self._add(epoch, position, new_origin())
        self.max_epoch = epoch
        self.led = True
        self.save()
        log.info("epoch %d (origin %s) begins at log position %d (history %s)", epoch,
                 origin_text(self.latest[2]), position, self.entries)
        return epoch

    def adopt(self, entries, position):
        """Take a master's history for our log up to ``position`` (the logs agree there); returns the later entries."""
        mine = [tuple(e) for e in entries if e[1] <= position]
        if mine:
            self.entries = mine
        self.max_epoch = max([self.max_epoch] + [e[0] for e in entries])
        self.led = False
        self.save()
        return [tuple(e) for e in entries if e[1] > position]

    def learn(self, entry):
        """Record a master's entry ``(epoch, start, origin)`` once our copy reaches its start."""
        epoch, start, origin = entry
        self._add(epoch, start, origin)
        self.max_epoch = max(self.max_epoch, epoch)
        self.led = False
        self.save()

    def truncate(self, position):
        """The log was cut back to ``position``: forget the entries starting after it."""
        if self._drop_after(position):
            self.save()

    def _drop_after(self, position):
        first = self.entries[0]
        kept = [e for e in self.entries if e[1] <= position] or [(first[0], min(first[1], position), first[2])]
        changed = kept != self.entries
        self.entries = kept
        return changed

    def _add(self, epoch, start, origin):
        kept = [e for e in self.entries if e[1] < start]
        if kept and kept[-1][0] >= epoch:
            raise ValueError("epoch %d at %d does not follow the entry %s" % (epoch, start, kept[-1]))
        kept.append((epoch, start, origin))
        if len(kept) > replication_limits.MAX_REPLICATION_EPOCHS:
            kept = kept[-replication_limits.MAX_REPLICATION_EPOCHS:]
        self.entries = kept

    def save(self):
        """BLOCKING: write the file (atomically, fsynced)."""
        self._dirs.write_state(self._path, EPOCHS_MAGIC, {
            "epochs": [list(e) for e in self.entries], "max_epoch": self.max_epoch, "led": self.led})
