"""The server's parts the features' services and handlers use: the connection core (connections.py, proxies.py,
wsio.py, tls.py, tlsio.py), the put path (putpath.py), parked gets (longpoll.py), the text front-end's put checks,
putb handler and fast-path takers (putchecks.py, batchput.py, takers.py), and what both ends of a replication link
share (replication/link.py, replication/handshake.py). Below server/, which assembles them with the features
(server/broker.py, the dispatchers, the config schema), and importing no feature (docs/architecture.md)."""
