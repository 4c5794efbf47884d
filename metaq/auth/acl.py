"""Users, roles and permissions: the parsed ``security.acl_file`` and the one decision made from it.

Pure logic (no file, no socket, no clock): ``parse_acl(document)`` turns the YAML document into an ``Acl``
or raises ``ConfigError`` naming every problem; ``Acl.decide(user, action, resource)`` says whether a user
may do something. The server's guard (``metaq.server.guard``) reads the file, reloads it when it changes
and asks this module, for every front-end alike.

The file (docs/security.md)::

    allow: [127.0.0.1, 10.0.0.0/8]   # global address allow-list (RocketMQ's globalWhiteRemoteAddresses);
                                     # absent: every address may connect (and must still authenticate)
    quotas:                          # optional: every user's default quotas (metaq.auth.quotas)
      idempotent_producers: 1000
    roles:                           # optional: named sets of permissions users take on
      readers:
        topics: {"*": sub}
        quotas: {idempotent_producers: 100}
    users:
      alice:
        secret: "a long random string"   # the secret key (RocketMQ's secretKey); the name is the access key
        admin: false                     # admin: every topic and group, and the admin operations
        roles: [readers]
        allow: [10.1.0.0/16]             # optional: this user only from these addresses
        topics:                          # topic (or pattern) -> pub | sub | pub|sub | deny
          orders: pub|sub
          "audit-*": sub
          payroll: deny
        default_topic: deny              # a topic no rule names (default deny)
        groups:                          # consumer group (or pattern) -> sub | deny
          billing: sub
        default_group: deny
        quotas: {idempotent_producers: 2000}   # optional: this user's own quotas (before its roles', the file's)

A rule's pattern may use ``*`` (any run of characters) and ``?`` (one character). The most specific rule
that matches decides: an exact name first, then the pattern with the most literal characters; between
equals, the user's own rule before a role's, and ``deny`` before a grant. No rule: the user's default, else
the first of its roles' defaults that is set, else deny.
"""

import fnmatch
import ipaddress
import re

from metaq import limits
from metaq.auth import limits as auth_limits
from metaq.auth.quotas import RATES, parse_quotas
from metaq.errors import ConfigError

__all__ = ["PUB", "SUB", "ADMIN", "Acl", "User", "parse_acl", "parse_addresses"]

PUB = "pub"
SUB = "sub"
ADMIN = "admin"

_PERMS = {"pub": frozenset({PUB}), "sub": frozenset({SUB}), "pub|sub": frozenset({PUB, SUB}),
          "sub|pub": frozenset({PUB, SUB}), "deny": frozenset()}
_GROUP_PERMS = {"sub": frozenset({SUB}), "pub|sub": frozenset({SUB}), "sub|pub": frozenset({SUB}),
                "deny": frozenset()}
_USER_KEYS = {"secret", "admin", "roles", "allow", "topics", "default_topic", "groups", "default_group", "quotas"}
_ROLE_KEYS = {"admin", "topics", "default_topic", "groups", "default_group", "quotas"}
_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,128}\Z")


class _Rule:
    __slots__ = ("pattern", "perms", "exact", "literal", "regex")

    def __init__(self, pattern, perms):
        self.pattern = pattern
        self.perms = perms
        self.exact = "*" not in pattern and "?" not in pattern
        self.literal = len(pattern.replace("*", "").replace("?", ""))
        self.regex = None if self.exact else re.compile(fnmatch.translate(pattern))

    def matches(self, name):
        return name == self.pattern if self.exact else self.regex.match(name) is not None

    def rank(self, owner_rank):
        """Larger wins: exact, then more literal characters, then the user's own rule, then deny."""
        return (self.exact, self.literal, owner_rank, not self.perms)


class _Grants:
    """One user's or role's rules: topics, groups, the two defaults and the admin flag."""

    __slots__ = ("admin", "topics", "default_topic", "groups", "default_group", "quotas")

    def __init__(self, admin, topics, default_topic, groups, default_group, quotas=None):
        self.quotas = quotas or {}  # quota name -> value (metaq.auth.quotas)
        self.admin = admin
        self.topics = topics
        self.default_topic = default_topic
        self.groups = groups
        self.default_group = default_group


