"""Permissions files for tests: a few users with known secrets, written where a broker reads them."""

import os
import time

import yaml

#: name -> secret of the users ``write_acl`` writes by default.
SECRETS = {"admin": "admin-secret-0123456789", "alice": "alice-secret-0123456789",
           "bob": "bob-secret-0123456789", "reader": "reader-secret-0123456789"}

DEFAULT_USERS = {
    "admin": {"secret": SECRETS["admin"], "admin": True},
    # alice: produces and consumes orders*, consumes as group billing (and the RocketMQ retry topics of it)
    "alice": {"secret": SECRETS["alice"],
              "topics": {"orders*": "pub|sub", "payroll": "deny", "%RETRY%billing": "pub|sub"},
              "groups": {"billing": "sub"}},
    # bob: may publish to orders, nothing else
    "bob": {"secret": SECRETS["bob"], "topics": {"orders": "pub"}},
    # reader: through a role, subscribes to every topic but payroll, as any group
    "reader": {"secret": SECRETS["reader"], "roles": ["readers"], "topics": {"payroll": "deny"}},
}
DEFAULT_ROLES = {"readers": {"default_topic": "sub", "default_group": "sub"}}


def write_acl(path, users=None, roles=None, allow=None, quotas=None):
    """Write a permissions file (YAML) at ``path``; returns the path. ``quotas``: every user's default quotas."""
    doc = {"users": DEFAULT_USERS if users is None else users, "roles": DEFAULT_ROLES if roles is None else roles}
    if allow is not None:
        doc["allow"] = allow
    if quotas is not None:
        doc["quotas"] = quotas
    tmp = str(path) + ".tmp"
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:  # the broker refuses o+r
        yaml.safe_dump(doc, f)
    os.replace(tmp, str(path))
    return str(path)


def reload_user(broker, tmp_path, user, **changes):
    """Rewrite ``secured_config``'s permissions file with ``user``'s entry changed by ``changes`` and wait until the
    broker has reloaded it (its log says so)."""
    users = dict(DEFAULT_USERS)
    users[user] = dict(users[user], **changes)
    write_acl(tmp_path / "acl.yaml", users=users, roles=DEFAULT_ROLES)
    wait = time.monotonic() + 10
    while "reloaded: 4 users" not in broker.log_text() and time.monotonic() < wait:
        time.sleep(0.05)
    assert "reloaded: 4 users" in broker.log_text()


def secured_config(tmp_path, users=None, **security):
    """small_config with authentication on (``write_acl``'s users unless ``users``), reloaded every 0.2 s."""
    from metaq.client.local import small_config

    values = {"acl_file": write_acl(tmp_path / "acl.yaml", users=users), "acl_reload_s": 0.2}
    values.update(security)
    return small_config(tmp_path / "data", security=values)


def login(broker, user):
    """A TextClient of ``broker`` authenticated as ``user`` (one of ``SECRETS``)."""
    c = broker.client()
    r = c.auth(user, SECRETS[user])
    assert r.code == 200, r
    return c
