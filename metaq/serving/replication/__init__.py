"""What both ends of a replication link share: a slave and its master (server/replication/), a peer broker's
MQTT follow and its server (mqttcluster/): timings and framing (link.py), the proofs of the secret (handshake.py)."""
