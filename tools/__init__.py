"""The ``polydev`` command and its subcommands."""
