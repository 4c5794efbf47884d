"""Quotas per user: how much of each broker-wide limit one user may hold, and the one decision made from them.

Pure logic (no file, no clock). A broker-wide limit (the idempotent producers' table, the open transactions) is
shared by every user; a quota is one user's part of it, so that one user cannot take what the others need
(Kafka's and Pulsar's tenant quotas). Each quota is declared once here (``QUOTAS``: its name, the broker-wide
limit it divides, what it counts). Its value for a user is found in the permissions file (docs/security.md
"Quotas"), first match wins:

1. the user's own ``quotas:``;
2. its roles' ``quotas:``, in the order the user lists them;
3. the file's top-level ``quotas:`` (the default for everyone);
4. the built-in default: ``limits.QUOTA_DEFAULT_SHARE`` of the broker-wide limit (half), so that no single
   user can take more than that share of it.

With authentication off there are no users: every client is one tenant, bounded by the broker-wide limit only
(``limit(None, name)``). ``Quotas.check(user, name, current)`` is the decision every counted resource asks:
it raises ``QuotaExceeded`` (naming the quota, its value and the user) when one more would pass the quota.
The broker gives it (``Guard.quotas``) to what counts: the producers' table (``limit``: its eviction within a
user's windows), the consumer offsets, the topics a put creates, the requests waiting, the logins, the timed
messages pending, the topic names of RocketMQ 5 producers' streams, the
RocketMQ 5 consumer clients whose Settings are kept. The transaction service asks the
``transactions`` quota before a user begins one more (open and prepared transactions, XA branches and half messages
together: ``TxService.check_quota``).

**Rates** (``RATES``): bytes per second a user may send to the broker (``produce_bytes_per_s``) and be sent as
records (``fetch_bytes_per_s``), over any port (``Guard.pace`` is where every port charges them). A client over
its rate is delayed, not refused, as Kafka throttles: ``Quotas.pace(user, kind, nbytes, now)`` charges the bytes
to the user's token bucket (one second of its rate as a burst) and says how long the user's next bytes must wait,
so that the user's bytes over any long span stay at its rate, however many connections it uses. No default: a
rate is unbounded until the file sets one.
"""

from metaq import limits
from metaq.auth import limits as auth_limits
from metaq.idempotence import limits as idempotence_limits
from metaq.offsets import limits as offsets_limits
from metaq.reqreply import limits as reqreply_limits
from metaq.rmq5 import limits as rmq5_limits
from metaq.timers import limits as timers_limits
from metaq.topics import limits as topics_limits
from metaq.transactions import limits as transactions_limits
from metaq.errors import ConfigError, QuotaExceeded

__all__ = ["Quota", "QUOTAS", "RATES", "RATE_OF", "Quotas", "parse_quotas", "default_quota", "quota_error"]


class Quota:
    """One quota's declaration: its ``name`` (the key in the permissions file), the broker-wide limit it divides
    (``limit``: its built-in value, ``limit_name``: where it is set) and what it counts (``counts``)."""

    __slots__ = ("name", "limit", "limit_name", "counts")

    def __init__(self, name, limit, limit_name, counts):
        self.name, self.limit, self.limit_name, self.counts = name, limit, limit_name, counts


QUOTAS = {q.name: q for q in (
    Quota("idempotent_producers", idempotence_limits.MAX_IDEMPOTENT_PRODUCERS, "limits.MAX_IDEMPOTENT_PRODUCERS",
          "idempotent producer windows (one per producer id and partition) the broker keeps for the user; past "
          "it the user's own least recently written window is evicted"),
    Quota("transactions", transactions_limits.MAX_OPEN_TRANSACTIONS, "transactions.max_open",
          "open and prepared transactions of the user (local, XA branches, RocketMQ half messages)"),
    Quota("topics", topics_limits.MAX_TOPICS, "limits.max_topics",
          "topics the user's puts created (a put that would create one more is refused)"),
    Quota("partitions", topics_limits.MAX_TOTAL_PARTITIONS, "limits.max_partitions",
          "partitions of the topics the user's puts created"),
    Quota("consumer_offsets", offsets_limits.MAX_CONSUMER_OFFSETS, "limits.MAX_CONSUMER_OFFSETS",
          "committed consumer offsets (group, topic, partition) the broker keeps that the user's commits made"),
    Quota("request_waiters", reqreply_limits.MAX_PENDING_REQUESTS, "limits.max_pending_requests",
          "text requests of the user waiting for their replies (request-reply)"),
    Quota("timers", timers_limits.MAX_PENDING_TIMERS, "limits.max_pending_timers",
          "timed messages of the user pending (put_at, RocketMQ 5's timer properties: scheduled, not yet delivered "
          "or cancelled)"),
    Quota("connections", limits.max_connections_for(1024), "limits.max_connections",
          "connections logged in as the user, on every port"),
    Quota("parked_gets", limits.MAX_PARKED_GETS, "limits.max_parked_gets",
          "long polls of the user parked at once waiting for a message (RocketMQ 5 receives and pulls)"),
    Quota("producer_topics", rmq5_limits.GRPC_MAX_PRODUCER_TOPICS, "limits.GRPC_MAX_PRODUCER_TOPICS",
          "topic names the Settings of the user's RocketMQ 5 producers name, over all their open Telemetry streams"),
    Quota("consumer_clients", rmq5_limits.GRPC_MAX_CONSUMER_CLIENTS, "limits.GRPC_MAX_CONSUMER_CLIENTS",
          "RocketMQ 5 consumer clients (client ids) of the user whose Telemetry Settings the gRPC port keeps; a new "
          "one past it is refused unless the user's own client heard from longest ago is idle"),
)}


