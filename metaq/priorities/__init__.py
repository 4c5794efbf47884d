"""Consumer priorities: ``put_prio`` (a message put to a level of a priority topic) and ``get_prio`` (the records
of the one level the broker chooses) (docs/messaging.md "Priorities").

A priority topic (``metaq-admin topics create <t> --priorities L``) has levels 0..L-1, L-1 the highest; level 0 is
the topic itself, level k >= 1 the internal topic ``<topic>%P<k>``. The topic table keeps the setting
(``store/topics.py``), the put path stores a put in its level (``PutPath.append(priority=)``), and the remoting port
reads RocketMQ's ``PRIORITY`` property; those stay with their owners.

A feature package: every module of the feature is here, named by its role, and each role is a layer's
(``tests/test_layers.py`` FEATURE_ROLES, docs/architecture.md "Feature packages"). A module imports what its
layer may, and of this package only modules of its own role's layer or a lower one.

codec (the protocol layer: bytes in, values out; no socket, log or clock)
    wire.py      the levels' names, the put_prio / get_prio text commands: parsers, serializers, their registration in
                 ``protocol.commands`` (``metaq.textcommands`` lists it, so the registry is complete); the
                 reply's level;
                 ``choose_level``, the level a get_prio serves (times passed in)
front-end (the server layer: a front-end's handlers)
    text.py      the text handlers of put_prio and get_prio
The client's side (a priority topic's partition fetcher: one offset per level, get_prio, the expects of each level)
is in ``client/priorities.py`` (the client imports the features and none imports it).
"""