class _Decisions:
    """One user's rules for one kind (topics or groups), arranged to decide a name quickly: exact names in a
    dict, the patterns in the order they win (the first that matches is the best), and the answers given so far
    (at most ``limits.MAX_ACL_DECISIONS_CACHED`` names; a reload builds new users, so they are never stale)."""

    __slots__ = ("exact", "patterns", "default", "answers")

    def __init__(self, grants, kind):
        ranked = []
        for i, g in enumerate(grants):
            owner_rank = 1 if i == 0 else 0  # the user's own rules, then any role's alike
            for rule in (g.topics if kind == "topic" else g.groups):
                ranked.append((rule.rank(owner_rank), len(ranked), rule))
        ranked.sort(key=lambda r: (r[0], -r[1]), reverse=True)  # best first; between equals, the one met first
        self.exact = {}
        for _rank, _n, rule in ranked:
            if rule.exact:
                self.exact.setdefault(rule.pattern, rule.perms)
        self.patterns = tuple(rule for _rank, _n, rule in ranked if not rule.exact)
        self.default = frozenset()
        for g in grants:
            default = g.default_topic if kind == "topic" else g.default_group
            if default is not None:
                self.default = default
                break
        self.answers = {}

    def perms(self, name):
        """The permissions (a frozenset of PUB, SUB) the rules give ``name``."""
        answer = self.answers.get(name)
        if answer is not None:
            return answer
        answer = self.exact.get(name)
        if answer is None:
            answer = next((rule.perms for rule in self.patterns if rule.regex.match(name) is not None), self.default)
        if len(self.answers) >= auth_limits.MAX_ACL_DECISIONS_CACHED:
            del self.answers[next(iter(self.answers))]  # the oldest: names are the clients' to choose
        self.answers[name] = answer
        return answer


class User:
    """One user: the name (access key), the secret, where it may connect from and what it may do."""

    __slots__ = ("name", "secret", "allow", "grants", "_decisions")

    def __init__(self, name, secret, allow, grants):
        self.name = name
        self.secret = secret  # bytes
        self.allow = allow  # tuple of ip networks, or None: any address the global list lets in
        self.grants = grants  # the user's own _Grants first, then its roles'
        self._decisions = {"topic": _Decisions(grants, "topic"), "group": _Decisions(grants, "group")}

    @property
    def admin(self):
        return any(g.admin for g in self.grants)

    def __repr__(self):  # never the secret
        return "User(%r%s)" % (self.name, ", admin" if self.admin else "")

    def allowed_from(self, host):
        return self.allow is None or address_in(host, self.allow)

    def may(self, action, kind, name):
        """True when this user may ``action`` (PUB or SUB) the ``kind`` (``"topic"``/``"group"``) called ``name``."""
        return self.admin or action in self._decisions[kind].perms(name)

    def quota(self, name):
        """Quota ``name`` as the user's own rules, then its roles' set it (in order), or None."""
        for g in self.grants:
            value = g.quotas.get(name)
            if value is not None:
                return value
        return None


class Acl:
    """The parsed file: users by name, the global address allow-list (None: any address), the default quotas."""

    def __init__(self, users, allow, quotas=None):
        self.users = users
        self.allow = allow
        self.quotas = quotas or {}  # every user's default quotas (the file's top-level ``quotas:``)
        #: True when the file sets a rate for anyone (``metaq.auth.quotas.RATES``): connections are paced only then
        self.has_rates = any(name in RATES for name in self.quotas) or any(
            name in RATES for u in users.values() for g in u.grants for name in g.quotas)

    def user(self, name):
        return self.users.get(name)

    def quota(self, user_name, name):
        """Quota ``name`` of user ``user_name`` as the file sets it (the user's, its roles', the file's default),
        or None: the built-in default applies (``metaq.auth.quotas``)."""
        user = self.users.get(user_name)
        found = None if user is None else user.quota(name)
        return self.quotas.get(name) if found is None else found

    def address_allowed(self, host):
        return self.allow is None or address_in(host, self.allow)


