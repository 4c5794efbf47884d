"""What the front-ends' handlers share of the event loop, below the server and the features that use it.

coldpages.py  cold map pages brought in by gevent's pool before the loop reads them (a stepwise read walked)
inflate.py    a compressed body decompressed on arrival, in steps, other clients served between
expect.py     a get's expect: the record the client read last, compared before reading (412)

The server's text and remoting front-ends and the features' services and handlers (keys, filters, priorities,
timers, trace, pop, request-reply, RocketMQ 5) import them; they import nothing of the server or of a feature.
"""
