"""Tracking: ``tracker`` is the only module of flatlm that imports MLflow; ``ledger`` keeps what
reached it, so that an outage delays metrics and loses none."""
