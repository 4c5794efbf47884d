"""Admin operations' named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

# -- admin operations (docs/operating.md "Admin commands"; admin/service.py) ----------------
#: Dead letters one ``dlq_list`` answers at most (``metaq-admin dlq list --max``); ``"more": true`` says there are more.
MAX_DLQ_LIST = 1_000
#: Dead letters one ``dlq_list`` or ``dlq_resend`` sees per partition of the dead-letter topic: the newest this
#: many (older ones are reported by ``more``). Bounds what one admin request holds; the group's resent journal is
#: read whole, in ``DLQ_SCAN_STEP`` steps, keeping only the positions of those dead letters.
MAX_DLQ_SCAN = 10_000
#: Records a dead-letter scan reads and decodes before it lets the broker's other greenlets run (a scan of
#: ``MAX_DLQ_SCAN`` in one go would hold the loop far past a turn; tests/hostile/test_i19_admin_attacks.py).
DLQ_SCAN_STEP = 256
#: Bytes of a dead letter's body a listing shows (the rest is counted in ``body_bytes``).
DLQ_BODY_PREVIEW_BYTES = 64
#: Text connections remembered as members of a group (they committed or queried its offsets and are still open):
#: past it the oldest is forgotten, so clients inventing group names cannot grow the table.
MAX_TEXT_GROUP_MEMBERS = 10_000
