"""MQTT across a cluster of brokers: the masters of one ZooKeeper root (docs/architecture.md "MQTT across the
cluster" and "MQTT cluster: client ids", docs/mqtt.md "A cluster" and "A client id across the cluster").

Two features over the replication port, each with its own frames: each master follows every other master's log for
what its own sessions subscribe and copies what matches into its inbox (``%MQTTIN%``, ROUTES / RECORDS), which its
MQTT delivery reads like any topic; and a client id is the cluster's: one live session per id, registered with the
id's home broker, which takes it from the broker holding it (PEER_CALL / PEER_REPLY). Both prove the replication
secret as peers (``serving.replication.handshake.peer_proof``), with the TLS a slave's link uses.

A feature package: every module of the feature is here, named by its role (``tests/test_layers.py``
FEATURE_ROLES).

state (the store layer's rules: no socket, gevent or clock)
    inbox.py       the copies of other brokers' messages in ``%MQTTIN%``, and the resume positions they record
    ids.py         ``home_of``: a client id's home broker (rendezvous hash over the members); ``HomeRegistry``: the
                   home's client id -> holding broker, bounded by ``mqtt.cluster_max_ids``
logic
    routes.py      a broker's filters, aggregated: what its subscriptions want of its peers (pure)
front-end (the server layer)
    calls.py       broker-to-broker calls over the replication port (PEER_CALL / PEER_REPLY), pipelined on one link
                   per peer (``MQTT_CLUSTER_CALLS_IN_FLIGHT``), each bounded by ``MQTT_CLUSTER_CALL_TIMEOUT_S``, and a
                   link's calls answered
    handover.py    a session given up by one broker as JSON (its messages not acknowledged as their records) and
                   adopted by another (written to its own sessions' log); the rest that reached the old broker for
                   it after (the takeover's end)
service (the server layer)
    members.py     ``Members``: the masters of the cluster as ZooKeeper names them, the one reader of them (a watch
                   wakes it), its listeners (the links and the client ids) woken when they change
    serve.py       ``PeerServer``: the one server of the other masters on the replication port, by their first frame:
                   a peer's follow (ROUTES in, RECORDS out) or its calls
    link.py        the follower's side of one peer: connect, prove, send ROUTES, copy each RECORDS frame
    peers.py       ``MqttCluster``: one link per other member, copies through the put path, retained messages
    registrations.py  ``Registrations``: the CONNECTs' registrations with one home, batched (``registers`` calls)
    service.py     ``ClientIds``: a CONNECT's registration with the id's home, the home's serialisation per id and
                   its calls to the holder, the takeover's end, the leases of the homes, re-registration when the
                   members change
"""
