"""The remoting port's route table, built from the registry of served codes (``protocol.rocketmq.requests``): every
declared code has its handler on the owner it names, the spawn policies decide alike, and a code without a
handler stops the port from starting."""

import pytest

from metaq.protocol.rocketmq import requests
from metaq.protocol.rocketmq.remoting import RequestCode as R
from metaq.server.remoting.dispatch import RemotingDispatcher, route_table
from metaq.reqreply.remoting import RemotingReplies
from metaq.server.remoting.send import RemotingSender

OWNERS = {"dispatcher": RemotingDispatcher, "sender": RemotingSender, "replies": RemotingReplies}
SENDS = {R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE, R.CONSUMER_SEND_MSG_BACK}


@pytest.mark.parametrize("sends_wait", [False, True])
def test_every_declared_code_is_routed_to_its_handler(sends_wait):
    table = route_table(OWNERS, sends_wait)
    assert set(table) == set(requests.table())
    for code, (handler, spawn, takes_signer) in table.items():
        declared = requests.by_code(code)
        owner, method = declared.handler.split(".")
        assert handler is getattr(OWNERS[owner], method)
        expected = sends_wait if declared.spawn == requests.SENDS_WAIT else declared.spawn
        assert spawn is expected
        assert takes_signer is (code == R.PULL_MESSAGE)
    assert {code for code, d in requests.table().items() if d.spawn == requests.SENDS_WAIT} == SENDS
    assert {code for code, (_, spawn, _) in route_table(OWNERS, False).items() if spawn} == {
        R.END_TRANSACTION, R.PULL_MESSAGE, R.QUERY_MESSAGE, R.SEND_REPLY_MESSAGE, R.SEND_REPLY_MESSAGE_V2}


def test_an_owner_given_as_none_leaves_its_codes_unserved():
    table = route_table(dict(OWNERS, replies=None), False)
    assert set(requests.table()) - set(table) == {R.SEND_REPLY_MESSAGE, R.SEND_REPLY_MESSAGE_V2}


def test_a_declared_code_without_a_handler_refuses_to_start():
    class Sender:
        send = RemotingSender.send  # no send_back, no end_transaction

    with pytest.raises(TypeError, match=r"without a handler: .*CONSUMER_SEND_MSG_BACK \(36\) -> sender.send_back"):
        route_table(dict(OWNERS, sender=Sender), False)
    with pytest.raises(TypeError, match="PULL_MESSAGE"):
        route_table({"sender": RemotingSender, "replies": None}, False)  # no dispatcher at all
