"""MQTT across a cluster of brokers: the masters of one ZooKeeper root (docs/architecture.md "MQTT across the
cluster" and "MQTT cluster: client ids", docs/mqtt.md "A cluster" and "A client id across the cluster").

Two features over the replication port, each with its own frames: each master follows every other master's log for
what its own sessions subscribe and copies what matches into its inbox (``%MQTTIN%``, ROUTES / RECORDS), which its
MQTT delivery reads like any topic; and a client id is the cluster's: one live session per id, registered with the
id's home broker, which takes it from the broker holding it (PEER_CALL / PEER_REPLY). Both prove the replication
secret as peers (``serving.replication.handshake.peer_proof``), with the TLS a slave's link uses.

A feature package: every module of the feature is here, named by its role (``tests/test_layers.py``
FEATURE_ROLES), in a sub-package per concern as EMQX splits its router, its broker dispatch and its connection
manager (``FEATURE_PARTS``): following and routes, shared groups, client ids and takeover; what they share (the
members, the one server of the peers, what a peer may ask) at the top.

shared by the concerns
    members.py     ``Members``: the masters of the cluster as ZooKeeper names them, the one reader of them (a watch
                   wakes it), its listeners (the links and the client ids) woken when they change (service)
    asks.py        ``Asks``: what a member may ask of this broker: who it is, its calls' ids (state)
    serve.py       ``PeerServer``: the one server of the other masters on the replication port, by their first frame:
                   a peer's follow (ROUTES in, RECORDS out) or its calls (service)
    direct.py      ``TurnFollows``: a peer's follow waiting caught up sent a record from the publisher's turn that
                   wrote it, the frame made from the bytes in hand (front-end)
    seam.py        ``ClusterSeam``: the MQTT port's seam (``metaq.mqtt.seam``) as a member answers it, each ask sent
                   to the concern below that answers it (front-end)
following/ (following and routes: EMQX's router)
    inbox.py       the copies of other brokers' messages in ``%MQTTIN%``, and the resume positions they record (state)
    records.py     the inbox's records: which peer's MQTT record a copy keeps as it is, the properties an inbox record
                   adds (codec, compiled where built)
    copyturn.py    a peer's RECORDS frame of plain copies taken in one step: walked once, one append, positions moved
                   once a partition, served from that turn; any other frame the general path's (service, compiled
                   where built)
    routes.py      a broker's filters, aggregated: what its subscriptions want of its peers (logic, pure)
    link.py        the follower's side of one peer: connect, prove, send ROUTES, copy each RECORDS frame (service)
    retained.py    ``PeerRetained``: the peers' retained messages as this broker knows them, merged with its own
                   (state)
    peers.py       ``MqttCluster``: one link per other member, copies through the put path, the route, the start
                   hold (service)
sharing/ (shared groups: EMQX's broker dispatch of ``$share``)
    share.py       ``Shares``: which broker's group takes each record, by the history the sessions' log holds (logic)
    offer.py       ``GroupOffer``: this broker's groups with members and their weights as its route carries them, a
                   change of counts only settled first (service)
clientids/ (client ids and takeover: EMQX's connection manager)
    ids.py         ``home_of``: a client id's home broker (rendezvous hash over the members); ``HomeRegistry``: the
                   home's client id -> holding broker, bounded by ``mqtt.cluster_max_ids`` (state)
    calls.py       broker-to-broker calls over the replication port (PEER_CALL / PEER_REPLY), pipelined on one link
                   per peer (``MQTT_CLUSTER_CALLS_IN_FLIGHT``), each bounded by ``MQTT_CLUSTER_CALL_TIMEOUT_S``, and a
                   link's calls answered (front-end)
    handover.py    a session given up by one broker as JSON (its messages not acknowledged as their records) and
                   adopted by another (written to its own sessions' log); the rest that reached the old broker for
                   it after (the takeover's end) (front-end)
    registrations.py  ``Registrations``: the CONNECTs' registrations with one home, batched (``registers`` calls)
                   (service)
    leases.py      ``Leases``: the leases of the homes this broker holds (renewed by calls), and when a holder's
                   surely ran out (service)
    service.py     ``ClientIds``: a CONNECT's registration with the id's home, the home's serialisation per id and
                   its calls to the holder, the takeover's end, the leases of the homes, re-registration when the
                   members change (service)
"""
