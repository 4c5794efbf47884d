"""Client ids and takeover (EMQX's connection manager): a client id is the cluster's, registered with its home broker,
which takes it from the broker holding it; the calls between brokers that carry it. The modules of this concern,
each named by its role (the feature's map: ``metaq/mqttcluster/__init__.py``)."""
