"""MQTT across a cluster's named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

#: A client id is the cluster's (metaq/mqttcluster/; docs/mqtt.md "A client id across the cluster").
#: Client ids one home broker's registry holds at most (id -> the broker holding its session), the default of
#: ``mqtt.cluster_max_ids``: a CONNECT whose id would be one more is refused (MQTT 5: 0x97 Quota exceeded; 3.1.1:
#: 0x03 Server unavailable). It bounds the home's memory for the registry (an entry per id).
MQTT_CLUSTER_MAX_IDS = 1_000_000
#: ``mqtt.cluster_holder_share_percent``: the share of a home's registry (``mqtt.cluster_max_ids``) one other member
#: may hold, in percent (at least one id),
#: so that no member (busy, or lying in its ``hold`` calls) takes every slot from the others and the home's own
#: devices: past it its CONNECT of an id homed there is refused as by a full registry, its holds not registered.
MQTT_CLUSTER_HOLDER_SHARE_PERCENT = 50
#: Seconds a broker-to-broker call (a takeover's registration, a holder giving its session up, a batch of ids)
#: waits for its answer, the connection and the handshake included; then the peer counts as unreachable.
MQTT_CLUSTER_CALL_TIMEOUT_S = 5.0
#: Bytes of one broker-to-broker call or answer (the PEER_CALL / PEER_REPLY frames' JSON): a session handed over
#: with its messages must fit (MQTT_HANDOVER_MAX_BYTES, base64 and the frame around it).
MQTT_CLUSTER_MAX_CALL_BYTES = 32 * 1024 * 1024
#: Messages a session taken over from another broker brings along at most (in flight and queued: what it has not
#: acknowledged); past it the oldest are kept and the rest are dropped, counted and logged.
MQTT_HANDOVER_MAX_MESSAGES = 10_000
#: Bytes of the messages a session brings along at most (their stored records), likewise.
MQTT_HANDOVER_MAX_BYTES = 16 * 1024 * 1024
#: Seconds a broker taking a session over from another waits at most, before its CONNACK, for the takeover's end:
#: its peers acting on its route with the session's filters (ROUTED), then the old broker's handover of what reached
#: it for the session after it gave it up. Well within the holder's wait for a CONNECT to go live (a move back
#: meanwhile waits for this one); past it the CONNECT goes on with what came (logged, counted).
MQTT_HANDOVER_END_S = 0.5
#: Seconds a broker that gave a session up keeps the session's filters in its route (its peers go on copying for
#: it) and the place its handover ended, for the taking broker's call for the rest (the takeover's end).
MQTT_HANDOVER_LINGER_S = 10.0
#: Sessions given up whose filters and handover end a broker keeps at once for their takeover's end; past it the
#: oldest is forgotten (logged: what reached this broker for it after its handover is not handed on).
MQTT_HANDOVER_MAX_LINGERING = 10_000
#: Seconds a broker keeps a connection of a client id whose home broker it has not reached for that long (a lease,
#: renewed by a call to each member every quarter of it; ``mqtt.cluster_id_lease_s``): past it the connection is
#: closed. A home gives the id to another broker, while the holder does not answer, only once the holder's lease
#: surely ran out since the home last heard from it: two live connections of one id never overlap.
MQTT_CLUSTER_ID_LEASE_S = 4.0
#: Seconds between two readings of the cluster's members in ZooKeeper (the masters' ``replication`` nodes): a
#: broker joining or leaving is seen within this.
MQTT_CLUSTER_MEMBERS_POLL_S = 1.0
#: Client ids one re-registration call carries at most (the ids a broker holds, sent to their new home when the
#: members change), and ids one release call carries.
MQTT_CLUSTER_ID_BATCH = 1000
#: Seconds a broker gathers the ids whose sessions ended before telling their homes (one call per home).
MQTT_CLUSTER_RELEASE_S = 0.5
#: Call links one broker takes from another at most (a broker opens one to each peer and pipelines its calls on it;
#: a broker of the version before took one call a link, up to this many links): the replication port's room for them.
MQTT_CLUSTER_PEER_CONNECTIONS = 4
#: Calls one broker has in flight on its link to another at once, each with an id its answer names (answers come in
#: any order): past it a caller waits its turn, in order, within MQTT_CLUSTER_CALL_TIMEOUT_S, then is told the
#: peer is unreachable; a callee answers a call past it on one link at once with an error saying so.
MQTT_CLUSTER_CALLS_IN_FLIGHT = 16
#: Batches of CONNECTs' registrations one broker has in flight to one home at once (each a call of at most
#: MQTT_CLUSTER_ID_BATCH): a CONNECT past them joins the next batch, sent when one of them is answered.
MQTT_CLUSTER_REGISTER_BATCHES = 4
#: Of MQTT_CLUSTER_CALLS_IN_FLIGHT, the calls to one peer kept for the client ids' lease renewals: a storm of
#: registrations and handovers to that peer never starves them (the others take the rest).
MQTT_CLUSTER_LEASE_CONNECTIONS = 1
#: Seconds a master of an MQTT cluster that begins keeping sessions (its start, a promotion) holds its CONNACKs and
#: wills until every other member follows it again, its route in (``mqtt.cluster_start_hold_s``): a message published
#: before then on a topic new here since a peer last followed would reach none of that peer's subscribers. Past it
#: the broker goes on without the peers still away (logged); they bound how long a restart keeps devices waiting.
MQTT_CLUSTER_START_HOLD_S = 10.0

# -- MQTT across a cluster (metaq/mqttcluster, docs/architecture.md "MQTT across the cluster") ----------------------
#: MQTT filters one broker's route holds (the union of its sessions' filters, sent to every peer): past it the route
#: names whole metaq topics (``<topic>/#`` and ``<topic>``, or ``#``) instead, so a peer sends more than is wanted
#: (the subscriber's broker filters as ever) and nothing is missed.
MQTT_CLUSTER_MAX_FILTERS = 10_000
#: Bytes of one ROUTES frame (the filters, resume positions and groups a broker sends a peer) at most. A route past it
#: (MQTT_CLUSTER_MAX_POSITIONS positions of long topic names, long filters) goes in as many ROUTES frames as it takes,
#: joined by the peer before it acts on them, within MQTT_CLUSTER_MAX_FILTERS, _POSITIONS and _GROUPS in all.
MQTT_CLUSTER_ROUTES_BYTES = 4 * 1024 * 1024
#: Bytes of records a peer puts in one RECORDS frame (it stops adding at the first record past it; one record alone
#: may be larger, within MQTT_CLUSTER_FRAME_BYTES).
MQTT_CLUSTER_BATCH_BYTES = 1024 * 1024
#: Bytes of one RECORDS frame at most (checked from its header before it is buffered).
MQTT_CLUSTER_FRAME_BYTES = 16 * 1024 * 1024
#: Characters of the topic names whose match against a peer's filters its follow keeps (``serve.FilterSet.match``:
#: a name matched once, not per record), counted over the names kept; one more name past it drops the kept answers,
#: which are kept again as names come. A follow's memory for them stays about a megabyte however many names pass.
MQTT_CLUSTER_MATCHES_KEPT_CHARS = 1024 * 1024
#: (topic, partition) pairs a peer's link follows at most; past it the topics that do not fit are not followed (the
#: serving broker logs it). Also the partitions a serving broker remembers of a peer's ended follow (where it started
#: those the peer sent no position for: ``serve.PeerServer.since``).
MQTT_CLUSTER_MAX_FOLLOWED = 65_536
#: Peers (other masters) a broker keeps a link to at most; past it the lowest broker ids are kept and it logs it.
#: Also the peers whose ended follows a serving broker remembers (the oldest forgotten past it).
MQTT_CLUSTER_MAX_PEERS = 64
#: Connections the other masters of an MQTT cluster on one host may hold on a broker's replication port once each
#: proved the replication secret (a follow link and MQTT_CLUSTER_PEER_CONNECTIONS call links from each of up to
#: MQTT_CLUSTER_MAX_PEERS): a proved peer leaves its address's HEADROOM_PER_ADDRESS share for this one, so one host
#: may run as many brokers of a cluster as it has cores. Past it the peer is refused and retries.
MQTT_CLUSTER_PEERS_PER_ADDRESS = (1 + MQTT_CLUSTER_PEER_CONNECTIONS) * MQTT_CLUSTER_MAX_PEERS
#: File descriptors a broker of an MQTT cluster keeps for its outgoing links at most (a follow link and
#: MQTT_CLUSTER_PEER_CONNECTIONS call links to each of MQTT_CLUSTER_MAX_PEERS peers), on top of FD_RESERVE.
MQTT_CLUSTER_LINK_FDS = (1 + MQTT_CLUSTER_PEER_CONNECTIONS) * MQTT_CLUSTER_MAX_PEERS
#: Connections the replication port of a broker in an MQTT cluster takes past the connection cap besides
#: REPLICATION_HEADROOM: its peers' links in, what each of up to MQTT_CLUSTER_MAX_PEERS peers opens to it (its own
#: MQTT_CLUSTER_LINK_FDS seen from this side), so that clients filling the cap never keep a peer out. Kept back
#: from the open-files limit too (``fd_reserve_for``); one host still holds at most HEADROOM_PER_ADDRESS of it
#: unproved and MQTT_CLUSTER_PEERS_PER_ADDRESS proved.
MQTT_CLUSTER_PEER_HEADROOM = MQTT_CLUSTER_LINK_FDS
#: Partitions of the inbox (``%MQTTIN%``), the internal topic a broker copies its peers' messages into.
MQTT_CLUSTER_INBOX_PARTITIONS = 8
#: Copies of one RECORDS frame the turn that writes them serves at most to the subscribers waiting on the inbox
#: (``MqttCluster.apply``, as a publisher's burst of at most MQTT_PUBLISH_BURST serves its own): that turn does not
#: share the loop while it serves; a frame of more (a backlog crossing) is left to the subscribers' deliveries, which
#: do.
MQTT_CLUSTER_DIRECT_COPIES = 128
#: (origin broker, topic, partition) resume positions a broker keeps at most (recovered from its inbox).
MQTT_CLUSTER_MAX_POSITIONS = 262_144
#: Epochs of one origin partition a broker keeps at most with its position: those its copy went through, where it
#: entered each, the latest last (sent with ROUTES, ``epoch_paths``). The origin resumes a copy no further than where
#: it entered the oldest of the latest ones its own history does not hold: a chain of more deposed masters in a row
#: than this, each of whose epochs the copy went through and the new master never held, is known by its latest ones.
MQTT_CLUSTER_EPOCHS_KEPT = 3
#: Retained messages of peers a broker keeps at most (with their clears), beside its own ``mqtt.max_retained``.
MQTT_CLUSTER_MAX_RETAINED = 100_000
#: ``$share`` groups (share name, filter) one broker's route carries at most; past it the others are not sent (their
#: members on this broker receive only what is published here) and it logs it. A decoded ROUTES holds at most as many.
MQTT_CLUSTER_MAX_GROUPS = 10_000
#: Membership changes of one ``$share`` group a broker keeps at most, in its sessions' log (from which log position on,
#: which brokers had members): a message is assigned by the brokers of the last change at or before its place in the
#: log. A change goes once the log's start passes the change after it (nothing it assigns can be read); past this
#: bound the oldest goes sooner, counted (``mqtt_cluster_share_changes_forgotten``), and a record older than the
#: oldest kept change, read by a reader that far behind, is assigned as by it.
MQTT_CLUSTER_SHARE_HISTORY = 64
#: Largest weight of a broker in a ``$share`` group's assignment: its members in the group, counted up to this (a
#: broker's share of the group's messages is its weight over the sum; 0: the group is kept there for persistent members
#: away, and takes a share only while no broker has a member connected). A ROUTES or a history with a weight outside
#: 0..this is refused.
MQTT_CLUSTER_SHARE_WEIGHT_MAX = 65_535
#: Seconds a change in the number of a group's members on a broker waits before it goes into its weight (the route
#: sent again, a change in each group's history in the sessions' log): a burst of members joining costs one change per
#: group, not one per member. A group's first member here or its last leaving goes at once.
MQTT_CLUSTER_SHARE_SETTLE_S = 10.0
#: How far (percent of the weight a route carries) a group's members on a broker may move before its weight changes:
#: members coming and going around a count change nothing, so a group's history (at most MQTT_CLUSTER_SHARE_HISTORY
#: changes) spans its real changes, not its members' churn. A broker's share is so within this of its members' share.
MQTT_CLUSTER_SHARE_WEIGHT_STEP_PERCENT = 25
