"""Admin operations: a consumer group's live members and broker-kept offsets, offset resets, dead letters listed
and resent (docs/operating.md "Admin commands"): the broker's side of ``metaq-admin``, the command line that looks
at a cluster (its commands are the client's, below).

A feature package: every module of the feature is here, named by its role, and each role is a layer's
(``tests/test_layers.py`` FEATURE_ROLES, docs/architecture.md "Feature packages"). A module imports what its
layer may, and of this package only modules of its own role's layer or a lower one.

codec (the protocol layer: bytes in, values out; no socket, log or clock)
    wire.py      the group_info / reset_offset / dlq_list / dlq_resend text commands: events, parsers, serializers,
                 their registration in ``protocol.commands`` (``metaq.textcommands`` lists it, so the registry is
                 complete), the JSON reply body
service (the server layer: gevent)
    service.py   AdminOps: a group's live members and offsets, offset resets, dead letters listed and resent (the
                 resent journals only it writes); TextGroupMembers: the text connections using broker-kept offsets
front-end (the server layer: a front-end's handlers)
    text.py      the text handlers of the four commands: the admin permission, AdminOps, a JSON body
    http.py      the HTTP port's admin routes over AdminOps and TopicAdmin (offsets, dead letters, the topic table)
The client's side is in metaq/client/, which imports the features and none imports it: ``metaq-admin``'s commands
(``dlq``, ``put`` and ``tail``, and every other feature's) in ``client/admin/``, one module per feature, and what
they share in ``client/admin/tools.py``; ``metaq/admincli.py`` (the command line's composition, its generic
commands) adds their parsers and runs them.
"""
