"""The loss landscape around a checkpoint beyond its curvature: adaptive and critical sharpness,
preconditioned sharpness from the optimizer's state, weight-noise robustness, the local learning
coefficient and loss barriers between models."""
