"""The searches for a CPU testbed: a random grammar, a model grid and a recipe on which the paper's
precondition holds, chosen against criteria fixed before any claim was read. A program beside the
library (``apps``): nothing in ``flatlm`` imports it; the ``testbed`` scale it chose lives in
``flatlm.experiments.scales``.

- ``first``: the first search's definition (issue 23: ``CRITERIA``, grammar families, model grids,
  training settings, measurement settings); it chose the ``testbed`` scale.
- ``second``: testbed v2's definition (issue 38: tasks of the paper's kind and difficulty).
- ``trials``: what a search runs on one candidate: the screen (no training), a learning run, a
  trial of an experiment as the replication runs it, the scale a candidate stands for.
- ``jobs``: the first search's stage 2 and 3 jobs (a finalist's experiments, a scale's trials,
  the adversary's lambda).
- ``pool``: runs those on one-thread processes, saving each row as it ends.
- ``verdicts_first`` / ``verdicts_second``: each search's verdicts over its rows and its table.

The command lines are ``bench/testbed_search.py`` and ``bench/testbed_v2.py``.
"""
