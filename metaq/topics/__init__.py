"""Topics and their table: the topics an operator creates, alters and deletes (``metaq-admin topics``, the ``topic``
text command, the HTTP admin routes), their settings (partitions, perm, ordered, per-topic retention, priorities),
and which topic names are the broker's own (docs/concepts.md "Topics: the table, create, alter, delete").

A feature package: every module of the feature is here, named by its role, and each role is a layer's
(``tests/test_layers.py`` FEATURE_ROLES, docs/architecture.md "Feature packages"). A module imports what its
layer may, and of this package only modules of its own role's layer or a lower one.

codec (the protocol layer: bytes in, values out; no socket, log or clock)
    wire.py      the ``topic <action> <name> <settings> <opaque>`` text command: parser, serializer, its
                 registration in ``protocol.commands`` (``metaq.textcommands`` lists it, so the registry is complete)
logic (the protocol layer: pure decisions)
    names.py     which topics are the broker's own (``INTERNAL``, ``is_internal``, ``level_owner``): what listings
                 hide unless asked
state (the store layer: files and in-memory state; no socket, gevent or clock)
    table.py     the table file (``<data_dir>/topics.json``), a topic's settings and their checks, the names no
                 operator may change, which partition count wins (``TopicCatalog``)
    state.py     ``TopicOps`` (``MessageStore.topics``): create, alter, delete, list applied to the store's
                 partitions; ``finish_open`` completes a change a crash interrupted; a slave's ``replace_table``
    retention.py per-topic retention: a topic's first offset moved (the shared commit log stays)
service (the server layer: gevent)
    service.py   ``TopicAdmin``: the table's protocol-neutral service, one change at a time, blocking steps in a
                 worker thread, the registry and the replication master told after each change
front-end (the server layer: a front-end's handlers)
    text.py      the text port's ``topic`` handler (the HTTP routes are with the other admin routes:
                 ``admin/http.py``)
``metaq-admin topics [list|create|alter|delete]`` is the client's (``client/admin/topics.py``: the client imports
the features and none imports it).

The store's index of partitions (``store/partitions.py``) is the store's: the table says which partitions a topic
has, the store holds them. The slave's copy of the table travels in the replication stream's TOPICS frame
(``protocol/replication.py``).
"""
