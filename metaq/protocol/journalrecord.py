"""A journal record's JSON (the POP journal's, the MQTT sessions' log's; also the MQTT cluster's calls between
brokers): compact bytes, one way of writing them. orjson for its speed (a record is written at every POP receive and
ack and every persistent MQTT session's connect and end, and the master decodes each it writes again; a reconnect
storm's registrations cross brokers by the batch); the json module for what orjson will not write. Pure."""

import json

import orjson

__all__ = ["encode_record", "decode_record"]

#: The encoder of what orjson will not write (a string with a lone surrogate, an int past 64 bits); a record is
#: plain lists and dicts built by its feature, never a cycle, so it is not checked for one.
_ENCODER = json.JSONEncoder(separators=(",", ":"), check_circular=False)


def encode_record(value):
    """A journal record's value (plain dicts, lists, strings, numbers) as compact JSON bytes: as orjson writes it
    (UTF-8, not ``\\u`` escapes: never longer than the json module's), else as the json module does (a lone
    surrogate, an int past 64 bits); ``decode_record`` reads both (an int past 64 bits as a float)."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson's JSONEncodeError
        return _ENCODER.encode(value).encode("utf-8")


def decode_record(data):
    """The value of ``encode_record``'s bytes (bytes or a view of them), by orjson: for records whose integers fit
    64 bits (offsets, times, protocol fields), as an integer past them comes back a float. Raises ValueError
    (UnicodeDecodeError included) for what is not JSON."""
    try:
        return orjson.loads(data)
    except ValueError:  # orjson's JSONDecodeError; also the json module's escape of a lone surrogate
        return json.loads(bytes(data).decode("utf-8"))
