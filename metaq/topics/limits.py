"""The topic table's named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

#: Most topics a broker holds (``limits.max_topics``): a put that would create one more through a pattern
#: such as the default ``*`` is refused (400 on the text port). Topics named exactly in the config are
#: counted but always accepted.
MAX_TOPICS = 1024

#: Most partitions a broker holds across all its topics (``limits.max_partitions``), refused as above. Each
#: costs an index file (from 4 KiB, growing with use), a map and a checkpoint entry.
MAX_TOTAL_PARTITIONS = 4096

#: Largest topic table file (``<data_dir>/topics.json``, topics/table.py) and its copy in a replication frame, with
#: the owners of the topics users' puts created (replication_topics.py: what bounds how many a frame carries).
MAX_TOPIC_TABLE_BYTES = 1 << 20
