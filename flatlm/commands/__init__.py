"""Subcommands of the flatlm command line (see flatlm.cli)."""
