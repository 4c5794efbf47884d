"""Filtered reads' named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

# -- tag filtering in the broker (docs/messaging.md "Tag filtering") ---------------------------------------------------
#: Index units one filtered read (a remoting pull with a TAG subscription, a text ``get_tags``) looks at past its
#: offset, matching or not (256 KiB of index). A read that meets no wanted record within them answers with the
#: offset after them (PULL_RETRY_IMMEDIATELY / an empty ``get_tags`` reply), so a long run of unwanted records
#: costs a bounded scan per request and never looks like the partition's end.
MAX_FILTER_SCAN_UNITS = 16384
#: Longest tag expression (UTF-8 bytes) a filtered read accepts; it fits a text line with the longest names.
MAX_TAG_EXPRESSION_BYTES = 1024
#: Most distinct tags one expression may name.
MAX_FILTER_TAGS = 64
#: Longest SQL92 filter expression (characters) the broker compiles (filters/sql.py): it fits a text line, and
#: compiling one costs a bounded time.
MAX_SQL_FILTER_CHARS = 4096
#: Deepest nesting of a SQL92 filter: parentheses, prefix operators (NOT, + and -) and chained comparisons
#: (``a = b = c``) each count one level; the parser and the compiled predicate recurse once per level.
MAX_SQL_FILTER_DEPTH = 32
#: Body bytes a text ``get_sql`` may announce for its expression: the longest expression in 4-byte characters.
MAX_SQL_FILTER_BYTES = 4 * MAX_SQL_FILTER_CHARS
#: Most string literals of one SQL92 ``IN (...)`` list.
MAX_SQL_FILTER_IN_ITEMS = 256
#: Records a SQL92-filtered read (a RocketMQ pull, a text ``get_sql``) reads and evaluates at most per request
#: (each one read and its properties decoded: no index hash can skip it, as a tag's can); a read that finds no
#: match within them answers the offset after them (PULL_RETRY_IMMEDIATELY / an empty ``get_sql`` reply), as a
#: tag filter's scan does.
MAX_SQL_FILTER_SCAN = 1024
#: (consumer group, topic) pairs whose SQL92 subscription the remoting port keeps from heartbeats
#: (filters/remoting.py); when full, pairs of groups without a live member go first, then a heartbeat adding
#: one more is refused.
MAX_SQL_SUBSCRIPTIONS = 10_000
#: SQL92 subscriptions one RocketMQ heartbeat may carry (over all its groups; real clients carry a handful): each
#: new or changed one is compiled on the loop (up to a few ms for the longest), so more is INVALID_PARAMETER and
#: nothing of the heartbeat recorded.
MAX_HEARTBEAT_SQL_SUBSCRIPTIONS = 16
#: Compiled SQL92 expressions the broker keeps by their text (filters/sql.py ``compiled``; RocketMQ's parser
#: keeps 100): a pull consumer's every pull, and a text consumer's every get_sql, carry the same expression.
SQL_FILTER_CACHE = 256
#: Parsed tag expressions the broker keeps by their text (filters/wire.py ``parse_tag_expression``): a consumer's
#: every receive or pull carries the same expression.
TAG_FILTER_CACHE = 256
