"""The searches for a CPU testbed: a random grammar, a model grid and a recipe on which the paper's
precondition holds, chosen against criteria fixed before any claim was read.

- ``first``: the first search's definition (issue 23: ``CRITERIA``, grammar families, model grids,
  training settings, measurement settings); it chose the ``testbed`` scale.
- ``second``: testbed v2's definition (issue 38: tasks of the paper's kind and difficulty).
- ``trials``: what a search runs on one candidate: the screen (no training), a learning run, a
  trial of an experiment as the replication runs it, the scale a candidate stands for.
- ``pool``: runs those on one-thread processes, saving each row as it ends.

The verdicts and tables over their rows are ``analysis.testbed_search`` and
``analysis.testbed_v2``; the command lines, ``bench/testbed_search.py`` and ``bench/testbed_v2.py``.
"""
