"""funcopt: optimizers as pure functions for PyTorch, and drop-in torch.optim classes.

Functional API (``init``/``update`` over pytrees, composable with ``torch.func``)::

    import funcopt as fo
    tx = fo.nadam(lr=2e-3)
    state = tx.init(params)
    updates, state = tx.update(grads, state, params)
    params = fo.apply_updates(params, updates)

Stateful API (subclasses of ``torch.optim.Optimizer``)::

    opt = fo.NAdam(model.parameters(), lr=2e-3)
"""

from ._src import schedules as _schedules
from ._src import transforms as _transforms
from ._src import wrappers as _wrappers
from ._src.adadelta import Adadelta, AdadeltaState, adadelta
from ._src.adafactor import Adafactor, AdafactorState, adafactor
from ._src.adagrad import Adagrad, AdagradState, adagrad
from ._src.adam import Adam, AdamState, AdamW, AdamWState, adam, adamw
from ._src.adamax import Adamax, AdamaxState, adamax
from ._src.adapter import Optimizer
from ._src.asgd import ASGD, ASGDState, asgd
from ._src.base import (
    EmptyState,
    GradientTransformation,
    MaskedNode,
    Params,
    State,
    Updates,
    apply_updates,
    chain,
)
from ._src.clipping import clip_by_global_norm
from ._src.convert import functional_state, load_functional_state
from ._src.lbfgs import LBFGS, LBFGSState, lbfgs
from ._src.masking import MaskedState, masked, partition
from ._src.meta import inner_loop
from ._src.muon import Muon, MuonState, muon
from ._src.nadam import NAdam, NAdamState, nadam
from ._src.radam import RAdam, RAdamState, radam
from ._src.rmsprop import RMSprop, RMSpropState, rmsprop
from ._src.rprop import Rprop, RpropState, rprop
from ._src.schedules import *  # noqa: F403  (each module lists its names in its __all__)
from ._src.sgd import SGD, SGDState, sgd
from ._src.sparse_adam import SparseAdam, SparseAdamState, sparse_adam
from ._src.transforms import *  # noqa: F403
from ._src.wrappers import *  # noqa: F403

# isort: split
# --- optax's catalogue (issue 64): blocks, aliases, contrib optimizers, their classes
from ._src import catalogue as _catalogue
from ._src.catalogue import *  # noqa: F403

# --- end of optax's catalogue

__version__ = "0.1.0"

__all__ = [
    "ASGD",
    "ASGDState",
    "Adadelta",
    "AdadeltaState",
    "Adafactor",
    "AdafactorState",
    "Adagrad",
    "AdagradState",
    "Adam",
    "AdamState",
    "AdamW",
    "AdamWState",
    "Adamax",
    "AdamaxState",
    "EmptyState",
    "GradientTransformation",
    "LBFGS",
    "LBFGSState",
    "MaskedNode",
    "MaskedState",
    "Muon",
    "MuonState",
    "NAdam",
    "NAdamState",
    "Optimizer",
    "Params",
    "RAdam",
    "RAdamState",
    "RMSprop",
    "RMSpropState",
    "Rprop",
    "RpropState",
    "State",
    "SGD",
    "SGDState",
    "SparseAdam",
    "SparseAdamState",
    "Updates",
    "adadelta",
    "adafactor",
    "adagrad",
    "adam",
    "adamax",
    "adamw",
    "apply_updates",
    "asgd",
    "chain",
    "clip_by_global_norm",
    "functional_state",
    "inner_loop",
    "lbfgs",
    "load_functional_state",
    "masked",
    "muon",
    "nadam",
    "partition",
    "radam",
    "rmsprop",
    "rprop",
    "sgd",
    "sparse_adam",
    *_schedules.__all__,
    *_transforms.__all__,
    *_wrappers.__all__,
    # --- optax's catalogue (issue 64)
    *_catalogue.__all__,
]
