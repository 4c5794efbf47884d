"""Transaction ids and XA codes as they travel in MetaQ's text protocol (reference §1.3, §7.1).

Ids (the ``txKey`` token of ``put`` and ``transaction``):

    TX:<sessionId>:<n>                                         a local transaction
    XID:<formatId>:<gtrid hex>:<bqual hex>:<uniqueQualifier>   an XA branch (lower-case hex, may be empty)
    null                                                       no transaction (RECOVER sends it)

Failures are ``result 500`` with the body ``XAException:code=<n>,msg=<text>``;
clients read the code back with ``parse_xa_error``. Broker and client share
this module so the two sides cannot disagree on a byte.
"""

import re
from typing import NamedTuple

from metaq.errors import TransactionError
from metaq.protocol.text import parse_xa_error, xa_error_body  # noqa: F401 - a failed reply's body

# XA return codes (X/Open XA, as javax.transaction.xa.XAException and XAResource define them)
XA_OK = 0
XA_RDONLY = 3
XA_RBROLLBACK = 100
XA_RBTIMEOUT = 106
XA_HEURHAZ = 8
XA_HEURCOM = 7
XA_HEURRB = 6
XA_HEURMIX = 5
XAER_RMERR = -3
XAER_NOTA = -4
XAER_INVAL = -5
XAER_PROTO = -6
XAER_RMFAIL = -7
XAER_DUPID = -8

XA_CODE_NAMES = {
    XA_RBROLLBACK: "XA_RBROLLBACK", XA_RBTIMEOUT: "XA_RBTIMEOUT", XA_HEURHAZ: "XA_HEURHAZ",
    XA_HEURCOM: "XA_HEURCOM", XA_HEURRB: "XA_HEURRB", XA_HEURMIX: "XA_HEURMIX", XAER_RMERR: "XAER_RMERR",
    XAER_NOTA: "XAER_NOTA", XAER_INVAL: "XAER_INVAL", XAER_PROTO: "XAER_PROTO", XAER_RMFAIL: "XAER_RMFAIL",
    XAER_DUPID: "XAER_DUPID",
}

#: Characters a uniqueQualifier or a session id may not contain (they would break the key or the line).
_FORBIDDEN = re.compile(r"[\s:]")
_HEX = re.compile(r"[0-9a-f]*")
MAX_BRANCH_BYTES = 64  # XA's MAXGTRIDSIZE / MAXBQUALSIZE


class LocalTxId(NamedTuple):
    """``TX:<session_id>:<value>``: a local transaction of one producer session."""

    session_id: str
    value: int

    @property
    def key(self):
        return "TX:%s:%d" % (self.session_id, self.value)

    @property
    def is_xa(self):
        return False


class XaTxId(NamedTuple):
    """``XID:<format_id>:<gtrid hex>:<bqual hex>:<unique_qualifier>``: one XA branch."""

    format_id: int
    gtrid: bytes
    bqual: bytes
    unique_qualifier: str

    @property
    def key(self):
        return "XID:%d:%s:%s:%s" % (self.format_id, self.gtrid.hex(), self.bqual.hex(), self.unique_qualifier)

    @property
    def is_xa(self):
        return True


def _invalid(text, why):
    return TransactionError(XAER_INVAL, "invalid transaction id %r: %s" % (text[:80], why))


def check_qualifier(text, what="uniqueQualifier"):
    """``text`` if it can be part of a key (no whitespace or ':', not empty), else TransactionError(XAER_INVAL)."""
    if not text or _FORBIDDEN.search(text):
        raise TransactionError(XAER_INVAL, "%s %r must be non-empty without spaces or ':'" % (what, text))
    return text


def parse_tx_key(text):
    """LocalTxId, XaTxId, or None for ``null``; TransactionError(XAER_INVAL) for anything else."""
    if text == "null":
        return None
    parts = text.split(":")
    if parts[0] == "TX":
        if len(parts) != 3 or not parts[1]:
            raise _invalid(text, "expected TX:<sessionId>:<n>")
        if not (parts[2].isascii() and parts[2].lstrip("-").isdigit()):
            raise _invalid(text, "the transaction number must be an integer")
        return LocalTxId(parts[1], int(parts[2]))
    if parts[0] == "XID":
        if len(parts) != 5:
            raise _invalid(text, "expected XID:<formatId>:<gtrid hex>:<bqual hex>:<uniqueQualifier>")
        fmt, gtrid, bqual, qualifier = parts[1:]
        if not (fmt.isascii() and fmt.lstrip("-").isdigit()):
            raise _invalid(text, "formatId must be an integer")
        for name, value in (("gtrid", gtrid), ("bqual", bqual)):
            if not _HEX.fullmatch(value) or len(value) % 2 or len(value) > 2 * MAX_BRANCH_BYTES:
                raise _invalid(text, "%s must be lower-case hex of at most %d bytes" % (name, MAX_BRANCH_BYTES))
        if not qualifier:
            raise _invalid(text, "the uniqueQualifier is empty")
        return XaTxId(int(fmt), bytes.fromhex(gtrid), bytes.fromhex(bqual), qualifier)
    raise _invalid(text, "expected null, TX:... or XID:...")
