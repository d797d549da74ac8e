"""Runs a search's jobs on one-thread processes: the cost a search records is the CPU time of a
one-thread trial, and two such processes share a 2-core machine without contending."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch
from tqdm.auto import tqdm


def one_thread() -> None:
    """Each worker's initialiser (and the caller's, run inline): torch on one thread."""
    torch.set_num_threads(1)


def run_all(jobs: int, fn: Callable, items: list, desc: str,
            on_result: Callable | None = None) -> list:
    """fn(item) for every item in ``jobs`` one-thread processes (inline when ``jobs`` <= 1), with
    a progress bar; results in the items' order; ``on_result(row)`` as each ends (a search saves
    as it goes). ``fn`` is pickled to the workers: a module-level function or a partial of one."""
    on_result = on_result or (lambda row: None)
    out = [None] * len(items)
    if jobs <= 1:
        one_thread()
        for k, item in enumerate(tqdm(items, desc=desc)):
            out[k] = fn(item)
            on_result(out[k])
        return out
    with ProcessPoolExecutor(max_workers=jobs, initializer=one_thread) as pool:
        futures = {pool.submit(fn, item): k for k, item in enumerate(items)}
        for f in tqdm(as_completed(futures), total=len(items), desc=desc):
            out[futures[f]] = f.result()
            on_result(out[futures[f]])
    return out
