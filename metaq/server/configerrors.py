"""A configuration's validation errors as one line a newcomer can act on.

pydantic speaks of its own types ("Input should be a valid dictionary or instance of BrokerSection");
this module says the same in the file's terms ("broker: expected a mapping of settings (id, host,
port, ...), got 8141"), and blames a bad value on the command-line flag that gave it (``--port 70000``)
rather than on the file or the defaults it overrode.
"""

import typing

from pydantic import BaseModel

#: Setting names shown when a section was given as a scalar (the first few, then "...").
SHOWN_SETTINGS = 3


def _model_in(annotation):
    """The BaseModel class inside ``annotation`` (``Optional[X]``, ``List[X]``, ``X``), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _section_at(root, loc):
    """The section model a location names (``("broker",)`` -> BrokerSection), or None."""
    model = root
    for part in loc:
        if isinstance(part, int):
            continue  # an item of a list: same model
        field = model.model_fields.get(part) if model is not None else None
        if field is None:
            return None
        model = _model_in(field.annotation)
    return model


def _describe(root, err):
    """pydantic's message for one error, in the file's terms where it has a clearer one."""
    kind = err.get("type")
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        section = _section_at(root, err["loc"])
        names = list(section.model_fields)[:SHOWN_SETTINGS] if section is not None else []
        what = "a mapping of settings (%s, ...)" % ", ".join(names) if names else "a mapping of settings"
        return "expected %s, got %r" % (what, err.get("input"))
    if kind == "list_type":
        return "expected a list, got %r" % (err.get("input"),)
    return err["msg"].replace("Value error, ", "")


def format_errors(root, source, exc, flags=None):
    """One line naming every problem of ``exc`` (a pydantic ValidationError of ``root``).

    ``flags`` maps a dotted setting (``broker.port``) to the command-line flag and value that set it
    (``--port 70000``); a problem with such a setting is blamed on the flag. The line begins
    ``invalid configuration in <source>`` when any problem comes from the file (or the defaults).
    """
    flags = flags or {}
    from_file, from_flags = [], []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"])
        text = _describe(root, err)
        if where in flags:
            from_flags.append("%s: %s" % (flags[where], text))
        else:
            from_file.append("%s: %s" % (where, text) if where else text)
    if from_file:
        return "invalid configuration in %s: %s" % (source, "; ".join(from_flags + from_file))
    return "invalid %s" % "; ".join(from_flags)
