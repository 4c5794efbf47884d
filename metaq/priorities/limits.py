"""Consumer priorities' named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

# -- consumer priorities (docs/messaging.md "Priorities"; priorities/wire.py) ----------------
#: Most priority levels a topic may have (``metaq-admin topics create --priorities L``: 2..this). Each level past
#: 0 is a partition of its own behind every partition of the topic (an index file, a map), and a ``get_prio``
#: carries one offset per level.
MAX_PRIORITY_LEVELS = 8
#: A priority topic's default ``priority_max_wait_ms``: a message at the head of its level that has waited longer
#: competes by age with the other levels (the starvation bound, docs/messaging.md "Priorities").
DEFAULT_PRIORITY_MAX_WAIT_MS = 10_000
#: The largest ``priority_max_wait_ms`` a topic may set (one day); the smallest is 1.
MAX_PRIORITY_MAX_WAIT_MS = 86_400_000
