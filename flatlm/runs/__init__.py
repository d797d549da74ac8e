"""The trial (train + measure at every checkpoint -> report) and what it prints: progress, the
headline and the closing lines. Run storage is ``flatlm.storage``."""
