"""The permissions file model (metaq.auth.acl): parsing with clear errors, and the decision rules."""

import pytest

from metaq import limits
from metaq.auth import limits as auth_limits
from metaq.auth.acl import PUB, SUB, parse_acl
from metaq.errors import ConfigError

#: A secret of the shortest length a permissions file accepts.
S = "s" * auth_limits.MIN_USER_SECRET_BYTES


def acl(users, roles=None, allow=None):
    doc = {"users": users}
    if roles is not None:
        doc["roles"] = roles
    if allow is not None:
        doc["allow"] = allow
    return parse_acl(doc)


def test_exact_rule_beats_pattern_and_more_literal_pattern_beats_shorter():
    a = acl({"u": {"secret": S, "topics": {"orders*": "pub|sub", "orders-secret": "deny", "o*": "sub"},
                   "default_topic": "deny"}}).user("u")
    assert a.may(PUB, "topic", "orders-1") and a.may(SUB, "topic", "orders-1")
    assert not a.may(PUB, "topic", "orders-secret") and not a.may(SUB, "topic", "orders-secret")
    assert a.may(SUB, "topic", "other") and not a.may(PUB, "topic", "other")  # "o*" (1 literal) decides
    assert not a.may(SUB, "topic", "x")  # no rule: the default


def test_no_rule_and_no_default_is_deny():
    u = acl({"u": {"secret": S}}).user("u")
    assert not u.may(PUB, "topic", "t") and not u.may(SUB, "topic", "t") and not u.may(SUB, "group", "g")
    assert not u.admin


def test_user_rule_beats_role_rule_and_role_default_applies():
    a = acl({"u": {"secret": S, "roles": ["readers"], "topics": {"payroll": "deny"}}},
            roles={"readers": {"topics": {"payroll": "sub"}, "default_topic": "sub", "default_group": "sub"}})
    u = a.user("u")
    assert not u.may(SUB, "topic", "payroll")  # the user's own deny wins over the role's grant of the same name
    assert u.may(SUB, "topic", "anything") and not u.may(PUB, "topic", "anything")
    assert u.may(SUB, "group", "g")


def test_deny_wins_between_equal_rules_of_roles():
    a = acl({"u": {"secret": S, "roles": ["r1", "r2"]}},
            roles={"r1": {"topics": {"t": "pub|sub"}}, "r2": {"topics": {"t": "deny"}}})
    assert not a.user("u").may(SUB, "topic", "t")


def test_admin_may_everything_and_a_role_can_make_an_admin():
    a = acl({"root": {"secret": S, "admin": True}, "op": {"secret": S, "roles": ["ops"]}},
            roles={"ops": {"admin": True}})
    for name in ("root", "op"):
        u = a.user(name)
        assert u.admin and u.may(PUB, "topic", "anything") and u.may(SUB, "group", "any")


def test_group_permissions_are_sub_or_deny():
    u = acl({"u": {"secret": S, "groups": {"billing": "sub", "bill*": "deny"}}}).user("u")
    assert u.may(SUB, "group", "billing") and not u.may(SUB, "group", "billing2")
    with pytest.raises(ConfigError, match=r"users.u.groups.g: 'pub' is not a permission"):
        acl({"u": {"secret": S, "groups": {"g": "pub"}}})


def test_address_lists_global_and_per_user():
    a = acl({"u": {"secret": S, "allow": ["10.1.0.0/16"]}}, allow=["127.0.0.1", "10.0.0.0/8", "::1"])
    assert a.address_allowed("127.0.0.1") and a.address_allowed("10.200.1.1") and a.address_allowed("::1")
    assert a.address_allowed("::ffff:10.1.2.3")  # an IPv4 peer on a dual-stack socket
    assert not a.address_allowed("127.0.0.2") and not a.address_allowed("not-an-address")
    u = a.user("u")
    assert u.allowed_from("10.1.2.3") and not u.allowed_from("10.2.0.1")
    assert parse_acl({"users": {}}).address_allowed("203.0.113.9")  # no list: any address


@pytest.mark.parametrize("doc, message", [
    ([], "must contain a mapping"),
    ({"user": {}}, "unknown setting user"),
    ({"users": {"u": {}}}, r"users.u.secret must be a non-empty string"),
    ({"users": {"u": {"secret": ""}}}, r"users.u.secret must be a non-empty string"),
    ({"users": {"u": {"secret": S, "admin": "yes"}}}, r"users.u.admin must be true or false"),
    ({"users": {"u": {"secret": S, "topics": {"t": "write"}}}}, r"users.u.topics.t: 'write' is not a permission"),
    ({"users": {"u": {"secret": S, "topics": ["t"]}}}, r"users.u.topics must map names"),
    ({"users": {"u": {"secret": S, "roles": ["nope"]}}}, r"no role called nope"),
    ({"users": {"u": {"secret": S, "colour": "red"}}}, r"users.u: unknown setting colour"),
    ({"users": {"bad name": {"secret": S}}}, r"'bad name' is not a name"),
    ({"users": {}, "allow": ["10.0.0.300"]}, r"allow.0: '10.0.0.300' is not an address"),
    ({"users": {}, "allow": "10.0.0.0/8"}, r"allow must be a list"),
    ({"users": {"u": {"secret": "x" * (limits.MAX_SECRET_BYTES + 1)}}}, r"secret is longer than"),
    ({"users": {"u": {"secret": "x" * (auth_limits.MIN_USER_SECRET_BYTES - 1)}}},
     r"users.u.secret is %d bytes: at least %d are needed" % (auth_limits.MIN_USER_SECRET_BYTES - 1,
                                                              auth_limits.MIN_USER_SECRET_BYTES)),
])
def test_bad_files_are_refused_naming_the_setting(doc, message):
    with pytest.raises(ConfigError, match=message):
        parse_acl(doc)


