"""Where-is-my-message's (trace) named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

# -- where is my message (docs/operating.md "Where is my message"; trace/service.py) ----------------
#: Messages one trace answers at most (``metaq-admin trace --max``; a key many messages carry: the newest this many,
#: ``"more": true`` saying there are more). A request asking for more is refused.
TRACE_MAX_RESULTS = 20
#: Records of the consumer groups' retry and dead-letter topics one trace reads per message (from the message's
#: store time on) looking for its copies; past it the answer says ``"copies_complete": false``.
TRACE_MAX_COPY_SCAN = 10_000
#: Records of a partition a trace by metaq id reads from the first one stored in the id's millisecond.
TRACE_ID_SCAN = 4096
#: RocketMQ message-trace records (``RMQ_SYS_TRACE_TOPIC``) one trace shows per message; past it
#: ``"traces_complete": false``.
TRACE_MAX_RECORDS = 100
