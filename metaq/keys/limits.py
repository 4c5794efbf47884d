"""The key index's named limits, each with the reason for its value.

A limits module: stdlib and other limits modules only, so that any layer may read it (metaq.limits
``modules`` finds every one for the configuration reference and the docs' checks).
"""

# -- the key index (keys/index.py; docs/messaging.md "Key index") --------------------------------------------------
#: Keys of one message the key index takes (RocketMQ's space-separated ``KEYS`` words, then ``UNIQ_KEY``); the
#: ones past it are stored with the message but not indexed, so a message with 10,000 keys costs 32 entries.
MAX_KEYS_PER_MESSAGE = 32
#: Longest key (UTF-8 bytes) the key index takes; a longer one is not indexed, and a lookup of one is refused.
MAX_KEY_BYTES = 128
#: Messages one key lookup returns at most (a page: QUERY_MESSAGE's maxNum and a text ``lookup``'s count are
#: cut to it); the rest comes with the cursor the page ends with.
MAX_KEY_QUERY_RESULTS = 64
#: Record bytes one lookup page returns at most (at least one record): a page of 64 large messages stays bounded.
MAX_KEY_QUERY_BYTES = 4 << 20
#: Index entries one lookup page walks at most, matching or not (hash collisions, other times, gone records):
#: a page that meets no more within them ends with a cursor, so a popular key in a narrow time window costs a
#: bounded walk per request.
MAX_KEY_SCAN_ENTRIES = 8192
#: Commit-log bytes the key index takes in one step (``MessageStore.follow_log``, driven by the flusher's indexer
#: greenlet after each flush round's waiters are answered, other greenlets running between two steps, until it
#: reaches the flushed end). Records without a key are passed over at memory speed whatever the step; a step of
#: keyed records (every RocketMQ message holds a UNIQ_KEY, indexed in Python) holds the loop well under a turn.
KEY_INDEX_STEP_BYTES = 256 << 10
#: Most log bytes one call of the key index's C walk (``keyed_records``) covers: it returns the offsets of the
#: records with attributes in one list, so an open that indexes a whole 1 GiB segment of small keyed records
#: holds at most this many bytes' worth of them (a Python int per record), not the segment's.
KEY_INDEX_WALK_BYTES = 4 << 20
#: Longest lookup cursor (``<file>:<entry>``, two decimal numbers) a request may carry.
MAX_KEY_CURSOR_BYTES = 48
