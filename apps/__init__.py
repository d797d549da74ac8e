"""Programs built on the library, not part of it (lingua's split: the library in ``lingua/``, its
programs in ``apps/`` beside it). Each folder is one program: ``testbed_search``, the searches for
a CPU testbed (its definitions, runs and verdicts; ``bench/testbed_search.py`` and
``bench/testbed_v2.py`` are its command lines). A program may import ``flatlm`` and
``analysis``; the library (``flatlm``), ``sweeps`` and ``analysis`` never import ``apps``
(``tests/test_architecture.py``), so what a program needs and the library does not stays here.
"""
