"""Per-message acknowledgement (POP): RocketMQ 5's SimpleConsumer model in the store (docs/messaging.md
"Per-message acknowledgement (POP)"): receive with an invisible duration, ack by receipt handle, change the
invisible duration, redelivery with an attempt count, dead letters past the group's maximum attempts, FIFO message
groups one at a time, consumers outnumbering partitions; the state journaled as ``%POP%`` in the commit log.

Modules by role:

* ``records``  codec      the journal's records (JSON, one ``%POP%`` message each) and receipt handles
* ``wire``     codec      the text commands ``receive``, ``ack``, ``change_invisible``: parsers, serializers, the
                          reply body, their registration
* ``state``    state      PopState: per group and topic-partition the cursors, flights, out-of-order acks (pure, the
                          time passed in); a receive's plan; ``apply``, one for live and replayed records
* ``follow``   state      PopLog (the records in the log, its snapshots' floor), the replay (snapshots replace what
                          came before), POP_JOURNAL (what store/journals.py's JournalFollow follows: a slave learns
                          the master's records)
* ``service``  service    PopService: receive, ack, change_invisible, dead_letter (the API every front-end calls),
                          dead-letter copies, snapshots, the role
* ``text``     front-end  the text handlers

SimpleConsumer (receive, ack, change_invisible over the text protocol) is the client's: ``client/pop.py`` (the
client imports the features and none imports it).
"""
