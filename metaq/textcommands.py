"""The text protocol's whole command set: the one explicit list of the modules that declare text commands.

MetaQ's own commands and the core extensions are declared in ``metaq.protocol.text`` beside the parser, ``putb`` in
``metaq.protocol.putbatch``, and each feature's commands in its own wire module. Importing this module imports
each of them once, then completes the registry (``metaq.protocol.commands.complete``); the parser, the serializer,
the server's permission check and fast path read the table only after that. The registry and the parser import no
feature, so the import graph has no cycle; a feature with text commands adds its wire module here, and nowhere else.
It lives at the package root, above protocol/ and the feature packages, so that protocol/ imports no feature: the
features' wire modules import protocol/, and this list imports both.

Whatever parses or serializes text frames (the server's text front-end, the client, the deploy agent's probe)
imports this module once.
"""

from metaq.protocol import commands, putbatch, text
from metaq.admin import wire as admin_wire
from metaq.filters import wire as filters_wire
from metaq.groups import wire as groups_wire
from metaq.idempotence import wire as idempotence_wire
from metaq.keys import wire as keys_wire
from metaq.pop import wire as pop_wire
from metaq.priorities import wire as priorities_wire
from metaq.reqreply import wire as reqreply_wire
from metaq.timers import wire as timers_wire
from metaq.topics import wire as topics_wire
from metaq.trace import wire as trace_wire

#: Every module that declares text commands, in the order they register.
DECLARING_MODULES = (text, putbatch, admin_wire, filters_wire, groups_wire, idempotence_wire, keys_wire, pop_wire,
                     priorities_wire, reqreply_wire, timers_wire, topics_wire, trace_wire)

commands.complete()
