"""The registry of served RocketMQ request codes (``metaq.protocol.rocketmq.requests``), tested from its declarations:
every code's header decodes a minimal well-formed request and refuses one missing a required field, every code's
needs accept such a request and say what the Guard understands, admin codes need admin, and the pages that list
the codes name exactly the served ones and those the broker sends."""

import json
import pathlib
import re

import pytest

from metaq import errors
from metaq.auth import acl as auth_acl
from metaq.protocol.rocketmq import requests
from metaq.protocol.rocketmq.remoting import RequestCode as R, make_request
from metaq.protocol.rocketmq.requests import (ADMIN, ADMIN_CODES, BROKER_SENT, PUB, SUB, NeedsContext,
                                              RemotingRequest)

DOCS = pathlib.Path(__file__).resolve().parents[3] / "docs"
DECLARED = sorted(requests.table().values(), key=lambda d: d.code)
CONTEXT = NeedsContext(record_topic=lambda offset: "stored", half_topic=lambda number: "halves",
                       reply_topic="DefaultCluster_REPLY_TOPIC")
#: The bodies of the codes whose needs read the body (their header is None).
BODIES = {
    R.HEART_BEAT: json.dumps({"clientID": "c1", "consumerDataSet": [
        {"groupName": "billing", "subscriptionDataSet": [{"topic": "orders", "subString": "*"}]}],
        "producerDataSet": []}).encode(),
    R.LOCK_BATCH_MQ: b'{"clientId":"c1","consumerGroup":"billing","mqSet":[{"brokerName":"b","queueId":0,'
                     b'"topic":"orders"}]}',
}
BODIES[R.UNLOCK_BATCH_MQ] = BODIES[R.LOCK_BATCH_MQ]
BODIES[R.CHECK_CLIENT_CONFIG] = json.dumps({"clientId": "c1", "group": "billing", "subscriptionData": {
    "topic": "orders", "subString": "a > 1", "expressionType": "SQL92"}}).encode()


def required_fields(declared):
    """The ext fields a request of ``declared`` cannot go without, found by its own decoder: each field it says
    is missing is added (as "0", which every field type takes) until it decodes."""
    fields = {}
    while True:
        try:
            declared.decode(make_request(declared.code, fields))
            return fields
        except errors.RemoteProtocolError as exc:
            missing = re.search(r"missing header field (\S+)", str(exc))
            assert missing and missing.group(1) not in fields, exc
            fields[missing.group(1)] = "0"


def minimal(declared):
    fields = required_fields(declared) if declared.header is not None else {}
    return make_request(declared.code, fields, BODIES.get(declared.code, b""))


def test_the_registry_declares_the_served_codes():
    assert {d.code for d in DECLARED} == {
        R.GET_ROUTEINFO_BY_TOPIC, R.GET_BROKER_CLUSTER_INFO, R.SEND_MESSAGE, R.SEND_MESSAGE_V2, R.SEND_BATCH_MESSAGE,
        R.CONSUMER_SEND_MSG_BACK, R.END_TRANSACTION, R.PULL_MESSAGE, R.QUERY_CONSUMER_OFFSET,
        R.UPDATE_CONSUMER_OFFSET, R.SEARCH_OFFSET_BY_TIMESTAMP, R.GET_MAX_OFFSET, R.GET_MIN_OFFSET,
        R.GET_EARLIEST_MSG_STORETIME, R.VIEW_MESSAGE_BY_ID, R.QUERY_MESSAGE, R.HEART_BEAT, R.UNREGISTER_CLIENT,
        R.CHECK_CLIENT_CONFIG, R.GET_CONSUMER_LIST_BY_GROUP, R.LOCK_BATCH_MQ, R.UNLOCK_BATCH_MQ, R.SEND_REPLY_MESSAGE,
        R.SEND_REPLY_MESSAGE_V2}
    assert requests.unsigned_codes() == {R.GET_ROUTEINFO_BY_TOPIC, R.GET_BROKER_CLUSTER_INFO}
    for d in DECLARED:
        assert getattr(R, d.name) == d.code and requests.by_code(d.code) is d


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_each_code_header_decodes_a_minimal_request_and_refuses_one_missing_a_field(declared):
    if declared.header is None:
        return
    fields = required_fields(declared)
    header = declared.decode(make_request(declared.code, fields))
    assert isinstance(header, declared.header)
    for key in fields:
        with pytest.raises(errors.RemoteProtocolError, match="missing header field %s" % key):
            declared.decode(make_request(declared.code, {k: v for k, v in fields.items() if k != key}))


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.name)
def test_each_code_needs_accept_a_well_formed_request(declared):
    assert declared.header is not None or declared.code in BODIES or declared.code == R.GET_BROKER_CLUSTER_INFO
    got = requests.needs_of(minimal(declared), CONTEXT)
    assert len(got) == len(set(got))
    for action, kind, name in got:
        assert (action, kind, name) == (ADMIN, None, None) or (action in (PUB, SUB) and kind in ("topic", "group")
                                                                and isinstance(name, str) and name)
    if not declared.signed:
        assert got == []  # the name server's requests need nothing


