"""Transactions: local transactions (the text ``transaction`` command), XA branches (two-phase commit, recovery,
heuristic decisions), RocketMQ half messages and their check-back (docs/text-protocol.md "transaction",
docs/python-client.md "Transactions", docs/rocketmq.md "Transactional messages").

A feature package: every module of the feature is here, named by its role, and each role is a layer's
(``tests/test_layers.py`` FEATURE_ROLES, docs/architecture.md "Feature packages"). A module imports what its
layer may, and of this package only modules of its own role's layer or a lower one.

codec (the protocol layer: bytes in, values out; no socket, log or clock)
    wire.py      transaction ids (``TX:…``, ``XID:…``) and XA codes as they travel in the text protocol; the
                 ``XAException`` error body. Broker and client share it
    records.py   the journal's records (PUT, PREPARE, COMMIT, DONE, ROLLBACK, HEURISTIC, FORGET, HALF, snapshots):
                 their binary codec, the branch they describe, and their replay
logic (the protocol layer: pure decisions, the time passed in)
    policy.py    the check-back's rules: which half messages a round checks, which it gives up
state (the store layer: files and in-memory state; no socket, gevent or clock)
    follow.py    the journal in the log: its records as ``%TX%`` messages (TxLog), their replay with snapshots
                 (LogReplay), TX_JOURNAL (what store/journals.py's JournalFollow follows: a slave learns, a cut replays)
    journal.py   an older broker's journal files, read once to migrate them into the log
    state.py     TransactionManager: the branches' state machine, half messages, recovery, commit into the store,
                 a slave's replica state and the take-over at a promotion
    config.py    the ``transactions:`` settings and their defaults (TxConfig)
service (the server layer: gevent)
    service.py   TxService: the protocol-neutral service (the log's flush and a sync slave's confirmation waited
                 for, commits, timeouts, snapshots, a closed connection's local transactions rolled back, the role)
front-end (the server layer: a front-end's handlers)
    text.py      the text ``transaction`` command and transactional puts
    remoting.py  the RocketMQ check-back rounds (CHECK_TRANSACTION_STATE to a producer of the group)
The client's side is in metaq/client/ (which imports the features and none imports it): ``client/transactions.py``
(the producer's local transactions, Xid, XaError, the branch machinery the XA resource shares) and ``client/xa.py``
(XAResource: an XA resource manager with the DB-API two-phase-commit interface).

RocketMQ's half-message sends and END_TRANSACTION stay with the remoting port's other sends
(``metaq.server.remoting.send``); the two-phase-commit coordinator over any DB-API resources stays with the
client's (``metaq.client.coordinator``).
"""
