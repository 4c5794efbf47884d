"""MQTT for devices: MQTT 3.1.1 and 5.0 spoken to the shared log (docs/mqtt.md).

A feature package: every module of the feature is here, named by its role, and each role is a layer's
(``tests/test_layers.py`` FEATURE_ROLES, docs/architecture.md "Feature packages"). A module imports what its
layer may, and of this package only modules of its own role's layer or a lower one.

codec (the protocol layer: bytes in, values out; no socket, log or clock)
    wire.py        the control packets of MQTT 3.1.1 (level 4) and 5.0 (level 5): ``MqttParser`` (bytes in, packets
                   out, a named maximum packet size checked before a body is kept), ``encode``, MQTT 5 properties and
                   reason codes; every refusal an ``MqttError`` carrying the reason code a server answers with
                   (``refusal``)
    records.py     an MQTT message in a metaq record (its topic name, QoS and MQTT 5 properties kept as the RocketMQ
                   mapping's properties) and a record as an MQTT message; the metaq topic and partition of a name
logic (the protocol layer: pure decisions)
    topics.py      topic names and filters: validation, ``+`` / ``#`` matching, ``$`` topics, shared subscriptions
                   (``$share/<ShareName>/<filter>``), bounded by MQTT_MAX_TOPIC_BYTES and MQTT_MAX_TOPIC_LEVELS
state (the store layer's rules: no socket, gevent or clock)
    session.py     ``MqttSession``: one client's subscriptions, read cursors, QoS 2 packet ids and messages in flight
                   (saved and restored whole for a persistent session); ``SharedGroup``: a ``$share`` group
    follow.py      persistent sessions, shared groups' kept read positions and retained messages as records of
                   the internal topic ``%MQTT%``: the ``SessionTable`` they build (replayed at open), and
                   ``MQTT_JOURNAL``, what ``store/journals.py``'s ``JournalFollow`` follows to keep a slave's table
                   current
    decoded.py     records decoded and QoS 0 PUBLISHes encoded once for every delivery of the port (bounded)
front-end (the server layer)
    port.py        ``MqttPort``: the listener on the connection core, the client ids connected (takeover), the
                   persistent sessions' and retained messages' table (saved, expired), the shared groups
    wills.py       ``Wills``: the port's wills: published when a connection is lost, held for their delay, kept in
                   the sessions' log until done, adopted by the master taking over, tried again after a passing refusal
    connection.py  one connection: its packets read and handed to their operation group, its socket written in
                   whole packets by every writer, PINGREQ, DISCONNECT, takeover and its end; bad input answered and
                   closed
    connect.py     CONNECT: client id, login, will, Keep Alive, the session (new, resumed, taken over), CONNACK
    publishes.py   PUBLISH (topic aliases, QoS 1/2 state, a read's PUBLISHes stored as one burst) and PUBREL
    acks.py        the acknowledgements sent for what the client published, in order, once each put may be
                   acknowledged; the count of its unacknowledged PUBLISHes (mqtt.receive_maximum)
    plainturn.py   a device's read of plain PUBLISHes stored and acknowledged in one step; a burst's PUBACKs
                   written from the reader's turn (compiled with Cython where built: ``metaq.native``)
    subscriptions.py  SUBSCRIBE, UNSUBSCRIBE, the shared groups left, the client's acknowledgements of deliveries;
                   the connection's delivery
    delivery.py    what a connection's subscriptions read from the log and send: ``Delivery`` and its greenlet's loop
    subscribing.py a filter's topics and partitions, from where they are read, the retained messages it is sent
    outbound.py    how one message goes out to a connection: the decision, the PUBLISH, its alias, send and pacing
    resend.py      what a resumed session sends first: its messages in flight, those carried from another broker
    direct.py      a visible burst sent from the publisher's turn to waiting subscribers (``deliver_now``), and a
                   cluster's copies from the turn that writes them (``serve_copies``)
    fanplan.py     a delivery's part in the fan-out readers: what it hands over, its plan of a batch
    fanout.py      the port's fan-out readers: one per partition for every caught-up QoS 0 delivery
"""
