"""A small two-phase-commit coordinator over DB-API TPC resources (PEP 249's ``tpc_*`` methods).

Any object with ``xid(format_id, gtrid, bqual)``, ``tpc_begin(xid)``, ``tpc_prepare()``,
``tpc_commit(xid=None)``, ``tpc_rollback(xid=None)`` and ``tpc_recover()`` is a resource: a
psycopg connection (autocommit off, idle) and metaq's ``XAResource`` both are. This module never
imports psycopg; it is handed the connection objects.

One global transaction::

    coord = Coordinator("/var/lib/app/coord.log", {"pg": conn, "mq": xa})
    coord.recover()                       # at start-up: finish what a crash left in doubt
    with coord.transaction() as gtx:
        conn.execute("INSERT ...")
        xa.send(message)

``transaction()`` makes one gtrid (``<name>-<uuid hex>``) and one branch per resource (same gtrid,
bqual = the resource's name, format id ``FORMAT_ID``), calls ``tpc_begin`` on each, runs the body,
``tpc_prepare`` on each, appends the COMMIT decision to its log (one JSON line per gtrid, fsync)
and only then ``tpc_commit`` on each. Anything that fails before the decision is on disk rolls
every branch back (presumed abort: no decision means roll back). A commit that fails after the
decision is not rolled back: it is left to ``recover()``, and ``CommitPending`` tells the caller.

``recover()`` asks every resource for its in-doubt branches (``tpc_recover``), keeps the ones that
are ours (our format id, a gtrid of this coordinator's name, bqual = that resource's name, and for
psycopg the connection's own database) and commits those whose gtrid has a decision in the log,
rolling back the rest. A decision is forgotten (the log compacted) once no resource lists its gtrid.

Resource names and the coordinator's name are part of the branch ids: keep them stable across
restarts, and give coordinators that share a database or broker different names.
"""

import contextlib
import json
import logging
import os
import re
import threading
import time
import uuid
from dataclasses import dataclass, field

from metaq.transactions.wire import XA_HEURCOM, XA_HEURRB, XA_RDONLY

log = logging.getLogger(__name__)

FORMAT_ID = 0x6D657461          # "meta": the XA format id of the branches this coordinator makes
MAX_ID_CHARS = 64               # PEP 249 / XA: gtrid and bqual are at most 64 characters
NAME_RE = re.compile(r"^[A-Za-z0-9_.]{1,%d}$" % (MAX_ID_CHARS - 33))
RESOURCE_RE = re.compile(r"^[A-Za-z0-9_.-]{1,%d}$" % MAX_ID_CHARS)
COMPACT_EVERY = 1000            # rewrite the log after this many lines when most decisions are finished
MAX_LOG_LINE = 64 * 1024        # a decision line longer than this is corruption, not a decision


class CoordinatorError(Exception):
    """Base class of the coordinator's errors."""


class RolledBack(CoordinatorError):
    """The global transaction was rolled back because a begin, a prepare or the decision write failed.

    ``gtrid`` names it, ``__cause__`` is the failure, ``failures`` maps resource name -> the error
    of each rollback that failed too (those branches are rolled back later by ``recover()``).
    """

    def __init__(self, gtrid, msg, failures=None):
        super().__init__("%s: %s" % (gtrid, msg))
        self.gtrid = gtrid
        self.failures = failures or {}


class CommitPending(CoordinatorError):
    """The outcome is COMMIT, but some branches are not committed yet; ``recover()`` will commit them.

    ``failures`` maps resource name -> the error of its ``tpc_commit``.
    """

    def __init__(self, gtrid, failures):
        super().__init__("%s: committed; not yet on %s" % (gtrid, ", ".join(sorted(failures))))
        self.gtrid = gtrid
        self.failures = failures


@dataclass
class GlobalTransaction:
    """One global transaction: its gtrid, the branch xid per resource, and its state."""

    gtrid: str
    resources: dict
    xids: dict
    state: str = "active"            # active -> prepared -> committed | rolled back
    rollback_only: bool = False
    read_only: set = field(default_factory=set)

    def __getitem__(self, name):
        """The resource called ``name``."""
        return self.resources[name]

    def set_rollback_only(self):
        """Make the transaction roll back (without an error) when its body ends."""
        self.rollback_only = True


