"""Consumer offsets: where a consumer group's position lives — the broker's own table (the text ``commit_offset`` /
``query_offset``, RocketMQ consumers), ZooKeeper (MetaQ's layout) or a local file — and how an operator moves it
(``metaq-admin reset-offsets``; docs/python-client.md, docs/operating.md "Admin commands").

A feature package: every module of the feature is here, named by its role, and each role is a layer's
(``tests/test_layers.py`` FEATURE_ROLES, docs/architecture.md "Feature packages"). A module imports what its
layer may, and of this package only modules of its own role's layer or a lower one.

state (the store layer: files and in-memory state; no socket, gevent or clock)
    table.py     ``ConsumerOffsets`` (``MessageStore.consumer_offsets``): (group, topic, partition) -> offset and
                 commit time, its state file, the versions and changes a replication master sends
front-end (the server layer: a front-end's handlers)
    text.py      the text port's ``commit_offset`` and ``query_offset`` handlers
The client's side is in metaq/client/ (which imports the features and none imports it): ``client/offsets.py`` (the
consumer's offset stores: ZooKeeper, the broker's table, a local JSON file) and ``client/admin/offsets.py``
(``metaq-admin reset-offsets``).

Elsewhere, each with its protocol: the commands' declarations (``protocol/text.py``: MetaQ's core commands), the
RocketMQ offset codes (``server/remoting/dispatch.py``), the HTTP admin routes (``admin/http.py``), and
the replication stream's OFFSETS frame (``protocol/replication_offsets.py``: one frame type of that stream, its
header, checks and limits the stream's; the slave's copy of the table is replication's concern).
"""
