"""Subcommands of the flatlm command line (see flatlm.cli)."""

import argparse

# Every command (a module of this package), in the order ``flatlm --help`` lists them, with the
# line it shows there (its module's ``register`` reads it here). flatlm.cli lists the commands
# it was not asked to run by these lines alone, without importing their modules: ``flatlm
# --help`` and a command that needs no torch (``flatlm ui``) start without torch and transformers.
COMMANDS = {
    "data": "sample corpora and measure source entropy",
    "train": "pre-train a masked LM",
    "trial": "run one trial: train + measure (no Ray)",
    "config": "print a trial's resolved config and where each value comes from",
    "measure": "measure a checkpoint (loss, KL, flatness, probes)",
    "grow": "embed a BERT checkpoint into a wider / deeper one with the same function",
    "replicate": "run the paper's experiments (no Ray)",
    "ui": "MLflow's UI, opened at a sweep's runs table",
}

# Exit statuses every command shares (flatlm.cli ends these outcomes for all of them).
DIVERGED_EXIT = 3  # training stopped by flatlm.train.run.Diverged (flatlm replicate: a trial
#   diverged, recorded and skipped; the others ran)
WRITE_FAILED_EXIT = 5  # a checkpoint could not be written (disk full); the earlier ones intact
WORKER_DIED_EXIT = 6  # a process beside the work was killed (flatlm.core.workers.WorkerDied, a
#   worker of flatlm replicate --jobs); the checkpoints are intact and a rerun resumes

# The one default of each option that several commands take (the flatlm commands and the sweep
# scripts alike; tests/commands/test_option_defaults.py holds every parser to them).
DEFAULT_SCALE = "sweep"  # flatlm.experiments.scales.SWEEP: the CPU scale the no-argument sweeps
#   run (the testbed's grammar and models, about 10 minutes on 2 cores)
DEFAULT_PROTOCOL = "paper"  # flatlm.experiments.protocols: the paper's text
DEFAULT_DEVICE = "cpu"  # CPU everywhere by default (docs: DESIGN); auto picks CUDA where present


def add_command(subparsers, name: str, doc: str) -> argparse.ArgumentParser:
    """The parser of command ``name``: its line of ``COMMANDS`` in ``flatlm --help``, the first
    paragraph of ``doc`` (its module's docstring) above its options and the rest below them."""
    return subparsers.add_parser(name, help=COMMANDS[name], description=doc.split("\n\n")[0],
                                 epilog=doc.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
