"""RocketMQ's remoting protocol, sans-IO: the frame codec (``remoting``), the typed custom headers
(``headers``), the request and response bodies (``bodies``) and how a RocketMQ message maps onto a
MetaQ record (``mapping``)."""
