"""MQTT across a cluster of brokers (docs/architecture.md "MQTT across the cluster", docs/mqtt.md "A cluster"):
each master follows every other master's log for what its own sessions subscribe, over the replication port, and
copies what matches into its inbox (``%MQTTIN%``), which its MQTT delivery reads like any topic.

``routes`` (a broker's filters, aggregated), ``inbox`` (the copies and their resume positions), ``serve`` (the
followed broker's side), ``link`` (the follower's side of one peer), ``peers`` (membership, links, retained).
"""
