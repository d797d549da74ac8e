"""The ground floor: the config engine (one ``--set`` key space), seeds, statistics, the token
layout, learning-rate schedules, devices, writes that never follow a link (``safe_io``) and sizes
checked against the memory available (``memory``). Imports nothing of flatlm above it."""
