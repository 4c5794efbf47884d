"""The RocketMQ remoting front-end: listener, dispatch, sends, consumer-group bookkeeping."""
