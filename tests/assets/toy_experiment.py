"""A toy experiment written as a user would add one: this file, named by ``--plugin``, and
nothing else (no list of experiment names edited).

"lr_pair": the scale's base trial (under the protocol asked for) at half and at twice its peak
learning rate, for every seed; ``flatlm replicate --plugin tests.assets.toy_experiment
--experiment lr_pair`` runs it like one of the paper's.
"""

from flatlm.experiments.paper import register_experiment


def lr_pair(sc, protocol, base, algorithms):
    """(base, grid, search space): the base as it is, its rate halved and doubled, no search."""
    return base, {"train.lr": [base.train.lr / 2, base.train.lr * 2]}, {}


register_experiment("lr_pair", lr_pair)
