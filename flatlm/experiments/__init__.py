"""The paper's claims as runnable experiments, without Ray or MLflow.

- ``scales``: where an experiment runs: ``tiny`` (a CPU, minutes) or ``gpu`` (the paper's sizes).
- ``protocols``: how it is run and measured: ``paper`` (the paper's text), ``paper-code`` (the
  released code) and single switches between them (``paper+inside-labels``) for the diagnosis.
- ``experiments``: one experiment per claim (steps, sizes, algorithms, sgd), each a base trial
  config and a grid of variants.
- ``runner``: runs an experiment's trials one after another into trial directories, resumably,
  within a time budget (``flatlm replicate``; ``sweeps/replicate.py`` runs the same trials on Ray).
- ``invariance``: which measures survive function-preserving reparameterisations (issue 54;
  ``bench/invariance.py``, ``tests/measure/test_invariance.py``).
- ``section5``: Theorem 5.1 on Dyck: fits of the masked-LM loss, their exact Tr H and how well
  their features give g* (``bench/dyck_section5.py``).
"""
