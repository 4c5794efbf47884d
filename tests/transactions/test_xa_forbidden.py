"""What ``XAResource`` makes of a broker with authentication on (README "Security"): RECOVER lists only the
caller's own branches, and a branch of another user is answered ``403``. The replies are the broker's own
texts (tests/security/test_tx_owners.py checks that a real broker sends them); the client's handling of
them is what is tested here, against the scripted fake broker."""

import pytest

from metaq.client import Message
from metaq.client.transactions import XaError, Xid
from metaq.client.xa import XAResource
from metaq.protocol import events as ev
from metaq.transactions import wire

QUALIFIER = "xa-test"
MINE = "XID:1:67:62:%s" % QUALIFIER
THEIRS = Xid(1, "h", "b")


def forbidden(key):
    return ev.Result(403, b"permission denied: user bob may not act on transaction %s: it belongs to another user "
                          b"(only the user who began it, or an admin, may)" % key.encode(), 0)


def test_a_filtered_recover_and_a_refused_branch(fake):
    replies = {"RECOVER": ev.Result(200, MINE.encode(), 0)}  # the broker left out the branches of others
    broker = fake(lambda e: replies.get(getattr(e, "tx_type", None)))
    with XAResource(brokers=[broker.url], unique_qualifier=QUALIFIER, request_timeout=0.5) as rm:
        assert rm.tpc_recover() == [Xid(1, "g", "b")]
        replies["COMMIT_TWO_PHASE"] = forbidden(THEIRS.key(QUALIFIER))
        with pytest.raises(XaError) as info:
            rm.tpc_commit(THEIRS)  # not listed: asked on the resource broker, refused there
        # an RM error naming the refusal, never XAER_NOTA (which a coordinator would take for "finished")
        assert info.value.xa_code == wire.XAER_RMERR
        assert "403 permission denied: user bob may not act on transaction" in str(info.value)
        assert broker.types()[-2:] == ["RECOVER", "COMMIT_TWO_PHASE"]

        replies["ROLLBACK"] = forbidden("XID:1:6b:62:%s" % QUALIFIER)
        rm.tpc_begin(rm.xid(1, "k", "b"))
        rm.send(Message("tf", b"x"))
        with pytest.raises(XaError) as info:
            rm.tpc_rollback()  # a refused rollback is not counted as rolled back
        assert info.value.xa_code == wire.XAER_RMERR and "403" in str(info.value)
