"""The broker's one authorization check (metaq.server.guard), without a network: the text handshake, the
checks every front-end makes, reloads of the permissions file and the back-off for guessers."""

import os

import pytest

from metaq import errors
from metaq.auth import limits as auth_limits
from metaq.auth import proofs
from metaq.server.config import load_config
from metaq.server.guard import ADMIN, PUB, SUB, Guard
from tests.harness.acl import SECRETS, write_acl


@pytest.fixture
def guard(tmp_path):
    path = write_acl(tmp_path / "acl.yaml")
    return Guard(load_config(None, {"security.acl_file": path}).security)


def login(guard, session, user, secret=None, now=100.0):
    nonce = guard.challenge(session, user, now=now)
    client_nonce = proofs.new_nonce()
    secret = (secret or SECRETS[user]).encode()
    server = guard.answer(session, user, client_nonce, proofs.text_proof(secret, "client", user, nonce, client_nonce),
                          now=now + 1)
    assert proofs.same(server, proofs.text_proof(secret, "server", user, nonce, client_nonce))
    return session


def test_handshake_marks_the_session_and_checks_follow_the_file(guard):
    s = login(guard, guard.session("127.0.0.1"), "alice")
    assert s.user == "alice"
    guard.require(s, PUB, "topic", "orders-eu")
    guard.require(s, SUB, "group", "billing")
    with pytest.raises(errors.Forbidden, match="alice may not publish to topic payroll"):
        guard.require(s, PUB, "topic", "payroll")
    with pytest.raises(errors.Forbidden, match="alice may not consume as group other"):
        guard.require(s, SUB, "group", "other")
    with pytest.raises(errors.Forbidden, match="not an admin"):
        guard.require(s, ADMIN)
    assert guard.owner(s) == "alice" and not guard.is_admin(s)


def test_no_user_yet_is_401(guard):
    with pytest.raises(errors.Unauthenticated, match="authentication required"):
        guard.require(guard.session("127.0.0.1"), SUB, "topic", "orders")
    with pytest.raises(errors.Unauthenticated):
        guard.require(None, ADMIN)


@pytest.mark.parametrize("case, message", [
    ("no nonce", "no nonce outstanding"),
    ("expired", "the nonce expired"),
    ("other user", "the nonce was given to user bob"),
    ("unknown user", "unknown user or wrong secret"),
    ("wrong secret", "unknown user or wrong secret"),
    ("replayed", "no nonce outstanding"),
])
def test_every_bad_handshake_is_401(guard, case, message):
    s = guard.session("127.0.0.1")
    user, secret, now = "alice", SECRETS["alice"].encode(), 100.0
    if case == "replayed":
        login(guard, s, "alice")
        s = guard.session("127.0.0.1")
    nonce = None if case in ("no nonce", "replayed") else guard.challenge(s, "bob" if case == "other user" else
                                                                           "nobody" if case == "unknown user" else user,
                                                                           now=now)
    if case == "unknown user":
        user = "nobody"
    if case == "wrong secret":
        secret = b"not-the-secret"
    later = now + (auth_limits.AUTH_NONCE_TTL_S + 1 if case == "expired" else 1)
    client_nonce = proofs.new_nonce()
    proof = proofs.text_proof(secret, "client", user, nonce or "0" * 32, client_nonce)
    with pytest.raises(errors.Unauthenticated, match=message):
        guard.answer(s, user, client_nonce, proof, now=later)
    assert s.user is None
    with pytest.raises(errors.Unauthenticated, match="no nonce outstanding"):  # the nonce is used up either way
        guard.answer(s, user, client_nonce, proof, now=later)


def test_nonce_valid_until_its_ttl(guard):
    s = guard.session("127.0.0.1")
    nonce = guard.challenge(s, "bob", now=0.0)
    c = proofs.new_nonce()
    guard.answer(s, "bob", c, proofs.text_proof(SECRETS["bob"].encode(), "client", "bob", nonce, c),
                 now=auth_limits.AUTH_NONCE_TTL_S)
    assert s.user == "bob"


def test_backoff_after_repeated_failures_and_address_memory_is_bounded(guard):
    delays = [guard.failed("10.0.0.1", now=float(i)) for i in range(auth_limits.AUTH_FAILURES_BEFORE_DELAY + 2)]
    assert delays[:auth_limits.AUTH_FAILURES_BEFORE_DELAY] == [0.0] * auth_limits.AUTH_FAILURES_BEFORE_DELAY
    assert delays[-1] == auth_limits.AUTH_FAILURE_DELAY_S
    # a window later the address starts afresh
    assert guard.failed("10.0.0.1", now=1000.0) == 0.0
    for i in range(auth_limits.MAX_AUTH_FAILURE_ADDRESSES + 10):
        guard.failed("h%d" % i, now=2000.0)
    assert guard.failing_addresses == auth_limits.MAX_AUTH_FAILURE_ADDRESSES


