"""Sans-IO codecs: bytes in, events out. Never touches a socket, never logs."""
