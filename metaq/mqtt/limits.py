"""MQTT's named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

from metaq import limits

# -- MQTT (metaq/mqtt/: the codec and the topic rules) ----------------------------------------------------------------
#: Largest MQTT control packet a peer may send, its fixed header included (MQTT 5's Maximum Packet Size counts the
#: same bytes): a Remaining Length that would pass it is refused (MQTT 5 reason 0x95) as soon as the length field is
#: read, before a byte of the body is kept. A message's payload lands in the log, so the log's body limit is the
#: figure; the protocol's own ceiling is 268,435,460 bytes.
MQTT_MAX_PACKET_BYTES = limits.MAX_BODY_BYTES
#: Longest MQTT topic name or topic filter, in UTF-8 bytes: the protocol's own ceiling (a string's two-byte length).
MQTT_MAX_TOPIC_BYTES = 65_535
#: Most levels (``/``-separated) an MQTT topic name or filter may have: a filter's match walks its levels, so one
#: topic of 30,000 empty levels does not cost 30,000 steps per message matched.
MQTT_MAX_TOPIC_LEVELS = 128
#: QoS 1 and 2 PUBLISHes a client may have unacknowledged on one connection (``mqtt.receive_maximum``; MQTT 5's
#: Receive Maximum, told in the CONNACK): a QoS 1 until its PUBACK, a QoS 2 until its PUBCOMP. One more is refused
#: (MQTT 5: DISCONNECT 0x93; 3.1.1: closed). It bounds each session's QoS 2 packet-id state too.
MQTT_RECEIVE_MAXIMUM = 64
#: QoS 0 and 1 PUBLISHes (not retained) of one connection stored together as one burst (the store's burst path: one
#: append, the stats counted once, their PUBACKs sent together once the burst's flush and replication modes let them
#: be acknowledged). A socket read's PUBLISHes are gathered until the burst holds this many, or
#: ``MQTT_PUBLISH_BURST_BYTES`` of records, or another packet, the end of the read or the reader's turn comes: then
#: they are stored, in their order, before anything after them is handled.
MQTT_PUBLISH_BURST = 128
#: Record bytes one MQTT publish burst gathers at most (``MQTT_PUBLISH_BURST``): past it the burst is stored at once.
MQTT_PUBLISH_BURST_BYTES = 1024 * 1024
#: Metaq topics an MQTT connection keeps the write decision of across its turns (``Publishes.decided``: asked again
#: only once something it reads changed, ``PutPath.decision_stands``): a device publishes to a few; past the count
#: the kept decisions start again.
MQTT_KEPT_DECISIONS = 32
#: Topic names whose staging plans (``records.plain_plan``) and metaq topics whose write decisions an MQTT connection
#: keeps while it is parked (``Publishes.parked``): a device's next PUBLISH to one of them is split and staged in one
#: step from the first packet of its next turn. A connection that used more keeps none (its next turn makes them).
MQTT_PARKED_PLANS = 2
#: How long an idle MQTT connection keeps its greenlet before it parks (the connection core's ``park_after_s``): a
#: client that sends again within it is read at once (a busy publisher, a subscriber's acknowledgements), one whose
#: next packet is later (a device's telemetry, its keep-alive) holds no greenlet meanwhile.
MQTT_PARK_AFTER_S = 0.05
#: QoS 1 and 2 messages the broker has sent one connection and not yet had acknowledged (``mqtt.max_inflight``;
#: lower when the client's own Receive Maximum is): delivery to it waits until an acknowledgement makes room.
MQTT_MAX_INFLIGHT = 32
#: Topic filters one MQTT session may hold (``mqtt.max_subscriptions``): one more is refused in the SUBACK (MQTT 5:
#: 0x97 Quota exceeded; 3.1.1: 0x80).
MQTT_MAX_SUBSCRIPTIONS = 64
#: Topics a filter that starts with a wildcard (``#``, ``+/x``) reads (``mqtt.max_wildcard_topics``): such a filter
#: reads every topic its user may read; a SUBSCRIBE that would read more is refused (0x97 / 0x80), and topics that
#: appear later past the bound are not read (logged once).
MQTT_MAX_WILDCARD_TOPICS = 256
#: Rules of ``mqtt.topic_map`` (MQTT topic filter -> metaq topic, first match wins; docs/mqtt.md "Topics"): a
#: configuration with more is refused at the start. Each new topic name is matched against them once (the broker
#: remembers a name's topic), each SUBSCRIBE's filter against all of them.
MQTT_MAX_TOPIC_RULES = 256
#: The metaq topic of MQTT names whose first level is no legal metaq topic name (``mqtt.fallback_topic``'s default).
MQTT_FALLBACK_TOPIC = "mqtt"
#: MQTT topic names whose metaq topic the broker remembers (``TopicMap.place``; the most recent, a device repeats
#: the same few): a name not among them is matched against the rules again.
MQTT_PLACED_NAMES = 4096
#: Longest MQTT client identifier, in UTF-8 bytes (``mqtt.max_client_id_bytes``; the specification asks for 23 at
#: least): a longer one is refused in the CONNACK (0x85 / 0x02).
MQTT_MAX_CLIENT_ID_BYTES = 128
#: Topic aliases one MQTT 5 client may set on a connection (``mqtt.topic_alias_maximum``, told in the CONNACK): an
#: alias past it is refused (DISCONNECT 0x94).
MQTT_TOPIC_ALIAS_MAXIMUM = 16
#: Topic aliases the broker sends one MQTT 5 connection at most (``mqtt.max_outbound_aliases``; never past the Topic
#: Alias Maximum of the client's CONNECT, 0 there: none): a name's first delivery takes a free one. Past them the
#: alias least recently used goes to a name delivered again, sent with it again, when that alias was not used since
#: the name's previous delivery; the topic names delivered without an alias it remembers per connection until then
#: are bounded by this too (each a reference to a name, so a connection holds at most twice this many)
#: (``mqtt.topics.OutboundAliases``).
MQTT_MAX_OUTBOUND_ALIASES = 64
#: The longest Keep Alive the broker accepts, in seconds (``mqtt.max_keep_alive_s``; 0: no bound, the default). An
#: MQTT 5 client asking for more, or for none (0), is told this one in the CONNACK (Server Keep Alive) and held to
#: it (closed after 1.5 times it without a packet); an MQTT 3.1.1 one is refused (CONNACK 0x02), as Mosquitto's
#: ``max_keepalive`` does, 3.1.1 having no way to tell it.
MQTT_MAX_KEEP_ALIVE_S = 0
#: Will messages the broker holds for their MQTT 5 Will Delay at once (``mqtt.max_delayed_wills``): past it a will is
#: published at once, as if its delay were 0.
MQTT_MAX_DELAYED_WILLS = 10_000
#: Records one MQTT delivery read takes from a partition (its bytes are bounded by the reply budget and
#: ``store.max_transfer_size``).
MQTT_DELIVERY_BATCH = 64
#: Subscribers a publisher's burst serves itself, at most, right after its append (``MqttPort.deliver_now``): those
#: whose delivery waits caught up on the burst's partitions, each with one read of at most ``MQTT_DELIVERY_BATCH``
#: records and writes that never wait; the others (and anything the writes cannot take) are their deliveries' own.
MQTT_DIRECT_DELIVERIES = 8
#: Records the MQTT deliveries keep decoded, with their QoS 0 PUBLISHes encoded, for the other subscribers that get
#: the same message (``mqtt.decoded.Decoded``): the most recently read ones; past it the oldest is decoded again.
MQTT_SHARED_DECODES = 1024
#: Topic names one MQTT delivery keeps the match of against its session's filters (``Outbound.decision``): past it
#: all are matched again; a change of the session's subscriptions drops them at once.
MQTT_KEPT_MATCHES = 64
#: The longest topic name (characters) the broker keeps anything for: a delivery's match (``MQTT_KEPT_MATCHES``),
#: the name's metaq topic (``MQTT_PLACED_NAMES``), its record attribute
#: (``MQTT_ATTRIBUTE_CACHE``), a connection's staging plan (``MQTT_PLAIN_PLANS``). A longer one (names may be 65,535
#: bytes) is matched, placed and encoded at every message, so what is kept stays within those counts times this.
MQTT_KEPT_NAME = 256
#: Attributes of PUBLISHes without MQTT 5 properties remembered, by (topic name, QoS, client id, retain): the most
#: recent ones (``records.record_data``; names up to ``MQTT_KEPT_NAME``).
MQTT_ATTRIBUTE_CACHE = 4096
#: Bytes (payloads and encoded PUBLISHes) those records may hold together, for each of the two kinds: past it the
#: oldest go first, so large messages are kept fewer.
MQTT_SHARED_DECODES_BYTES = 2 * 1024 * 1024
#: How often a connection whose filters start with a wildcard looks for topics created since (seconds); it is also
#: the longest a delivery waits for an append before it looks again.
MQTT_TOPIC_RESCAN_S = 1.0
#: How often a persistent MQTT session's read positions and messages in flight are written to the sessions' log
#: (``%MQTT%``) while they change (seconds): one record per session per interval at most, whatever it delivers, so
#: the log's write amplification is bounded; after a kill -9 what was delivered in the last interval is delivered
#: again (at least once). Subscriptions, QoS 2 packet ids and ends of sessions are written at once.
MQTT_SESSION_SAVE_INTERVAL_S = 1.0
#: How often the MQTT port looks whether this broker may keep sessions and wills (seconds): a master that stops
#: being one (deposed, its lease run out, isolated) closes the connections holding them within this much, and one
#: that becomes master publishes the wills left in the sessions' log as soon.
MQTT_ROLE_CHECK_S = 0.1
#: How often a will whose publish a passing refusal stopped (a full disk, a write no slave could confirm) is tried
#: again while its broker keeps sessions (seconds); it stays in the sessions' log until published.
MQTT_WILL_RETRY_S = 1.0
#: Wills waiting for a passing refusal to end whose record the sessions' log no longer holds (their client id
#: recorded a newer will meanwhile): kept in memory, tried again with the others; past it the oldest is dropped
#: (logged). Those the log still holds are bounded by the log.
MQTT_MAX_DETACHED_WILLS = 10_000
#: How long a master that may confirm no write (``sync``, no member in sync; ``mqtt.unconfirmable_grace_s``) keeps
#: the connections holding a persistent session or a will open (seconds): a slave's restart does not close every
#: device. New CONNECTs are refused meanwhile; past it they are closed (Use another server), and their wills wait
#: this long again once it may write, for their clients to come back, before they are published.
MQTT_UNCONFIRMABLE_GRACE_S = 10.0
#: Sessions kept for clients that are not connected (``mqtt.max_offline_sessions``): when one more goes offline, the
#: one offline longest is ended (its client's next CONNECT gets Session Present 0).
MQTT_MAX_OFFLINE_SESSIONS = 10_000
#: CONNECTs a broker works on at once (their login, session, the cluster's client id, the takeover, the CONNACK):
#: past them a CONNECT waits its turn, read but not yet worked on. A storm of thousands of devices coming back at
#: once then leaves the loop's turns short, so that what else it serves (PINGREQs, publishes, another broker's
#: calls that keep the cluster's client-id leases) is not held behind the whole storm.
MQTT_CONNECTS_AT_ONCE = 64
#: Longest a session is kept for a client that is not connected (``mqtt.offline_session_max_age_s``, seconds): an
#: MQTT 3.1.1 persistent session (which has no expiry of its own) and an MQTT 5 one with a longer expiry interval
#: end then.
MQTT_OFFLINE_SESSION_MAX_AGE_S = 7 * 24 * 3600
#: How far (bytes of log) a session's last record may fall behind the log's written end before it is written again
#: at the end, so that retention can delete the segments below it: the sessions' log needs only each session's last
#: record, and this bounds how much log the sessions keep (the rewrite costs one record per session per this much).
MQTT_SESSION_REWRITE_BYTES = 64 * 1024 * 1024
#: Retained messages the broker keeps (``mqtt.max_retained``): a retained PUBLISH to one more topic name is refused
#: (MQTT 5: 0x97 Quota exceeded in its PUBACK or PUBREC; 3.1.1: closed, as every refused PUBLISH).
MQTT_MAX_RETAINED = 10_000
#: Payload and property bytes of every retained message together (``mqtt.max_retained_bytes``): a retained PUBLISH
#: that would pass it is refused as one past ``mqtt.max_retained`` is.
MQTT_MAX_RETAINED_BYTES = 64 * 1024 * 1024
#: Largest record of one session (its subscriptions, read positions, packet ids): a session that would need more is
#: not saved (logged; it lives as long as its connection), the bound being what a replay holds per record.
MQTT_MAX_SESSION_RECORD_BYTES = 1024 * 1024
