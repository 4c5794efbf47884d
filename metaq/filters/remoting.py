"""The SQL92 subscriptions RocketMQ remoting heartbeats register: a pull without its subscription uses them.

A push consumer sends its subscriptions in each HEART_BEAT and, by default, not in its pulls (the pull's
``subscription`` flag is off): as RocketMQ's ConsumerFilterManager, the broker keeps each (group, topic)'s SQL92
expression, compiled once when it first arrives or changes, and a pull of that group and topic is filtered by it.
An expression that does not compile is kept as its error, so the pull answers FILTER_DATA_NOT_EXIST naming the
position (RocketMQ's heartbeat succeeds and the pull fails the same way). A TAG subscription of the same group
and topic replaces it. At most ``max_entries`` (group, topic) pairs are kept: when full, the pairs of groups
without a live member (``live(group)``) are dropped first, and a heartbeat that would still add one is refused;
a heartbeat carrying more than ``limits.MAX_HEARTBEAT_SQL_SUBSCRIPTIONS`` is refused whole (``check``), so one
heartbeat compiles a bounded number of expressions on the loop (compiled ones are shared: ``sql.compiled``).
"""

from metaq.filters import limits as filters_limits
from metaq.errors import BadFilterExpression, ClientError
from metaq.filters.sql import compiled

#: A heartbeat subscription's ``expressionType`` naming a SQL92 filter.
EXPRESSION_SQL92 = "SQL92"


class SqlSubscriptions:
    """(consumer group, topic) -> the SQL92 filter of its latest heartbeat (a ``SqlFilter``, or the compile
    error's text)."""

    def __init__(self, live, max_entries=filters_limits.MAX_SQL_SUBSCRIPTIONS):
        self._live = live
        self.max_entries = max_entries
        self._subs = {}  # (group, topic) -> (expression, SqlFilter or error text)

    @staticmethod
    def check(consumers, most=filters_limits.MAX_HEARTBEAT_SQL_SUBSCRIPTIONS):
        """ClientError when a heartbeat's ``ConsumerData``s carry more than ``most`` SQL92 subscriptions: checked
        before anything of the heartbeat is recorded."""
        n = sum(1 for c in consumers for s in c.subscriptions
                if (s.expression_type or "").upper() == EXPRESSION_SQL92)
        if n > most:
            raise ClientError("a heartbeat may carry at most %d SQL92 subscriptions, this one carries %d" % (most, n))

    def heartbeat(self, consumers):
        """Record the SQL92 subscriptions of a heartbeat's ``ConsumerData``s; ClientError (nothing of the
        heartbeat after that pair recorded) when a new pair would pass ``max_entries``."""
        for c in consumers:
            for s in c.subscriptions:
                key = (c.group_name, s.topic)
                if (s.expression_type or "").upper() != EXPRESSION_SQL92:
                    self._subs.pop(key, None)
                    continue
                old = self._subs.get(key)
                if old is not None and old[0] == s.sub_string:
                    continue
                if old is None and len(self._subs) >= self.max_entries:
                    self._prune()
                    if len(self._subs) >= self.max_entries:
                        raise ClientError("too many SQL92 subscriptions registered: the limit is %d (group, topic) "
                                          "pairs" % self.max_entries)
                try:
                    filt = compiled(s.sub_string)
                except BadFilterExpression as exc:
                    filt = str(exc)
                self._subs[key] = (s.sub_string, filt)

    def get(self, group, topic):
        """The ``SqlFilter`` of ``group``'s heartbeat for ``topic``, its compile error (str), or None."""
        entry = self._subs.get((group, topic))
        return entry[1] if entry is not None else None

    def __len__(self):
        return len(self._subs)

    def _prune(self):
        for key in [k for k in self._subs if not self._live(k[0])]:
            del self._subs[key]