def test_rule_count_limit_and_one_past():
    rules = {"t%d" % i: "sub" for i in range(auth_limits.MAX_ACL_RULES)}
    assert acl({"u": {"secret": S, "topics": rules}}).user("u").may(SUB, "topic", "t7")
    rules["one-more"] = "sub"
    with pytest.raises(ConfigError, match="rules: the limit is %d" % auth_limits.MAX_ACL_RULES):
        acl({"u": {"secret": S, "topics": rules}})


def test_user_count_limit_and_one_past():
    users = {"u%d" % i: {"secret": S} for i in range(auth_limits.MAX_ACL_USERS)}
    assert len(parse_acl({"users": users}).users) == auth_limits.MAX_ACL_USERS
    users["one-more"] = {"secret": S}
    with pytest.raises(ConfigError, match="the limit is %d" % auth_limits.MAX_ACL_USERS):
        parse_acl({"users": users})


def test_repr_never_shows_the_secret():
    u = acl({"u": {"secret": "hunter2-very-secret"}}).user("u")
    assert "hunter2" not in repr(u)


# -- the decision table: the same answers as deciding rule by rule, fast, and bounded --------------------------

from hypothesis import given, strategies as st  # noqa: E402

_names = st.text(alphabet="ab-*?", min_size=1, max_size=5)
_perm = st.sampled_from(["pub", "sub", "pub|sub", "deny"])
_grant = st.fixed_dictionaries({}, optional={
    "topics": st.dictionaries(_names, _perm, max_size=6),
    "default_topic": _perm,
    "groups": st.dictionaries(_names, st.sampled_from(["sub", "deny"]), max_size=4),
    "default_group": st.sampled_from(["sub", "deny"]),
})


def may_slowly(user, action, kind, name):
    """``User.may`` decided rule by rule, as acl.py's docstring says: the reference the decision table is held to."""
    if user.admin:
        return True
    best, best_rank = None, None
    for i, grants in enumerate(user.grants):
        owner_rank = 1 if i == 0 else 0
        for rule in (grants.topics if kind == "topic" else grants.groups):
            if rule.matches(name):
                rank = rule.rank(owner_rank)
                if best_rank is None or rank > best_rank:
                    best, best_rank = rule, rank
    if best is not None:
        return action in best.perms
    for grants in user.grants:
        default = grants.default_topic if kind == "topic" else grants.default_group
        if default is not None:
            return action in default
    return False


@given(own=_grant, roles=st.lists(_grant, max_size=3),
       asked=st.lists(st.text(alphabet="ab-", min_size=1, max_size=5), min_size=1, max_size=12))
def test_the_decision_table_answers_as_the_rules_do_one_by_one(own, roles, asked):
    doc = {"roles": {"r%d" % i: dict(r) for i, r in enumerate(roles)},
           "users": {"u": dict(own, secret=S, roles=["r%d" % i for i in range(len(roles))])}}
    user = parse_acl(doc).user("u")
    for _twice in range(2):  # the second time from the remembered answers
        for name in asked:
            for action, kind in ((PUB, "topic"), (SUB, "topic"), (SUB, "group")):
                assert user.may(action, kind, name) == may_slowly(user, action, kind, name), (action, kind, name)


def test_a_user_with_the_most_pattern_rules_is_decided_without_trying_them_all_again():
    rules = {"t%d-*" % i: "sub" for i in range(auth_limits.MAX_ACL_RULES - 1)}
    rules["orders-*"] = "pub|sub"
    user = parse_acl({"users": {"u": {"secret": S, "topics": rules}}}).user("u")
    calls = []
    for rule in user._decisions["topic"].patterns:  # count the regular expressions tried
        real = rule.regex

        class Counted:
            def match(self, name, real=real):
                calls.append(name)
                return real.match(name)
        rule.regex = Counted()
    assert user.may(PUB, "topic", "orders-eu") and user.may(SUB, "topic", "t7-x")
    first = len(calls)
    assert first <= 2 * auth_limits.MAX_ACL_RULES
    for _ in range(100):
        assert user.may(PUB, "topic", "orders-eu") and not user.may(PUB, "topic", "t7-x")
    assert len(calls) == first  # remembered: no rule tried again


def test_the_remembered_answers_stop_at_their_limit_and_the_oldest_goes_first():
    user = parse_acl({"users": {"u": {"secret": S, "topics": {"a*": "pub"}}}}).user("u")
    table = user._decisions["topic"]
    for i in range(auth_limits.MAX_ACL_DECISIONS_CACHED):
        assert user.may(PUB, "topic", "a%d" % i)
    assert len(table.answers) == auth_limits.MAX_ACL_DECISIONS_CACHED and "a0" in table.answers
    assert not user.may(PUB, "topic", "b")  # one past: the oldest answer is forgotten
    assert len(table.answers) == auth_limits.MAX_ACL_DECISIONS_CACHED
    assert "a0" not in table.answers and "b" in table.answers
    assert user.may(PUB, "topic", "a0")  # decided again, the same
