"""Shared groups (EMQX's broker dispatch of ``$share``): which broker's group takes each message published on the
broker it was published on. The modules of this concern, each named by its role (the feature's map:
``metaq/mqttcluster/__init__.py``)."""