def test_reload_applies_at_once_and_a_bad_file_keeps_the_old(guard, tmp_path):
    s = login(guard, guard.session("127.0.0.1"), "bob")
    guard.require(s, PUB, "topic", "orders")
    users = {"bob": {"secret": SECRETS["bob"], "topics": {"orders": "deny"}}}
    write_acl(guard.path, users=users, roles={})
    os.utime(guard.path, ns=(1, 1))  # a new mtime, even within one clock tick
    assert guard.reload(state=None)
    with pytest.raises(errors.Forbidden):
        guard.require(s, PUB, "topic", "orders")
    with open(guard.path, "w") as f:
        f.write("users: [this is: not valid\n")
    assert not guard.reload(state=None)
    assert "not valid YAML" in guard.reload_error
    with pytest.raises(errors.Forbidden):  # still the last good file
        guard.require(s, PUB, "topic", "orders")
    write_acl(guard.path, users={}, roles={})  # bob removed: his open session loses its rights
    assert guard.reload(state=None) and guard.reload_error is None
    with pytest.raises(errors.Unauthenticated, match="no longer allowed"):
        guard.require(s, PUB, "topic", "orders")


def test_allow_list(tmp_path):
    path = write_acl(tmp_path / "acl.yaml", allow=["127.0.0.1"])
    g = Guard(load_config(None, {"security.acl_file": path}).security)
    assert g.admit("127.0.0.1") is None
    assert "127.0.0.2 is not in the allow-list" in g.admit("127.0.0.2")


def test_a_bad_or_oversized_file_stops_the_start(tmp_path):
    path = tmp_path / "acl.yaml"
    path.write_text("users:\n  alice: {secret: alice-secret-0123, topics: {t: write}}\n")
    path.chmod(0o600)
    with pytest.raises(errors.ConfigError, match="users.alice.topics.t: 'write' is not a permission"):
        Guard(load_config(None, {"security.acl_file": str(path)}).security)
    path.write_text("#" * (auth_limits.MAX_ACL_FILE_BYTES + 1))
    with pytest.raises(errors.ConfigError, match="the limit is %d" % auth_limits.MAX_ACL_FILE_BYTES):
        Guard(load_config(None, {"security.acl_file": str(path)}).security)
    with pytest.raises(errors.ConfigError, match="cannot read security.acl_file"):
        Guard(load_config(None, {"security.acl_file": str(tmp_path / "missing.yaml")}).security)


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o602, 0o601, 0o666])
def test_a_permissions_file_others_may_read_or_write_is_refused_naming_its_mode(tmp_path, mode):
    path = write_acl(tmp_path / "acl.yaml")
    os.chmod(path, mode)
    with pytest.raises(errors.ConfigError, match="has mode %04o: other users may read or change" % mode):
        Guard(load_config(None, {"security.acl_file": path}).security)


def test_a_reload_that_finds_the_file_opened_to_others_keeps_the_old_one(guard):
    s = login(guard, guard.session("127.0.0.1"), "bob")
    os.chmod(guard.path, 0o640)  # a group of operators may read it
    os.utime(guard.path, ns=(2, 2))
    assert guard.reload(state=None)
    os.chmod(guard.path, 0o644)
    os.utime(guard.path, ns=(3, 3))
    assert not guard.reload(state=None)
    assert "has mode 0644" in guard.reload_error
    guard.require(s, PUB, "topic", "orders")  # the last good file still decides


def test_an_unknown_user_is_checked_against_a_secret_as_a_known_one_is(guard):
    seen = []

    def matches(secret):
        seen.append(secret)
        return True  # even a proof that "matches" never logs in a user who does not exist

    assert guard.check_login("nobody", matches) is None
    assert guard.check_login("alice", matches).name == "alice"
    assert len(seen) == 2 and seen[1] == SECRETS["alice"].encode()
    assert len(seen[0]) >= auth_limits.MIN_USER_SECRET_BYTES and seen[0] != seen[1]
    assert guard.check_login("alice", lambda secret: False) is None


def test_guessers_rotating_addresses_within_a_prefix_are_slowed_too(guard):
    delays = [guard.failed("10.9.8.%d" % (i + 1), now=float(i))  # one failure per address: never the address's limit
              for i in range(auth_limits.AUTH_PREFIX_FAILURES_BEFORE_DELAY + 2)]
    assert (delays[:auth_limits.AUTH_PREFIX_FAILURES_BEFORE_DELAY]
            == [0.0] * auth_limits.AUTH_PREFIX_FAILURES_BEFORE_DELAY)
    assert delays[-1] == auth_limits.AUTH_FAILURE_DELAY_S
    assert guard.failed("10.9.9.1", now=30.0) == 0.0  # the next /24 is not this one's
    v6 = [guard.failed("2001:db8:0:1::%x" % (i + 1), now=float(i))
          for i in range(auth_limits.AUTH_PREFIX_FAILURES_BEFORE_DELAY + 1)]
    assert v6[-2] == 0.0 and v6[-1] == auth_limits.AUTH_FAILURE_DELAY_S
    assert guard.failed("2001:db8:0:2::1", now=30.0) == 0.0  # another /64


def test_failure_prefixes():
    from metaq.auth.acl import failure_prefix
    assert failure_prefix("10.1.2.3") == "10.1.2.0/24"
    assert failure_prefix("::ffff:10.1.2.3") == "10.1.2.0/24"
    assert failure_prefix("2001:db8:1:2:3::4") == "2001:db8:1:2::/64"
    assert failure_prefix("unix") is None


def test_auth_off_lets_everything_through():
    g = Guard(load_config(None).security)
    g.require(None, ADMIN)
    g.require(g.session("1.2.3.4"), PUB, "topic", "t")
    assert g.is_admin(None) and g.status() == ("off", "off")

