"""Analysis of a sweep: MLflow runs -> tidy table (``runs``), correlations in the saturation
regime (``correlate``), the paper's figures and tables (``figures``), and a CLI (``report``).

Reads MLflow and the trial files only; no training code. ``runs`` is the only module here that
imports MLflow.
"""
