"""metaq: a MetaQ-style message broker (text protocol, shared commit log, 16-byte index units)."""

__version__ = "0.1.0"
