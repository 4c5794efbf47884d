"""Request-reply (RocketMQ's RIP-16): a request is a message whose answer is its reply; the text protocol's
``request`` and ``reply``, the remoting port's SEND_REPLY_MESSAGE and PUSH_REPLY_MESSAGE_TO_CLIENT, and the
client's ``Producer.request`` and ``Consumer.subscribe(..., reply=True)`` (docs/messaging.md "Request-reply").

The ``request`` / ``reply`` events and their grammar are the text protocol's core declarations
(``protocol/events.py``, ``protocol/text.py``); the connection core's close hook and the remoting port's producer
registry (whose connections a reply is pushed to) stay with their owners.

A feature package: every module of the feature is here, named by its role, and each role is a layer's
(``tests/test_layers.py`` FEATURE_ROLES, docs/architecture.md "Feature packages"). A module imports what its
layer may, and of this package only modules of its own role's layer or a lower one.

codec (the protocol layer: bytes in, values out; no socket, log or clock)
    wire.py      the text ``request`` and ``reply`` commands: parsers, serializers, their registration
    records.py   what a request and a reply carry: their properties, read from and added to a MetaQ message
state (the store layer: files and in-memory state; no socket, gevent or clock)
    state.py     the pending-request table: text requests waiting for their replies, bounded, time passed in
service (the server layer: gevent)
    service.py   ReplyRouter: a reply from either protocol handed to the connection of the requester that waits
front-end (the server layer: a front-end's handlers)
    text.py      the text handlers of ``request`` and ``reply``
    remoting.py  the remoting port's SEND_REPLY_MESSAGE (324/325) and PUSH_REPLY_MESSAGE_TO_CLIENT (326)
The client's side (``Producer.request`` and the replier's handler of ``Consumer.subscribe(..., reply=True)``) is in
``client/reqreply.py`` (the client imports the features and none imports it).
"""
