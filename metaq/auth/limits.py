"""Authentication's, permissions' and quotas' named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

# -- security (docs/security.md) ------------------------------------------------
#: Largest users-and-permissions file (``security.acl_file``) the broker reads; a larger one is refused.
MAX_ACL_FILE_BYTES = 1024 * 1024

#: Most users (and, apart, roles) one permissions file may define.
MAX_ACL_USERS = 10_000

#: Most topic or group rules one user or role may list, and entries in one address allow-list.
MAX_ACL_RULES = 1024

#: Names (topics, groups) whose permission one user's table remembers; past it the oldest answer is forgotten.
MAX_ACL_DECISIONS_CACHED = 4096

#: Seconds a server nonce of the text ``auth`` handshake stays valid (it is used once, in any case).
AUTH_NONCE_TTL_S = 30.0

#: Failed authentications one address may make in ``AUTH_FAILURE_WINDOW_S`` before each further one is
#: answered only after a delay (``AUTH_FAILURE_DELAY_S``): a password guesser is slowed, a typo is not.
AUTH_FAILURES_BEFORE_DELAY = 5
AUTH_FAILURE_WINDOW_S = 60.0
AUTH_FAILURE_DELAY_S = 1.0

#: Failed authentications one address prefix (an IPv4 /24, an IPv6 /64: ``AUTH_PREFIX_V4``, ``AUTH_PREFIX_V6``)
#: may make in ``AUTH_FAILURE_WINDOW_S`` before each further one from it is delayed: a guesser rotating its
#: source address within its network is slowed like one that keeps it.
AUTH_PREFIX_FAILURES_BEFORE_DELAY = 20
AUTH_PREFIX_V4 = 24
AUTH_PREFIX_V6 = 64

#: Addresses and prefixes whose recent failures are remembered (the oldest is forgotten past it).
MAX_AUTH_FAILURE_ADDRESSES = 10_000

#: Fewest bytes of a user's secret in the permissions file: shorter is refused when the file is read (a
#: guesser's work doubles with each random bit; RocketMQ refuses a secretKey of 6 characters or fewer).
MIN_USER_SECRET_BYTES = 12

#: Distinct topics and groups one RocketMQ request may need permissions for (a heartbeat names its groups and
#: their subscriptions; real clients name a handful): past it the request is refused (INVALID_PARAMETER).
MAX_ACL_RESOURCES_PER_REQUEST = 1024

# -- quotas per user (metaq/auth/quotas.py; docs/security.md "Quotas") -------------------------------------------
#: A user's default quota of a broker-wide limit, as a share of it (when the permissions file sets none): no single
#: user can hold more than this share of any limit a quota divides.
QUOTA_DEFAULT_SHARE = 0.5
