"""Integer tokens of the text protocol: the one parser of a command's integer fields.

A token is an integer when it is strict decimal, ``-?[0-9]+`` in ASCII (no ``+``, spaces, ``_`` or other digits),
and it is taken when it lies within the field's range. Otherwise ``TokenError`` (a ``ValueError``) says why, naming
the field and the token (quoted, shortened past ``SHOWN_CHARS``): the text parser answers it as a protocol error.
"""

#: The ranges of the protocol's fixed-width fields.
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

SHOWN_CHARS = 64
#: No field's range needs more characters than this (an int64 has 20 with its sign); longer is out of range.
_MAX_CHARS = 40


class TokenError(ValueError):
    """A field of a line is invalid; ``str(exc)`` is the reason the reply gives."""


def show(token):
    """``token`` quoted for an error message, shortened past ``SHOWN_CHARS`` characters."""
    if len(token) > SHOWN_CHARS:
        return repr(token[:SHOWN_CHARS]) + "..."
    return repr(token)


def is_integer(token):
    """True for a strict decimal token, ``-?[0-9]+`` in ASCII."""
    if token.isdigit():
        return token.isascii()
    return token[:1] == "-" and token[1:].isdigit() and token.isascii()


def parse_int(token, what, low, high):
    """The integer ``token`` holds when it is strict decimal within ``low..high``; TokenError naming ``what``
    otherwise."""
    if not is_integer(token):
        raise TokenError("invalid %s %s: not an integer" % (what, show(token)))
    if len(token) <= _MAX_CHARS:
        value = int(token)
        if low <= value <= high:
            return value
    raise TokenError("invalid %s %s: must be %d..%d" % (what, show(token), low, high))
