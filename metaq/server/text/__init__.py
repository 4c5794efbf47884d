"""The MetaQ text-protocol front-end: connections, dispatch, the put-burst fast path."""