@dataclass
class RecoveryReport:
    """What ``Coordinator.recover()`` did.

    ``committed`` / ``rolled_back``: ``[(resource, gtrid)]`` (a branch completed by hand the same
    way, XA_HEURCOM / XA_HEURRB, counts too: it is forgotten with ``tpc_forget``); ``failed``:
    ``[(resource, gtrid, error)]``, left in doubt and retried by the next recover (an ``xa_code``
    of XA_HEURRB, XA_HEURCOM, XA_HEURMIX or XA_HEURHAZ: completed by hand the other way, for an
    operator); ``unreachable``: resource -> error of its ``tpc_recover``; ``forgotten``: decisions
    removed from the log; ``kept``: decisions still needed.
    """

    committed: list = field(default_factory=list)
    rolled_back: list = field(default_factory=list)
    failed: list = field(default_factory=list)
    unreachable: dict = field(default_factory=dict)
    forgotten: list = field(default_factory=list)
    kept: list = field(default_factory=list)

    @property
    def ok(self):
        """True when every resource answered and every in-doubt branch was finished."""
        return not self.failed and not self.unreachable


def xid_parts(xid):
    """``(format_id, gtrid, bqual)`` of a DB-API xid (an object with those attributes, or a triple)."""
    if all(hasattr(xid, a) for a in ("format_id", "gtrid", "bqual")):
        parts = (xid.format_id, xid.gtrid, xid.bqual)
    else:
        parts = tuple(xid[i] for i in range(3))
    fmt, gtrid, bqual = parts
    return fmt, _text(gtrid), _text(bqual)


