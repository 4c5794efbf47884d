"""The POP journal's records and receipt handles, sans-IO.

Every change of the POP state (``pop/state.py``) is one record, a message of the internal topic ``%POP%``
(``pop/follow.py``), so that replaying the records in log order rebuilds the state exactly (``PopState.apply`` is
the one place a record changes it, live or replayed). A record is one JSON object, compact:

* ``{"k": "d", "g": group, "t": topic, "e": [[partition, offset, attempt, deadline_ms, message_group|null], ...]}``
  messages handed out (a first delivery or a redelivery), each invisible until its deadline;
* ``{"k": "a", "g", "t", "e": [[partition, offset], ...]}`` acknowledged;
* ``{"k": "x", "g", "t", "e": [[partition, offset], ...]}`` dead-lettered (copied to ``%DLQ%<group>``, then done);
* ``{"k": "c", "g", "t", "e": [[partition, offset, deadline_ms]]}`` a new invisible deadline (change_invisible) and
  a new handle: a renewal ends;
* ``{"k": "r", "g", "t", "e": [[partition, offset, attempt, deadline_ms], ...]}`` renewed (auto-renew of a push
  consumer's messages): delivery ``attempt`` is invisible until the new deadline, and the handle it was delivered
  with still names it (the flight keeps that handle's deadline, ``handed``); another attempt's entry is ignored;
* ``{"k": "s", "g", "t", "e": [[partition, offset]]}`` nothing below ``offset`` is to be handed out (where a
  group starts on a partition, or retention deleted what lay below);
* a snapshot: ``{"k": "S"}``, then one ``{"k": "P", "g", "t", "p", "low", "next", "done", "f", "r", "x"}`` per
  partition of each group (a flight ``[offset, attempt, deadline, group]``, with ``handed`` fifth when renewed),
  then ``{"k": "E", "n": <count of P records>}``. A complete snapshot replaces every record before it.

A **receipt handle** is ``<partition>:<offset>:<attempt>:<deadline_ms>``: where the message is, which delivery,
and until when it is invisible; an ack or a change must name the delivery in flight now (a handle of an older
delivery, or an expired one, is refused; a renewed delivery's handle keeps the deadline it was handed out with,
and expires at the renewed one). Opaque to clients.
"""

import json
import re

from metaq import speedups
from metaq.errors import ClientError
from metaq.protocol.journalrecord import encode_record

__all__ = ["RecordError", "encode", "decode", "handle", "parse_handle", "parse_handles", "MAX_RECORD_BYTES"]

#: Largest journal record (a snapshot's partition record is the largest: its in-flight and acknowledged offsets,
#: bounded by limits.POP_MAX_SPAN).
MAX_RECORD_BYTES = 1 << 20
KINDS = ("d", "a", "x", "c", "r", "s", "S", "P", "E")
_MAX_HANDLE = 96
#: A receipt handle's form: four runs of ASCII digits.
_HANDLE = re.compile(r"([0-9]+):([0-9]+):([0-9]+):([0-9]+)")


class RecordError(ValueError):
    """A journal record that does not decode (a bug, a foreign writer)."""


class InvalidHandle(ClientError):
    """A receipt handle that names no message in flight now (malformed, expired, or of an older delivery)."""


def encode(rec):
    """``rec`` (a dict with ``k``) as the bytes of one journal message (``journals.encode_record``)."""
    return encode_record(rec)


def decode(data):
    try:
        rec = json.loads(bytes(data).decode("utf-8"))  # (an int past 64 bits stays one: not orjson)
    except (UnicodeDecodeError, ValueError) as exc:
        raise RecordError("not a POP journal record: %s" % exc) from None
    if not isinstance(rec, dict) or rec.get("k") not in KINDS:
        raise RecordError("not a POP journal record: kind %r" % (rec.get("k") if isinstance(rec, dict) else rec))
    return rec


#: A receipt handle's text: ``HANDLE_TEXT % (partition, offset, attempt, deadline_ms)``.
HANDLE_TEXT = "%d:%d:%d:%d"


def handle_py(partition, offset, attempt, deadline_ms):
    """A receipt handle's text (ints). The C helper's ``pop_handle`` is its twin: a receive's loop calls it a
    message without a Python frame."""
    return HANDLE_TEXT % (partition, offset, attempt, deadline_ms)


handle = speedups.load("pop_handle", handle_py)


def _handle_match(text):
    return _HANDLE.fullmatch(text) if isinstance(text, str) and len(text) <= _MAX_HANDLE else None


def parse_handle(text):
    """``(partition, offset, attempt, deadline_ms)``; InvalidHandle when ``text`` is not a handle."""
    m = _handle_match(text)
    if m is None:
        raise InvalidHandle("invalid receipt handle %r" % (text[:_MAX_HANDLE] if isinstance(text, str) else text))
    p, o, a, d = m.groups()
    return int(p), int(o), int(a), int(d)


def parse_handles_py(handles):
    """``parse_handle`` of each text of the list ``handles``, None for one that is not a handle (for the caller to
    ask ``parse_handle`` why): an ack's handles read in one call. The C helper's ``pop_parse_handles`` is its
    twin."""
    out = []
    for text in handles:
        m = _handle_match(text)
        out.append(None if m is None else tuple(map(int, m.groups())))
    return out


parse_handles = speedups.load("pop_parse_handles", parse_handles_py)
