"""Delayed delivery: any delivery time, ``put_at`` (a message delivered at a time the producer names), ``cancel``
and ``timers``; and the delay levels, ``put_delayed`` (RocketMQ's ``messageDelayLevel``) (docs/messaging.md "Delayed
delivery", "Any delivery time", "Cancel", "Delay levels and any delivery time: why both").

Two mechanisms, one record layout. Both keep a message first as an entry in an internal topic, put through the
normal put path, and share what is the same: the entry's layout (``records.pack_entry`` / ``unpack_entry``), where
the message goes when it is put (``service.place``) and the writer both write with (the put path's ``BrokerWrites``:
the record delivered with the producer's data and born time and the entry's id, what wakes after it). They stay
two because a level is a queue in due order: every entry of a level has the same delay, so appending it to its
level's partition of ``SCHEDULE_TOPIC`` keeps that partition in due order, delivery reads it from one offset, and
an entry costs one append. Any delivery time has no such order: its entries need an index ordered by due time
(``index.py``, SQLite in a thread of its own), a DONE record to say what was delivered and CANCEL records. And
RocketMQ clients rely on the levels as they are: ``delayTimeLevel``'s meaning (0 none, above the last the last),
the answered id naming the entry in ``SCHEDULE_TOPIC``'s queue ``level - 1``, ``stats delay`` per level.

A feature package: every module of the feature is here, named by its role, and each role is a layer's
(``tests/test_layers.py`` FEATURE_ROLES, docs/architecture.md "Feature packages"). A module imports what its
layer may, and of this package only modules of its own role's layer or a lower one.

codec (the protocol layer: bytes in, values out; no socket, log or clock)
    records.py   the %TIMER% topic's records (ENTRY, CANCEL, DONE; ENTRY's layout is a schedule entry's too), put_at's
                 ``when``, RocketMQ 5's TIMER_* properties
    wire.py      the put_at / cancel / timers text commands: parsers, serializers, their registration in
                 ``protocol.commands`` (``metaq.textcommands`` lists it, so the registry is complete)
    burst.py     a receive buffer's run of plain put_at frames checked and encoded as ENTRY records (C twin:
                 ``native/timerburst.c``)
    levels.py    the delay levels (RocketMQ's ``messageDelayLevel``), ``SCHEDULE_TOPIC`` and its schedule entry
logic (the protocol layer: pure decisions, the time passed in)
    window.py    the delivery window: the pending rows due soonest, bounded by rows and bytes
state (the store layer: files and in-memory state; no socket, gevent or clock)
    index.py     timers.db (SQLite): pending rows by due time, recent outcomes, indexed_position, indexed_offset,
                 scan_from
    follow.py    TimerFollow: timers.db's subscriber of the store's log follower (a bounded batch of %TIMER% records,
                 collected on the loop; cuts, retention's floor)
    handoff.py   what the master's own %TIMER% writes hand the subscriber, decoded and bounded
service (the server layer: gevent)
    service.py   TimerService: applies the subscriber's batches to timers.db, the delivery window's loop, exactly
                 once after a crash; what both mechanisms share at a put and a delivery (place, deliver, announce)
    scheduler.py DelayScheduler: the delay levels' delivery, one greenlet per level, exactly once after a crash
front-end (the server layer: a front-end's handlers)
    text.py      the text handlers of put_at, cancel and timers
    fasttext.py  the text port's put_at burst path: pipelined put_at frames stored and answered in one pass
    http.py      the HTTP port's timer routes: pending timers listed, one cancelled (admin)
The client's side is in metaq/client/ (which imports the features and none imports it): ``client/timers.py`` (the
producer's: a ``when`` checked and encoded, a cancel sent and its reply read) and ``client/admin/timers.py``
(``metaq-admin timers list|cancel``).
"""
