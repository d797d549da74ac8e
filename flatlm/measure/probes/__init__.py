"""Downstream accuracy: the linear probes (batched, ridge, per-row), the lookup-table reference,
fine-tuning and GLUE."""
