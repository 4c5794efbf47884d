"""Quotas per user (auth/quotas.py): where a user's quota is found, the one check, the file's errors."""

import pytest

from metaq.auth import limits as auth_limits
from metaq.idempotence import limits as idempotence_limits
from metaq.transactions import limits as transactions_limits
from metaq.auth.acl import parse_acl
from metaq.auth.quotas import QUOTAS, Quotas, default_quota
from metaq.errors import ConfigError, QuotaExceeded

SECRET = "s" * auth_limits.MIN_USER_SECRET_BYTES


def _acl(**doc):
    users = {"alice": {"secret": SECRET, "roles": ["batch"], "quotas": {"idempotent_producers": 5}},
             "bob": {"secret": SECRET, "roles": ["batch"]},
             "carol": {"secret": SECRET}}
    return parse_acl(dict({"users": users, "roles": {"batch": {"quotas": {"idempotent_producers": 7}}}}, **doc))


def test_the_users_own_quota_then_its_roles_then_the_files_then_half_the_broker_limit():
    quotas = Quotas(lambda: _acl(quotas={"idempotent_producers": 9, "transactions": 4}))
    assert quotas.limit("alice", "idempotent_producers") == 5
    assert quotas.limit("bob", "idempotent_producers") == 7
    assert quotas.limit("carol", "idempotent_producers") == 9
    assert quotas.limit("carol", "transactions") == 4
    bare = Quotas(_acl, {"transactions": 100})
    assert bare.limit("carol", "idempotent_producers") == idempotence_limits.MAX_IDEMPOTENT_PRODUCERS // 2
    assert bare.limit("carol", "transactions") == 50 == default_quota("transactions", 100)
    # authentication off
    assert Quotas(lambda: None).limit(None, "transactions") == transactions_limits.MAX_OPEN_TRANSACTIONS


def test_check_at_the_quota_and_one_past_names_the_quota_the_user_and_its_value():
    quotas = Quotas(lambda: _acl(quotas={"transactions": 3}))
    quotas.check("carol", "transactions", 2)  # the third: at the quota
    with pytest.raises(QuotaExceeded, match="quota transactions of user carol is 3") as caught:
        quotas.check("carol", "transactions", 3)  # one past
    assert (caught.value.quota, caught.value.user, caught.value.limit, caught.value.code) == \
        ("transactions", "carol", 3, 400)
    quotas.check("alice", "idempotent_producers", 4)  # another quota of its own: 5


@pytest.mark.parametrize("doc, message", [
    ({"quotas": {"topics_per_day": 1}}, "'topics_per_day' is not a quota"),
    ({"quotas": {"transactions": -1}}, "quotas.transactions must be a whole number >= 0"),
    ({"quotas": {"transactions": "many"}}, "quotas.transactions must be a whole number"),
    ({"quotas": [1]}, "must map quota names to numbers"),
])
def test_a_bad_quota_is_refused_naming_it(doc, message):
    with pytest.raises(ConfigError, match=message):
        _acl(**doc)


def test_every_quota_divides_a_named_broker_limit():
    for q in QUOTAS.values():
        assert q.limit >= 1 and q.limit_name and q.counts
        assert default_quota(q.name) == int(q.limit * auth_limits.QUOTA_DEFAULT_SHARE)


def test_a_rate_paces_bytes_past_one_seconds_burst_and_no_rate_never_waits():
    quotas = Quotas(lambda: _acl(quotas={"produce_bytes_per_s": 1000}))
    assert quotas.pace("carol", "produce", 1000, now=0.0) == 0  # the one-second burst
    assert quotas.pace("carol", "produce", 500, now=0.0) == pytest.approx(0.5)  # past it: wait for the bytes
    assert quotas.pace("carol", "produce", 1000, now=1.0) == pytest.approx(0.5)  # 1 s later: 1000 more, 500 over
    assert quotas.pace("carol", "fetch", 10**9, now=0.0) == 0  # no fetch rate set: never waits
    assert Quotas(lambda: None).pace(None, "produce", 10**9, now=0.0) == 0  # authentication off
    with pytest.raises(ConfigError, match="produce_bytes_per_s must be a whole number >= 1"):
        _acl(quotas={"produce_bytes_per_s": 0})