#: The rates a user may be given (``quotas:`` keys of the permissions file, bytes per second), and what they count.
RATES = {
    "produce_bytes_per_s": "bytes the user's connections send to the broker (its puts and other requests)",
    "fetch_bytes_per_s": "bytes of the records sent to the user, over any port (gets, pulls, receives, deliveries)",
}
#: The kind of traffic each rate paces (``Quotas.pace``).
RATE_OF = {"produce": "produce_bytes_per_s", "fetch": "fetch_bytes_per_s"}


def default_quota(name, broker_limit=None):
    """The built-in default of quota ``name``: ``limits.QUOTA_DEFAULT_SHARE`` of its broker-wide limit (the
    configured one when given), at least 1."""
    limit = QUOTAS[name].limit if broker_limit is None else broker_limit
    return max(1, int(limit * auth_limits.QUOTA_DEFAULT_SHARE))


def parse_quotas(mapping, where):
    """A ``quotas:`` mapping of the permissions file -> ``{name: int}``; ConfigError naming the bad entry."""
    if mapping is None:
        return {}
    if not isinstance(mapping, dict):
        raise ConfigError("%s must map quota names to numbers (known: %s), got %r"
                          % (where, ", ".join(sorted(QUOTAS)), mapping))
    out = {}
    for name, value in mapping.items():
        if name not in QUOTAS and name not in RATES:
            raise ConfigError("%s: %r is not a quota (known: %s)" % (where, name,
                                                                    ", ".join(sorted(QUOTAS) + sorted(RATES))))
        if type(value) is not int or value < (1 if name in RATES else 0):
            raise ConfigError("%s.%s must be a whole number >= %d, got %r" % (where, name, 1 if name in RATES else 0,
                                                                               value))
        out[name] = value
    return out


class Quotas:
    """The quota decision over the current permissions file (see the module docstring).

    ``acl()`` gives the parsed file now (None: authentication off), so a reload applies at once;
    ``broker_limits`` maps a quota's name to its configured broker-wide limit where the configuration sets it
    (the others are ``QUOTAS``' built-in values)."""

    def __init__(self, acl, broker_limits=None):
        self._acl = acl
        self._broker = {name: q.limit for name, q in QUOTAS.items()}
        self._broker.update(broker_limits or {})
        self._buckets = {}  # (user, kind) -> [tokens, last time]: the rates' token buckets

    def broker_limit(self, name):
        """The broker-wide limit quota ``name`` divides."""
        return self._broker[name]

    def limit(self, user, name):
        """User ``user``'s quota ``name`` (a user name, or None: no user, authentication off: the broker-wide
        limit). An unknown user name (removed from the file since) gets the file's default."""
        acl = self._acl()
        if acl is None or user is None:
            return self._broker[name]
        found = acl.quota(user, name)
        return default_quota(name, self._broker[name]) if found is None else found

    def check(self, user, name, current, more=1):
        """Raise ``QuotaExceeded`` when ``user``, holding ``current`` of quota ``name``, may not take ``more``. No
        user (authentication off): nothing to check here, the broker-wide limit's owner checks it."""
        if user is None or self._acl() is None:
            return
        limit = self.limit(user, name)
        if current + more > limit:
            raise QuotaExceeded(name, user, limit, quota_error(name, user, limit))

    def rate(self, user, name):
        """User ``user``'s rate ``name`` (bytes per second), or None: unbounded."""
        acl = self._acl()
        return None if acl is None or user is None else acl.quota(user, name)

    def pace(self, user, kind, nbytes, now):
        """Charge ``nbytes`` of ``kind`` (``"produce"``, ``"fetch"``) to ``user`` at ``now`` (seconds, monotonic);
        the seconds the connection must wait before it goes on (0: within its rate)."""
        rate = self.rate(user, RATE_OF[kind])
        if rate is None:
            return 0.0
        key = (user, kind)
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= 2 * auth_limits.MAX_ACL_USERS:  # users removed from the file since
                self._buckets.clear()
            bucket = self._buckets[key] = [float(rate), now]
        tokens = min(float(rate), bucket[0] + (now - bucket[1]) * rate) - nbytes
        bucket[0], bucket[1] = tokens, now
        return -tokens / rate if tokens < 0 else 0.0

    def table(self, users, name):
        """``{user: limit}`` of quota ``name`` for ``users`` (stats)."""
        return {u: self.limit(u, name) for u in users}


def quota_error(name, user, limit):
    """The one wording of a refusal past a quota."""
    return ("quota %s of user %s is %d: %s (set it under quotas: in the permissions file)"
            % (name, user if user is not None else "(none)", limit, QUOTAS[name].counts))
