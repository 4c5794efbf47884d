"""Transactions' named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

#: RocketMQ half messages waiting for their END_TRANSACTION or check-back at once (``remoting.max_half_messages``);
#: a half message past it is refused (TRANSACTION_FAILED). They also count as open transactions
#: (``transactions.max_open``), so the default leaves half of those to the text protocol's transactions.
MAX_HALF_MESSAGES = 5_000

#: Half messages one check-back round acts on (checks sent and rollbacks after the last check together),
#: oldest first; the others due wait for the next round (``metaq.transactions.policy``).
MAX_CHECKS_PER_ROUND = 1_000

#: Longest ``CHECK_IMMUNITY_TIME_IN_SECONDS`` a half message may ask for before its first check-back (a day).
MAX_CHECK_IMMUNITY_S = 86_400

#: Transactions open at once on the broker (active and prepared, local and XA); a BEGIN past it fails
#: with XAER_RMERR (``transactions.max_open``).
MAX_OPEN_TRANSACTIONS = 10_000

#: Message bytes all open transactions may hold together in the broker's memory until they end; a
#: transactional put past it fails with XAER_RMERR (``transactions.max_held_bytes``).
MAX_TX_HELD_BYTES = 1 << 30
#: Transaction journal records (``%TX%``) a slave's manager learns in one call of the log follower
#: (``JournalFollow.learn``, on the event loop); the rest wait for the follower's next step, other greenlets served
#: between.
TX_LEARN_BATCH = 1_000
#: ... and at most this many bytes of their log records (one record at least: a PUT may hold a message of up to
#: ``MAX_BODY_BYTES``).
TX_LEARN_BATCH_BYTES = 8 << 20
#: Live transaction branches (and heuristic outcomes) a journal snapshot writes in one turn of the event loop
#: (``TransactionManager.maintain``); it yields between two such steps, so a broker with many branches open keeps
#: serving while it writes one.
TX_SNAPSHOT_STEP = 1_000
