"""What ``MessageStore`` methods return (re-exported by ``metaq.store.store``)."""

from dataclasses import dataclass
from typing import List, NamedTuple

from metaq.store.retention import short_of_room


class PutResult(NamedTuple):
    msg_id: int
    partition: int
    offset: int
    log_end: int  # commit-log position after the record: durable once flushed_position >= log_end


class BurstRun(NamedTuple):
    """One partition run of a burst written by ``MessageStore.put_burst``: what was written, not how to answer it.

    Frames ``first_frame … first_frame + count - 1`` (indexes in the frames given) became messages of
    ``key`` with offsets ``first_offset…`` and message ids ``first_id…``, one more per message.
    """

    key: tuple  # (topic, partition)
    count: int
    body_bytes: int  # the messages' data bytes (stats)
    first_id: int
    first_offset: int
    first_frame: int
    log_end: int  # commit-log position after the run: durable once flushed_position >= log_end


class ReadResult(NamedTuple):
    views: List[memoryview]  # MetaQ form (20-byte header + data) of whole records, in order
    nbytes: int
    count: int
    next_offset: int


#: ``DiskState.pressure``: nothing to do; retention deletes the oldest sealed segments before their time (above the
#: warn mark, or too little free for the next segment: retention.py); writes (and a slave's copy) refused.
PRESSURE_NONE, PRESSURE_WARN, PRESSURE_FULL = "none", "warn", "full"


@dataclass
class DiskState:
    usage_ratio: float
    free_bytes: int
    refusing_writes: bool
    reason: str
    total_bytes: int = 0
    pressure: str = PRESSURE_NONE
    pressure_reason: str = ""  # why ``pressure`` is what it is ("" for none)

    @classmethod
    def of(cls, usage, danger, warn=None, segment_size=None):
        """The state of a filesystem measured as ``usage`` (``files.DiskUsage``) against the danger mark ``danger``
        (a fraction): above it, writes are refused (pressure ``full``). Above the warn mark ``warn``, or with less
        than ``segment_size`` free with a warn mark below 1.0, retention deletes young segments (pressure ``warn``):
        docs/operating.md "Disk"."""
        ratio = usage.ratio
        refusing = ratio > danger
        reason = ("disk usage %.1f%% is above the danger mark %g%%: writes are refused until space is freed"
                  % (ratio * 100, round(danger * 100, 3)) if refusing else "")
        pressure, why = (PRESSURE_FULL, reason) if refusing else (PRESSURE_NONE, "")
        if not refusing and warn is not None and ratio > warn:
            pressure, why = PRESSURE_WARN, ("disk usage %.1f%% is above the warn mark %g%%: retention deletes the "
                                            "oldest segments before their time" % (ratio * 100, round(warn * 100, 3)))
        elif not refusing and warn is not None and short_of_room(usage.available_bytes, segment_size, warn):
            pressure, why = PRESSURE_WARN, ("%d bytes free, less than a %d-byte segment: retention deletes the oldest "
                                            "segments before their time" % (usage.available_bytes, segment_size))
        return cls(ratio, usage.available_bytes, refusing, reason, usage.used_bytes + usage.available_bytes,
                   pressure, why)


@dataclass
class PartitionStats:
    topic: str
    partition: int
    min_offset: int
    max_offset: int
    messages: int
    log_bytes: int
    index_bytes: int


@dataclass
class Checkpoint:
    position: int
    last_msg_id: object
    floors: dict  # (topic, partition) -> offsets whose records lie below position
    serial: object  # random per checkpoint; a clean-shutdown marker names the checkpoint it goes with
    tag_format: object = None  # index.TAG_FORMAT of the units it vouches for (None: written before there was one)
