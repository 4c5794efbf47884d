"""A client id is the cluster's: MQTT sessions across the brokers of one ZooKeeper root (docs/mqtt.md "A client id
across the cluster", docs/architecture.md "MQTT cluster: client ids").

A feature package: every module of the feature is here, named by its role (``tests/test_layers.py``
FEATURE_ROLES).

state (the store layer's rules: no socket, gevent or clock)
    ids.py         ``home_of``: a client id's home broker (rendezvous hash over the members); ``HomeRegistry``: the
                   home's client id -> holding broker, bounded by ``mqtt.cluster_max_ids``
front-end (the server layer)
    calls.py       broker-to-broker calls over the replication port (PEER_CALL / PEER_REPLY, the replication
                   secret proved as a slave proves it), each bounded by ``MQTT_CLUSTER_CALL_TIMEOUT_S``
    handover.py    a session given up by one broker as JSON (its messages not acknowledged as their records) and
                   adopted by another (written to its own sessions' log)
service (the server layer)
    service.py     ``MqttCluster``: the members (from ZooKeeper), a CONNECT's registration with the id's home, the
                   home's serialisation per id and its calls to the holder, re-registration when the members change
"""
