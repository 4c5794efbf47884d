"""Filters: a consumer's tag expression, and the broker's filtered reads that skip records by their index unit's
tag hash without reading them (text ``get_tags``, RocketMQ ``TAG`` subscriptions; docs/messaging.md "Tag filtering");
SQL92 expressions on a message's properties (RocketMQ ``SQL92`` subscriptions; docs/messaging.md "SQL92 filters").

A feature package: every module of the feature is here, named by its role, and each role is a layer's
(``tests/test_layers.py`` FEATURE_ROLES, docs/architecture.md "Feature packages"). A module imports what its
layer may, and of this package only modules of its own role's layer or a lower one.

codec (the protocol layer: bytes in, values out; no socket, log or clock)
    wire.py      a get_tags' tags token, the get_tags reply body; the ``get_sql`` command's declaration (its
                 expression, the body, compiled by ``sql.py``)
logic (the protocol layer: pure decisions)
    sql.py       SQL92 expressions (RocketMQ's selector grammar, ``ExpressionType`` SQL92): parsed once into a
                 ``SqlFilter`` whose ``matches(properties)`` is evaluated per message, three-valued
state (the store layer: files and in-memory state; no socket, gevent or clock)
    reads.py     filtered reads (``MessageStore.read_tagged``): units skipped by their tag hash, wanted records read,
                 checked and their real tags compared, bounded by units, records and bytes; with a SQL92 filter
                 every record read and its properties evaluated
front-end (the server layer: a front-end's handlers)
    text.py      get_tags and get_sql: one request's filtered reads, its offset moved past what they passed over
                 (TagScan)
    remoting.py  the SQL92 subscriptions RocketMQ heartbeats register (``SqlSubscriptions``), the filter of a pull
                 that does not carry its own

What stays in the shared spine, and why: a record's tags and the index unit's tag hash (``protocol/tags.py``) are
part of the log's index format, written by every put path (and their C twins) and by recovery whether or not any
consumer filters; tag expressions (``TagFilter``, ``parse_tag_expression``) sit beside them, since the text parser
and the RocketMQ mapping read them and protocol/ imports no feature; the ``get_tags`` declaration sits beside
``get`` in ``protocol/text.py`` (get's grammar, expect and wait included, with a tags token), while ``get_sql``'s is
in ``wire.py`` (its expression compiles with ``sql.py``); the RocketMQ pull's filter
is applied by its handler (``server/remoting/dispatch.py``) over ``reads.py`` (tags) or over the records it reads
(SQL92), and CHECK_CLIENT_CONFIG is answered there too: both are RocketMQ request codes of the remoting registry.
"""
