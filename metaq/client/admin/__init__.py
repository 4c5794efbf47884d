"""``metaq-admin``'s commands, one module per feature, composed by ``metaq/admincli.py`` (which adds each parser
and runs it beside its own generic commands: stats, topics, groups, offset-at, promote ...).

    tools.py     ``put`` and ``tail`` (messages in and out from a shell), and what every command shares: the exit
                 codes and AdminExit, a partition named on the command line, the brokers asked in turn until one
                 has it (ask_brokers: 404 is "not here")
    dlq.py       ``dlq list|resend``: a RocketMQ group's dead letters, dlq_list / dlq_resend to every broker
    offsets.py   ``reset-offsets``: a group's offsets moved (a dry run unless ``--execute``)
    timers.py    ``timers list|cancel``: every broker's pending timers, one cancelled
    topics.py    ``topics [list|create|alter|delete]``: a change sent to every broker of the view
    groups.py    ``group-settings [list|show|set|delete]``: a group's settings, sent to every broker of the view
    trace.py     ``trace ID | --key KEY``: where a message went, every broker asked
    clients.py   ``clients stack|verify``: a connected gRPC client asked for its threads or to verify a message

In the client's folder, not the features', for the reason metaq/client/__init__.py gives: the client imports the
features' codecs, so nothing in a feature package may import the client.
"""
