"""Burrow's consumer-lag evaluation rules in plain Python (no Spark).

LinkedIn Burrow (``core/internal/evaluator/caching.go``) judges each partition of a group by a
sliding *window* of the group's last ``intervals`` offset commits, oldest first; each entry is
the committed offset, when it was committed, and the lag at that moment (clamped to >= 0).
The rules, in the order Burrow applies them:

1. current lag is 0, or the lag was 0 at any commit in the window   -> **OK**
2. the committed offset ever decreases in the window                -> **REWIND**
3. ``now - last_commit > last_commit - first_commit``                -> **STOP** (no more commits)
4. every committed offset in the window is the same                 -> **STALL** (commits, no progress)
5. the offsets move but the lag never decreases                     -> **WARN** (consumer too slow)
6. otherwise                                                        -> **OK**

Rules 4 and 5 judge a trend, so they need two commits in the window (ours; Burrow's would call a
single commit STALL): a group that has committed once is OK with its lag until a second commit, or
STOP once a later snapshot shows no new one (rule 3).

A group takes the worst status of its partitions, in Burrow's order
``NOTFOUND < OK < WARN < ERR < STOP < STALL < REWIND``; ``burrow_group_status`` also folds
STOP/STALL/REWIND into ``ERR`` as Burrow's group result does. Ours adds **BROKER_DOWN** (the
broker of the partition did not answer, so the lag is unknown), ranked with ERR.

The Spark job (:mod:`metaq.spark.lagjob`) evaluates the same rules in Spark SQL; this module
is the reference the tests hold it to, and what a tool without Spark can use.
"""

from itertools import pairwise
from typing import NamedTuple

__all__ = ["Commit", "STATUSES", "partition_status", "group_status", "burrow_group_status", "status_rank"]

#: Status names, best first (Burrow's ``StatusConstant`` order; BROKER_DOWN is ours, ranked as ERR).
STATUSES = ("NOTFOUND", "OK", "WARN", "ERR", "BROKER_DOWN", "STOP", "STALL", "REWIND")
_RANK = {"NOTFOUND": 0, "OK": 1, "WARN": 2, "ERR": 3, "BROKER_DOWN": 3, "STOP": 4, "STALL": 5, "REWIND": 6}


class Commit(NamedTuple):
    """One window entry: when the commit was seen (seconds), the committed offset, the lag then."""

    ts: float
    offset: int
    lag: int


def partition_status(window, current_lag, now):
    """Burrow's status of one partition from ``window`` (``[Commit]``, oldest first), its current lag and ``now``.

    ``current_lag`` None means the lag cannot be known (no committed offset: ``NOTFOUND``).
    """
    if current_lag is None:
        return "NOTFOUND"
    if not window:
        return "OK"
    if current_lag == 0 or any(c.lag == 0 for c in window):
        return "OK"  # rule 1
    pairs = list(pairwise(window))
    if any(b.offset < a.offset for a, b in pairs):
        return "REWIND"  # rule 2
    if now - window[-1].ts > window[-1].ts - window[0].ts:
        return "STOP"  # rule 3
    if not pairs:
        return "OK"  # one commit shows no trend: rules 4 and 5 need two
    if all(b.offset == a.offset for a, b in pairs):
        return "STALL"  # rule 4
    if all(b.lag >= a.lag for a, b in pairs):
        return "WARN"  # rule 5
    return "OK"


def status_rank(status):
    """Burrow's severity of a status name (higher is worse)."""
    return _RANK[status]


def group_status(statuses):
    """The worst of the partition ``statuses`` (``NOTFOUND`` for none)."""
    worst = "NOTFOUND"
    for status in statuses:
        if _RANK[status] > _RANK[worst]:
            worst = status
    return worst


def burrow_group_status(statuses):
    """A group's status as Burrow reports it: NOTFOUND, OK, WARN or ERR (STOP, STALL, REWIND, BROKER_DOWN fold into
    ERR)."""
    worst = group_status(statuses)
    return "ERR" if _RANK[worst] >= _RANK["ERR"] else worst
