"""Subcommands of the flatlm command line (see flatlm.cli)."""

# Exit statuses every command shares (flatlm.cli ends these outcomes for all of them).
DIVERGED_EXIT = 3  # training stopped by flatlm.train.run.Diverged (flatlm replicate: a trial
#   diverged, recorded and skipped; the others ran)
WRITE_FAILED_EXIT = 5  # a checkpoint could not be written (disk full); the earlier ones intact
