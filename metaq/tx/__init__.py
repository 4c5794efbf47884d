"""tx layer (see DESIGN §2, §7): transaction branches and their journal.

``records`` (journal record codec and replay), ``journal`` (the files: append,
fdatasync, torn tails, checkpoints), ``manager`` (``TransactionManager``: the
state machine, recovery, commit into the store).
"""
