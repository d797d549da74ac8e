"""Run storage and the trial: a run directory's writer lock, manifest and metrics log, and
``trial`` (train + measure at every checkpoint -> report)."""
