"""Consumer groups' named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

#: Consumer groups the group settings table (``<data_dir>/groups.json``, groups/table.py) holds at most: a setting
#: for one more group is refused (its entries and the topic table travel in one replication frame, bounded by
#: MAX_TOPIC_TABLE_BYTES).
MAX_GROUP_SETTINGS = 1024
#: Largest ``max_retries`` a group may be given (RocketMQ's retryMaxTimes; its delay levels end at 18 retries, later
#: retries wait the last level's 2 hours).
MAX_GROUP_RETRIES = 1000

#: Rows one ``stats groups`` answer holds (a consumer group's position in a partition, of any protocol: committed
#: offsets, POP groups, MQTT shared groups and persistent sessions); past it the most behind are kept and a last
#: ``left_out <n>`` line says how many were not sent (``metaq-admin groups`` and ``metaq-spark-report`` say so).
MAX_GROUP_LAG_ROWS = 10_000
#: Bytes of the rows one ``stats groups`` answer holds (an MQTT shared group's name holds its filter, up to
#: MQTT_MAX_TOPIC_BYTES): past them the rest is left out as past MAX_GROUP_LAG_ROWS, the most behind kept.
MAX_GROUP_LAG_BYTES = 2 << 20
