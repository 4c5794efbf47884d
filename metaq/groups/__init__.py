"""Per-group settings: what the broker allows each consumer group (its maximum of retries before a dead letter,
whether it may consume at all, whether it may consume in BROADCASTING mode, and the slave a slow RocketMQ pull is sent
to), as RocketMQ's subscription group table (docs/concepts.md "Per-group settings"). A group with no entry behaves as
every group did before.

A feature package: every module of the feature is here, named by its role, and each role is a layer's
(``tests/test_layers.py`` FEATURE_ROLES, docs/architecture.md "Feature packages").

codec (the protocol layer)
    wire.py      the ``group_settings <action> <group> <settings> <opaque>`` text command and its registration
logic (the protocol layer: pure decisions)
    policy.py    the one decision every front-end asks: may this group consume now, with which maximum of retries,
                 and which broker a slow pull is told to use (``decide``, ``require``, ``max_attempts``,
                 ``max_reconsume_times``, ``suggest_broker``)
    lag.py       a consumer group's position in a partition, of every protocol (committed offsets, POP, MQTT shared
                 groups and persistent sessions), and the one decision of its lag (``lag``, ``rows``: ``stats groups``)
state (the store layer)
    table.py     ``GroupTable`` (``MessageStore.groups``): the settings, their checks, ``<data_dir>/groups.json``
                 written atomically, a slave's ``replace`` (the table travels in the replication TOPICS frame)
service (the server layer: gevent)
    service.py   ``GroupAdmin``: list, show, set, delete; one change at a time, the fsync in a worker thread
front-end (the server layer)
    text.py      the text port's ``group_settings`` handler (the HTTP routes are with the other admin routes:
                 ``admin/http.py``)
``metaq-admin group-settings [list|show|set|delete]`` is the client's (``client/admin/groups.py``: the client
imports the features and none imports it).
"""
