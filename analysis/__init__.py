"""Analysis of a sweep: MLflow runs -> tidy table (``runs``), correlations in the saturation
regime (``correlate``), the paper's figures and tables (``figures``), and a CLI (``report``).

Reads MLflow and the trial files only; no training code. MLflow is read through
``flatlm.tracking.reader`` (``runs``, ``store``): no module here imports it.
"""
