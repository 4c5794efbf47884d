"""A configuration's validation errors as one line a newcomer can act on.

pydantic speaks of its own types ("Input should be a valid dictionary or instance of BrokerSection");
this module says the same in the file's terms ("broker: expected a mapping of settings (id, host,
port, ...), got 8141"), and blames a bad value on the command-line flag that gave it (``--port 70000``)
rather than on the file or the defaults it overrode. An unknown key names the nearest valid one
("store.flsuh: unknown setting; did you mean `flush`?").
"""

import difflib
import typing

from pydantic import BaseModel

#: Setting names shown when a section was given as a scalar (the first few, then "...").
SHOWN_SETTINGS = 3
#: How alike an unknown key and a valid one must be to be suggested (difflib's ratio, 0..1).
SUGGEST_CUTOFF = 0.6
#: The longest key a suggestion is looked for (longer ones are not a typo of a setting; bounds the work).
SUGGEST_MAX_KEY = 64


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


def _unknown_key(root, loc):
    """The message for a key no setting has: ``unknown setting; did you mean `flush`?``.

    The suggestion is the valid key of the same mapping nearest to the unknown one (difflib), if any is near
    enough (``SUGGEST_CUTOFF``); failing that, at the top level or in a section, the sections that have a
    setting of exactly that name (a key written in the wrong place). Without either, the message is the first part
    alone."""
    what = "unknown section" if len(loc) == 1 else "unknown setting"
    key = loc[-1]
    if not isinstance(key, str) or len(key) > SUGGEST_MAX_KEY:
        return what
    parent = _section_at(root, loc[:-1])
    valid = list(parent.model_fields) if parent is not None else []
    close = difflib.get_close_matches(key, valid, n=1, cutoff=SUGGEST_CUTOFF)
    if close:
        return "%s; did you mean `%s`?" % (what, close[0])
    if len(loc) > 2:
        return what
    owners = ["`%s:`" % name for name, field in root.model_fields.items()
              if name != loc[0] and key in getattr(_model_in(field.annotation), "model_fields", {})]
    if owners:
        return "%s; `%s` is a setting of %s" % (what, key, " or ".join(owners))
    return what


def _describe(root, err):
    """pydantic's message for one error, in the file's terms where it has a clearer one."""
    kind = err.get("type")
    if kind == "extra_forbidden" and err.get("loc"):
        return _unknown_key(root, err["loc"])
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