def _text(value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    return value


class DecisionLog:
    """The coordinator's durable COMMIT decisions: a file of JSON lines, one per gtrid.

    ``record`` appends and fsyncs; ``rewrite`` replaces the file atomically (temp file, fsync,
    rename, directory fsync). A torn last line (a crash during an append) is dropped at open: its
    decision never reached the disk, so no branch was committed for it.
    """

    def __init__(self, path):
        self.path = os.path.abspath(path)
        self.lines = 0
        self.decisions = self._load()
        self._fd = self._open_append()

    def _load(self):
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        decisions, good_end = {}, 0
        for line in data.split(b"\n")[:-1]:
            try:
                if len(line) > MAX_LOG_LINE:
                    raise ValueError("line of %d bytes" % len(line))
                rec = json.loads(line)
                if not isinstance(rec, dict) or rec.get("decision") != "commit" or \
                        not isinstance(rec.get("gtrid"), str):
                    raise ValueError("not a decision")
            except ValueError as exc:
                raise CoordinatorError("%s: corrupt decision at byte %d: %s" % (self.path, good_end, exc)) from exc
            decisions[rec["gtrid"]] = rec
            good_end += len(line) + 1
            self.lines += 1
        if good_end != len(data):
            log.warning("%s: dropping a torn last line (%d bytes)", self.path, len(data) - good_end)
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
                os.fsync(f.fileno())
        return decisions

    def _open_append(self):
        existed = os.path.exists(self.path)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if not existed:
            os.fsync(fd)
            _fsync_dir(os.path.dirname(self.path))
        return fd

    def record(self, rec):
        """Append one decision and fsync it; only then may any branch be committed."""
        line = (json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n").encode()
        if len(line) > MAX_LOG_LINE:
            raise CoordinatorError("decision line of %d bytes exceeds %d" % (len(line), MAX_LOG_LINE))
        written = os.write(self._fd, line)
        if written != len(line):
            raise OSError("short write to %s (%d of %d bytes)" % (self.path, written, len(line)))
        os.fsync(self._fd)
        self.decisions[rec["gtrid"]] = rec
        self.lines += 1

    def rewrite(self):
        """Replace the file by the current ``decisions`` (atomic, durable)."""
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            for rec in self.decisions.values():
                f.write((json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n").encode())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        _fsync_dir(os.path.dirname(self.path))
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.lines = len(self.decisions)

    def close(self):
        """Close the file (the decisions stay on disk)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _fsync_dir(path):
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Coordinator:
    """Two-phase commit over named TPC resources, with a durable decision log; see the module docstring.

    ``log_path``: the decision log (created if missing). ``resources``: ``{name: resource}``; the
    name is the branch qualifier, so it must be stable. ``name``: this coordinator's name, the
    prefix of its gtrids (coordinators sharing a resource need different names).
    """

    def __init__(self, log_path, resources, name="metaq", format_id=FORMAT_ID):
        if not NAME_RE.match(name):
            raise ValueError("coordinator name %r: 1-%d of [A-Za-z0-9_.]" % (name, MAX_ID_CHARS - 33))
        if not resources:
            raise ValueError("a coordinator needs at least one resource")
        for rname in resources:
            if not RESOURCE_RE.match(rname):
                raise ValueError("resource name %r: 1-%d of [A-Za-z0-9_.-]" % (rname, MAX_ID_CHARS))
        self.name = name
        self.format_id = format_id
        self.resources = dict(resources)
        self._lock = threading.Lock()
        self._log = DecisionLog(log_path)
        self._active = None

    @property
    def log_path(self):
        """The decision log's path."""
        return self._log.path

    def decisions(self):
        """``{gtrid: record}`` of the COMMIT decisions the log still holds."""
        with self._lock:
            return dict(self._log.decisions)

    def close(self):
        """Close the decision log (resources belong to the caller and stay open)."""
        self._log.close()

    def new_gtrid(self):
        """A fresh global transaction id of this coordinator: ``<name>-<uuid4 hex>``."""
        return "%s-%s" % (self.name, uuid.uuid4().hex)

    def is_ours(self, gtrid):
        """True when ``gtrid`` has the form this coordinator gives its transactions."""
        prefix, sep, tail = gtrid.rpartition("-")
        return sep == "-" and prefix == self.name and len(tail) == 32 and all(c in "0123456789abcdef" for c in tail)

    # -- one global transaction -------------------------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self):
        """A global transaction over every resource: commit at the end of the block, rollback on an error.

        Yields a ``GlobalTransaction`` (``gtx["name"]`` is a resource; ``gtx.set_rollback_only()``
        rolls back quietly). Raises ``RolledBack`` when a begin, a prepare or the decision write
        fails (the body's own exceptions are re-raised as they are, after the rollback), and
        ``CommitPending`` when the decision is COMMIT but some branch is not committed yet.
        """
        gtx = self._begin()
        try:
            yield gtx
        except BaseException:
            self._rollback(gtx, "body failed")
            raise
        try:
            if gtx.rollback_only:
                self._rollback(gtx, "rollback only")
                return
            self._prepare(gtx)
            self._decide_and_commit(gtx)
        finally:
            self._active = None

    def run(self, work):
        """``work(gtx)`` inside ``transaction()``; returns what ``work`` returns."""
        with self.transaction() as gtx:
            return work(gtx)

    def _begin(self):
        gtrid = self.new_gtrid()
        gtx = GlobalTransaction(gtrid, self.resources,
                                {n: r.xid(self.format_id, gtrid, n) for n, r in self.resources.items()})
        with self._lock:
            if self._active is not None:
                raise CoordinatorError("global transaction %s is still active" % self._active.gtrid)
            self._active = gtx
        begun = []
        for name, res in self.resources.items():
            try:
                res.tpc_begin(gtx.xids[name])
            except Exception as exc:
                failures = self._rollback_each(gtx, begun)
                gtx.state = "rolled back"
                self._active = None
                raise RolledBack(gtrid, "tpc_begin on %s failed: %s" % (name, exc), failures) from exc
            begun.append(name)
        return gtx

    def _rollback_each(self, gtx, names):
        failures = {}
        for name in names:
            if name in gtx.read_only:
                continue
            try:
                self.resources[name].tpc_rollback()
            except Exception as exc:  # presumed abort: recover() rolls it back later
                log.warning("%s: tpc_rollback on %s failed: %r", gtx.gtrid, name, exc)
                failures[name] = exc
        return failures

    def _rollback(self, gtx, why):
        try:
            failures = self._rollback_each(gtx, list(self.resources))
            gtx.state = "rolled back"
            log.info("%s: rolled back (%s)", gtx.gtrid, why)
            return failures
        finally:
            self._active = None

    def _prepare(self, gtx):
        for name, res in self.resources.items():
            try:
                if res.tpc_prepare() == XA_RDONLY:
                    gtx.read_only.add(name)
            except Exception as exc:
                failures = self._rollback(gtx, "tpc_prepare on %s failed" % name)
                raise RolledBack(gtx.gtrid, "tpc_prepare on %s failed: %s" % (name, exc), failures) from exc
        gtx.state = "prepared"

    def _decide_and_commit(self, gtx):
        updating = [n for n in self.resources if n not in gtx.read_only]
        if len(updating) > 1:   # with one prepared branch its own outcome is the decision: no log needed
            rec = {"gtrid": gtx.gtrid, "decision": "commit", "branches": updating, "at": round(time.time(), 3)}
            try:
                with self._lock:
                    self._log.record(rec)
            except Exception as exc:
                failures = self._rollback(gtx, "decision not written")
                raise RolledBack(gtx.gtrid, "the decision was not written: %s" % exc, failures) from exc
        failures = {}
        for name in updating:
            try:
                self.resources[name].tpc_commit()
            except Exception as exc:  # decided: recover() commits it later, never roll back now
                log.warning("%s: tpc_commit on %s failed: %r", gtx.gtrid, name, exc)
                failures[name] = exc
        gtx.state = "committed"
        if failures:
            raise CommitPending(gtx.gtrid, failures)
        if len(updating) > 1:
            self._finished(gtx.gtrid)

    def _finished(self, gtrid):
        """Every branch of ``gtrid`` committed: drop its decision, rewriting the log now and then."""
        with self._lock:
            self._log.decisions.pop(gtrid, None)
            if self._log.lines >= COMPACT_EVERY and len(self._log.decisions) * 4 < self._log.lines:
                self._log.rewrite()

    # -- recovery ------------------------------------------------------------------------------------

    def _ours_on(self, name, res, xid):
        """``gtrid`` when ``xid`` (from ``res.tpc_recover()``) is a branch of ours on ``name``, else None."""
        fmt, gtrid, bqual = xid_parts(xid)
        if fmt != self.format_id or bqual != name or not isinstance(gtrid, str) or not self.is_ours(gtrid):
            return None
        database = getattr(xid, "database", None)                  # psycopg lists every database's
        own_db = getattr(getattr(res, "info", None), "dbname", None)  # prepared xacts; only ours count
        if database is not None and own_db is not None and database != own_db:
            return None
        return gtrid

    def recover(self):
        """Finish every in-doubt branch of ours: commit where the log has the decision, else roll back.

        Returns a ``RecoveryReport``. Decisions whose gtrid no resource lists any more are removed
        from the log; when a resource cannot be asked, every decision is kept.
        """
        with self._lock:
            if self._active is not None:
                raise CoordinatorError("recover() during global transaction %s" % self._active.gtrid)
            decisions = dict(self._log.decisions)
        report, listed = RecoveryReport(), set()
        for name, res in self.resources.items():
            try:
                xids = list(res.tpc_recover())
            except Exception as exc:
                log.warning("tpc_recover on %s failed: %r", name, exc)
                report.unreachable[name] = exc
                continue
            for xid in xids:
                gtrid = self._ours_on(name, res, xid)
                if gtrid is not None:
                    self._resolve(name, res, xid, gtrid, gtrid in decisions, report, listed)
        self._forget(decisions, listed, report)
        return report

    def _resolve(self, name, res, xid, gtrid, commit, report, listed):
        verb = "commit" if commit else "rollback"
        try:
            try:
                res.tpc_commit(xid) if commit else res.tpc_rollback(xid)
            except Exception as exc:
                # completed by hand the same way (XA_HEURCOM for a commit, XA_HEURRB for a rollback): FORGET it
                if getattr(exc, "xa_code", None) != (XA_HEURCOM if commit else XA_HEURRB) or \
                        not hasattr(res, "tpc_forget"):
                    raise
                log.info("recover: %s on %s was completed heuristically the same way: %s", gtrid, name, exc)
                res.tpc_forget(xid)
        except Exception as exc:
            log.warning("recover: %s of %s on %s failed: %r", verb, gtrid, name, exc)
            report.failed.append((name, gtrid, exc))
            listed.add(gtrid)
            return
        (report.committed if commit else report.rolled_back).append((name, gtrid))
        log.info("recover: %s of %s on %s", verb, gtrid, name)

    def _forget(self, decisions, listed, report):
        unchecked = set(report.unreachable)
        with self._lock:
            for gtrid, rec in decisions.items():
                branches = set(rec.get("branches") or self.resources)
                if gtrid in listed or branches & unchecked or not branches <= set(self.resources):
                    report.kept.append(gtrid)
                else:
                    self._log.decisions.pop(gtrid, None)
                    report.forgotten.append(gtrid)
            if report.forgotten:
                self._log.rewrite()


__all__ = ["Coordinator", "CoordinatorError", "RolledBack", "CommitPending", "GlobalTransaction",
           "RecoveryReport", "DecisionLog", "FORMAT_ID", "xid_parts"]
