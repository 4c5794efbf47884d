"""The key index: a message's keys (``KEYS`` words, ``UNIQ_KEY``) → its commit-log positions, with time bounds;
the text ``lookup`` and RocketMQ's QUERY_MESSAGE answered from it (docs/messaging.md "Key index", docs/messaging.md).

A feature package: every module of the feature is here, named by its role, and each role is a layer's
(``tests/test_layers.py`` FEATURE_ROLES, docs/architecture.md "Feature packages"). A module imports what its
layer may, and of this package only modules of its own role's layer or a lower one.

codec (the protocol layer: bytes in, values out; no socket, log or clock)
    wire.py      the text ``lookup`` command (parser, serializer, registration) and its reply's body: encoded by
                 the broker, decoded by the client
state (the store layer: files and in-memory state; no socket, gevent or clock)
    files.py     one key index file (RocketMQ's IndexFile, our layout), and the keys a record is indexed under
    index.py     KeyIndex: the files, fed as a subscriber of the store's log follower (``store/follower.py``),
                 checkpoint, rebuild, cut and retention; KeySearch: one page of a lookup, one map read a step
front-end (the server layer: a front-end's handlers)
    text.py      the text port's ``lookup``
    remoting.py  RocketMQ's QUERY_MESSAGE (12): a key's messages, and a message viewed by its unique id
The client's ``lookup`` (every page of a key's messages on one broker, newest first) is in ``client/keys.py`` (the
client imports the features and none imports it).

The ``lookup`` command's declaration (tokens, parser, serializer) stays with the core commands in
``protocol/text.py`` and its event in ``protocol/events.py``.
"""
