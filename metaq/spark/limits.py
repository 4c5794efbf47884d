"""The Spark connector's named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

#: Puts one Spark sink task keeps in flight (its ``maxInFlight`` option: 1 .. this).
MAX_SINK_IN_FLIGHT = 4096

#: Rows one Arrow batch of the Spark source may hold (its ``maxRecordsPerBatch`` option: 1 .. this): a batch is
#: built in memory whole, values and all, before Spark takes it.
MAX_ARROW_BATCH_ROWS = 100_000

#: Spark tasks one micro-batch of the streaming source is cut into at most (its ``minPartitions`` option).
MAX_STREAM_TASKS = 10_000
