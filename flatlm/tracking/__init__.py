"""Tracking: ``tracker`` writes runs to MLflow and ``reader`` reads a store, the only two modules
of the repository that import MLflow (``tests/test_architecture.py``); ``ledger`` keeps what
reached it, so that an outage delays metrics and loses none."""