def address_in(host, networks):
    """True when the address ``host`` (text; an IPv4-mapped IPv6 address counts as its IPv4) is in one of
    ``networks`` (``ip_network``s); False for a name that is no address."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return any(address in net for net in networks)


def parse_addresses(entries, where):
    """A list of addresses and CIDR networks -> tuple of ``ip_network``; ConfigError naming the bad entry."""
    if not isinstance(entries, list):
        raise ConfigError("%s must be a list of addresses or networks (10.0.0.0/8), got %r" % (where, entries))
    if len(entries) > auth_limits.MAX_ACL_RULES:
        raise ConfigError("%s lists %d entries: the limit is %d" % (where, len(entries), auth_limits.MAX_ACL_RULES))
    nets = []
    for i, entry in enumerate(entries):
        try:
            nets.append(ipaddress.ip_network(str(entry), strict=False))
        except ValueError:
            raise ConfigError("%s.%d: %r is not an address or a network such as 10.0.0.0/8" % (where, i, entry)) \
                from None
    return tuple(nets)


def _perms(value, table, where):
    text = str(value).replace(" ", "").lower() if isinstance(value, str) else value
    if text not in table:
        raise ConfigError("%s: %r is not a permission: use one of %s" % (where, value, ", ".join(sorted(table))))
    return table[text]


def _rules(mapping, table, where):
    if mapping is None:
        return ()
    if not isinstance(mapping, dict):
        raise ConfigError("%s must map names (or patterns) to permissions, got %r" % (where, mapping))
    if len(mapping) > auth_limits.MAX_ACL_RULES:
        raise ConfigError("%s has %d rules: the limit is %d" % (where, len(mapping), auth_limits.MAX_ACL_RULES))
    rules = []
    for name, value in mapping.items():
        if not isinstance(name, str) or not name or len(name) > limits.MAX_NAME_BYTES:
            raise ConfigError("%s: %r is not a topic or group name or pattern" % (where, name))
        rules.append(_Rule(name, _perms(value, table, "%s.%s" % (where, name))))
    return tuple(rules)


def _grants(entry, where, keys):
    unknown = set(entry) - keys
    if unknown:
        raise ConfigError("%s: unknown setting%s %s (known: %s)" % (where, "s" if len(unknown) > 1 else "",
                                                                   ", ".join(sorted(map(str, unknown))),
                                                                   ", ".join(sorted(keys))))
    admin = entry.get("admin", False)
    if not isinstance(admin, bool):
        raise ConfigError("%s.admin must be true or false, got %r" % (where, admin))
    default_topic = entry.get("default_topic")
    default_group = entry.get("default_group")
    return _Grants(admin, _rules(entry.get("topics"), _PERMS, where + ".topics"),
                   None if default_topic is None else _perms(default_topic, _PERMS, where + ".default_topic"),
                   _rules(entry.get("groups"), _GROUP_PERMS, where + ".groups"),
                   None if default_group is None else _perms(default_group, _GROUP_PERMS, where + ".default_group"),
                   parse_quotas(entry.get("quotas"), where + ".quotas"))


def _named_entries(doc, key, source):
    entries = doc.get(key) or {}
    if not isinstance(entries, dict):
        raise ConfigError("%s: %s must map names to settings" % (source, key))
    if len(entries) > auth_limits.MAX_ACL_USERS:
        raise ConfigError("%s: %d %s: the limit is %d" % (source, len(entries), key, auth_limits.MAX_ACL_USERS))
    for name, entry in entries.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError("%s: %s: %r is not a name (letters, digits, _ . @ -, at most 128)" % (source, key, name))
        if not isinstance(entry, dict):
            raise ConfigError("%s: %s.%s must be a mapping of settings" % (source, key, name))
    return entries


def parse_acl(doc, source="the permissions file"):
    """The ``Acl`` of a loaded YAML document; ConfigError (one line, naming the setting) for anything wrong."""
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError("%s must contain a mapping (allow, roles, users) at the top level" % source)
    unknown = set(doc) - {"allow", "roles", "users", "quotas"}
    if unknown:
        raise ConfigError("%s: unknown setting %s (known: allow, quotas, roles, users)"
                          % (source, ", ".join(map(str, unknown))))
    allow = parse_addresses(doc["allow"], "%s: allow" % source) if doc.get("allow") is not None else None
    roles = {name: _grants(entry, "%s: roles.%s" % (source, name), _ROLE_KEYS)
             for name, entry in _named_entries(doc, "roles", source).items()}
    users = {}
    for name, entry in _named_entries(doc, "users", source).items():
        where = "%s: users.%s" % (source, name)
        secret = entry.get("secret")
        if not isinstance(secret, str) or not secret:
            raise ConfigError("%s.secret must be a non-empty string" % where)
        secret = secret.encode("utf-8")
        if len(secret) > limits.MAX_SECRET_BYTES:
            raise ConfigError("%s.secret is longer than %d bytes" % (where, limits.MAX_SECRET_BYTES))
        if len(secret) < auth_limits.MIN_USER_SECRET_BYTES:
            raise ConfigError("%s.secret is %d bytes: at least %d are needed (a random string: openssl rand -hex 16)"
                              % (where, len(secret), auth_limits.MIN_USER_SECRET_BYTES))
        own = _grants(entry, where, _USER_KEYS)
        taken = entry.get("roles") or []
        if not isinstance(taken, list) or not all(isinstance(r, str) for r in taken):
            raise ConfigError("%s.roles must be a list of role names" % where)
        missing = [r for r in taken if r not in roles]
        if missing:
            raise ConfigError("%s.roles: no role called %s (roles: %s)" % (where, ", ".join(missing),
                                                                         ", ".join(sorted(roles)) or "none"))
        user_allow = entry.get("allow")
        users[name] = User(name, secret, None if user_allow is None else parse_addresses(user_allow, where + ".allow"),
                           (own,) + tuple(roles[r] for r in taken))
    return Acl(users, allow, parse_quotas(doc.get("quotas"), "%s: quotas" % source))


def failure_prefix(host, v4_bits=auth_limits.AUTH_PREFIX_V4):
    """The network a failed login from ``host`` is also counted under: its IPv4 /24 (``v4_bits``) or IPv6 /64
    (``limits``), as text; None for a name that is no address (a Unix socket's). One IPv6 host holds a whole /64,
    so an address is no narrower than that."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None
    if address.version == 6 and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    bits = v4_bits if address.version == 4 else auth_limits.AUTH_PREFIX_V6
    return str(ipaddress.ip_network("%s/%d" % (address, bits), strict=False))