@pytest.mark.parametrize("code", sorted(ADMIN_CODES))
def test_admin_codes_need_admin_and_are_not_served(code):
    assert requests.by_code(code) is None
    assert requests.needs_of(make_request(code, {"topic": "x"}), CONTEXT) == [(ADMIN, None, None)]


def test_a_code_not_declared_needs_a_signature_only():
    assert requests.by_code(219) is None
    assert requests.needs_of(make_request(219), CONTEXT) == []
    for code in BROKER_SENT:
        assert requests.by_code(code) is None


def test_the_actions_are_the_guards():
    assert (ADMIN, PUB, SUB) == (auth_acl.ADMIN, auth_acl.PUB, auth_acl.SUB)


@pytest.mark.parametrize("change, problem", [
    (dict(name="PULL_MESSAGE"), "a code its RequestCode name gives"),
    (dict(code=17, name="SEND_MESSAGE"), "a code its RequestCode name gives"),
    (dict(code=R.CHECK_TRANSACTION_STATE, name="CHECK_TRANSACTION_STATE"), "neither an admin's nor the broker's"),
    (dict(header=dict), "a header class"),
    (dict(needs=None), "what it needs of the user"),
    (dict(handler="send"), "a handler named owner.method"),
    (dict(spawn=1), "a spawn policy"),
    (dict(spawn="always"), "a spawn policy"),
])
def test_register_refuses_a_declaration_missing_a_part(change, problem):
    fields = dict(code=R.UNREGISTER_BROKER, name="UNREGISTER_BROKER", header=None, needs=lambda r, ctx: (),
                  handler="dispatcher.unregister_broker")
    fields.update(change)
    before = dict(requests.table())
    with pytest.raises(TypeError, match=problem):
        requests.register(RemotingRequest(**fields))
    assert requests.table() == before


def test_register_refuses_a_code_twice():
    declared = requests.by_code(R.PULL_MESSAGE)
    with pytest.raises(TypeError, match="declared twice"):
        requests.register(declared)
    assert requests.by_code(R.PULL_MESSAGE) is declared


def table_codes(page, heading):
    """Every code the first column of the table under ``heading`` (its header row) names."""
    lines = (DOCS / page).read_text().splitlines()
    start = lines.index(heading)
    codes = set()
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        codes.update(int(n) for n in re.findall(r"\d+", line.split("|")[1]))
    return codes


@pytest.mark.parametrize("page, heading", [
    ("rocketmq-codes.md", "| code | request | who sends it, and when |"),
    ("rocketmq.md", "| code | request | what metaq does |"),
])
def test_the_pages_name_the_served_codes_and_those_the_broker_sends(page, heading):
    assert table_codes(page, heading) == set(requests.table()) | BROKER_SENT
