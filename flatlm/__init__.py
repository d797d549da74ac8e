"""flatlm: exact synthetic languages, masked-LM pre-training and the measurements that ask why
models with the same pre-training loss differ downstream.

The core (everything under ``flatlm`` but ``flatlm.tracking.tracker``) imports neither Ray
nor MLflow.
"""

__version__ = "0.1.0"
