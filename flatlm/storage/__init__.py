"""Run storage: a run directory's writer lock, manifest, metrics log and divergence record.

Below ``flatlm.train`` and ``flatlm.models`` (both write run directories), above ``flatlm.core``
only; the trial that uses training lives in ``flatlm.runs``."""
