"""RocketMQ remoting's named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

from metaq import limits

#: Largest RocketMQ remoting frame, counting its 4-byte length field (Java's
#: ``com.rocketmq.remoting.frameMaxLength`` default, compared the same way Netty's
#: LengthFieldBasedFrameDecoder does: length field value + 4).
MAX_REMOTING_FRAME = 16 * 1024 * 1024

#: Largest header (JSON or ROCKETMQ binary) of a remoting frame. Java has no
#: separate cap; a send header carries at most 32 KiB of properties, which JSON
#: escaping (``\u0001``) can grow sixfold, so 1 MiB leaves ample room.
MAX_REMOTING_HEADER = 1024 * 1024

#: Room kept under RocketMQ's 32,767 bytes of properties (``MAX_PROPERTIES_BYTES``) for those the broker adds to a
#: served message (a check-back's TRAN_MSG and PGROUP, a send-back's RETRY_TOPIC...).
PROPERTIES_HEADROOM = 1024
#: Requests one remoting connection may have in progress at once (long-polling
#: pulls and sends waiting for their flush included); reading pauses at the cap.
MAX_REMOTING_INFLIGHT = 256
#: Request bytes (bodies) one remoting connection's requests in progress may hold; reading pauses past it (one
#: request is always let in): a producer that pipelines sends and never reads the answers holds no more.
MAX_REMOTING_INFLIGHT_BYTES = 32 << 20
#: The same over every remoting connection together (thousands of connections holding 32 MiB each).
MAX_REMOTING_INFLIGHT_BYTES_TOTAL = 512 << 20

#: (consumer group, client id) entries the remoting port keeps from heartbeats; a heartbeat that would add
#: more is refused (INVALID_PARAMETER), so clients inventing ids and groups cannot grow the registry.
MAX_REMOTING_MEMBERS = 100_000

#: Consumer groups one RocketMQ heartbeat may name (real clients send a handful); more is INVALID_PARAMETER.
MAX_HEARTBEAT_GROUPS = 1024

#: Oneway notifications (NOTIFY_CONSUMER_IDS_CHANGED) waiting to be sent to one remoting connection; past it
#: they are dropped (a client that does not read cannot hold the broker's memory or another client's request).
MAX_PENDING_NOTIFIES = 16
#: Bytes of the broker's own requests (pushed replies, check-backs with their message) waiting to be sent on one
#: remoting connection, and on the whole broker; past either a new one is not queued (one is always let through
#: on a connection with none): connections that never read hold no more of the broker's memory.
MAX_PENDING_NOTIFY_BYTES = 8 << 20
MAX_PENDING_NOTIFY_BYTES_TOTAL = 256 << 20

#: Queues one LOCK_BATCH_MQ / UNLOCK_BATCH_MQ body may name (a real client names the queues of one topic on one
#: broker, at most MAX_PARTITIONS, plus its retry queue); more is INVALID_PARAMETER, the request is not applied.
MAX_LOCK_BATCH_QUEUES = limits.MAX_PARTITIONS + 64

#: Queue locks of orderly consumers the broker keeps, one per (group, topic, queue) (``remoting.max_locks``);
#: past it a lock on one more queue is refused (not in ``lockOKMQSet``) until locks are released or expire.
MAX_REMOTING_LOCKS = 100_000

#: Longest RocketMQ client id (``ip@instance``) a heartbeat may carry (UTF-8 bytes); the registry keeps it, and a
#: longer one is refused with the heartbeat (its group names: ``MAX_NAME_BYTES``).
MAX_CLIENT_ID_BYTES = 255
