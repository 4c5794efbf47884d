"""Admin operations: a consumer group's live members and broker-kept offsets, offset resets, dead letters listed
and resent (docs/operating.md "Admin commands"), and the parts of ``metaq-admin``, the command line that looks at a
cluster, composed in ``metaq/admincli.py``.

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
client (the client layer)
    client.py    ``metaq-admin dlq list|resend``: dlq_list / dlq_resend sent to every broker, their answers shown
    tools.py     ``metaq-admin put`` and ``tail`` (messages in and out from a shell), and what the CLI's commands
                 share: their exit codes and AdminExit, a partition named on the command line, the brokers
                 asked in turn until one has it (ask_brokers: 404 is "not here")

Other features' ``metaq-admin`` commands live with their feature (``timers/cli.py``, ``topics/cli.py``,
``offsets/cli.py``); ``metaq/admincli.py`` (the command line's composition, its generic commands, above this
package and the features) adds their parsers and runs them.
"""
