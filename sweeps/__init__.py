"""Ray Tune sweeps over flatlm trials: the scripts (``python sweeps/scaling.py``) are thin
entry points over this package (cli, driver, spec, trainable, summary)."""
