"""The ground floor: the config engine (one ``--set`` key space), seeds, statistics, the token
layout, learning-rate schedules and devices. Imports nothing of flatlm above it."""
