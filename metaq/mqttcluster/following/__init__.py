"""Following and routes (EMQX's router): each master follows every other master's log for what its own sessions
subscribe (its route), copies what matches into its inbox, and keeps the peers' retained messages. The modules of
this concern, each named by its role (the feature's map: ``metaq/mqttcluster/__init__.py``)."""
