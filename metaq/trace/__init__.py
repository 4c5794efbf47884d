"""Where is my message: one message's story on a broker — where it is stored, which groups' offsets are past it,
its per-message acknowledgement state, its retries and dead letters, and the RocketMQ clients' message-trace
records about it (docs/operating.md "Where is my message"); RocketMQ's trace topic ``RMQ_SYS_TRACE_TOPIC``.

A feature package: every module of the feature is here, named by its role, and each role is a layer's
(``tests/test_layers.py`` FEATURE_ROLES, docs/architecture.md "Feature packages").

codec (the protocol layer: bytes in, values out; no socket, log or clock)
    records.py   message ids as users give them (metaq ids, RocketMQ offset ids), the trace topic's name and its
                 records' layout (parse, and the encoders a client or a test writes them with)
    wire.py      the text ``trace`` command (parser, serializer, registration) and its reply's JSON body
service (the server layer)
    service.py   trace_message: the lookup, given only the store, the POP state, the remoting address, the broker id
                 and the read-permission decision; Tracer: those held for the front-ends
front-end (the server layer: a front-end's handlers)
    text.py      the text port's ``trace``
    http.py      ``GET /api/trace``
``metaq-admin trace`` is the client's (``client/admin/trace.py``: the client imports the features and none imports
it).
"""
