"""Idempotent producers: ``put_idem`` (a put stored once per producer id and sequence), and RocketMQ sends carrying
``METAQ_PID`` / ``METAQ_SEQ`` (docs/spark.md "The idempotent producer").

A feature package: every module of the feature is here, named by its role, and each role is a layer's
(``tests/test_layers.py`` FEATURE_ROLES, docs/architecture.md "Feature packages"). A module imports what its
layer may, and of this package only modules of its own role's layer or a lower one.

codec (the protocol layer: bytes in, values out; no socket, log or clock)
    records.py   an idempotent put's identity (pid, seq) in the record: the reserved properties, how the stored
                 attribute carries them, read back
    wire.py      the put_idem text command: its event, parsers, serializer, its registration in
                 ``protocol.commands`` (``metaq.textcommands`` lists it, so the registry is complete)
    burst.py     a receive buffer's run of put_idem frames checked and given their identity (C twin:
                 ``native/idemburst.c``)
logic (the protocol layer: pure decisions, the time passed in)
    window.py    ProducerTable: each producer-partition's window (duplicate / store / too old), its bounds,
                 snapshots' bytes
state (the store layer: files and in-memory state; no socket, gevent or clock)
    state.py     Idempotence: the one owner of producer state: the put's decision and append; a subscriber of
                 the log follower (``store/follower.py``) for what the log teaches (a slave's replicated
                 records, the replay at open, a rebuild, cuts); snapshot files
front-end (the server layer: a front-end's handlers)
    text.py      the text handler of put_idem
    fasttext.py  the text port's put_idem burst path: pipelined put_idem frames stored and answered in one pass
The producer's side (a partition's sequence numbers, the next one and the oldest unanswered, those a batch that
failed for good gives again, and the broker's refusals that free them) is the client's: ``client/idempotence.py``
(the client imports the features and none imports it).

The RocketMQ send with an identity is served with the port's other sends (``server/remoting/send.py``); the put path
every front-end shares calls the store's ``put_idempotent`` (``serving/putpath.py``).
"""
