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

from . import distributed, implicit, linear_solve
from . import engine as engine  # the public way to write an optimizer: funcopt.engine
from ._src import _moved
from ._src import catalogue as _catalogue
from ._src.algorithms.adadelta import AdadeltaState, adadelta
from ._src.algorithms.adafactor import AdafactorState, adafactor
from ._src.algorithms.adagrad import AdagradState, adagrad
from ._src.algorithms.adam import AdamState, AdamWState, adam, adamw
from ._src.algorithms.adamax import AdamaxState, adamax
from ._src.algorithms.asgd import ASGDState, asgd
from ._src.algorithms.catalogue_more import (
    AdEMAMixState,
    AdoptState,
    LarsState,
    MADGRADState,
    NAdamWState,
    NovoGradState,
    SignumState,
    YogiState,
)
from ._src.algorithms.lamb_adan import AdaBeliefState, AdanState, LambState
from ._src.algorithms.lbfgs import LBFGSState, lbfgs
from ._src.algorithms.lion import LionState
from ._src.algorithms.muon import MuonState, muon
from ._src.algorithms.nadam import NAdamState, nadam
from ._src.algorithms.radam import RAdamState, radam
from ._src.algorithms.rmsprop import RMSpropState, rmsprop
from ._src.algorithms.rprop import RpropState, rprop
from ._src.algorithms.sgd import SGDState, sgd
from ._src.algorithms.sparse_adam import SparseAdamState, sparse_adam
from ._src.catalogue import *  # noqa: F403
from ._src.core import public as _public
from ._src.core.base import (
    EmptyState,
    GradientTransformation,
    MaskedNode,
    Params,
    State,
    Updates,
    apply_updates,
    chain,
)
from ._src.core.hyperparams import ScheduledState
from ._src.engine.algorithm import Algorithm, Bound, Check
from ._src.engine.leaves import AtFirstStep
from ._src.meta import inner_loop
from ._src.scan_loop import scan_inner_loop
from ._src.torch import catalogue_classes as _catalogue_classes
from ._src.torch.adam_classes import Adam, AdamW, RAdam, SparseAdam
from ._src.torch.adapter import Optimizer
from ._src.torch.catalogue_classes import *  # noqa: F403
from ._src.torch.catalogue_inplace import (
    MADGRAD,
    AdEMAMix,
    Adopt,
    Lars,
    NAdamW,
    NovoGrad,
    Signum,
    Yogi,
)
from ._src.torch.classes import (
    ASGD,
    SGD,
    Adadelta,
    Adafactor,
    Adagrad,
    Adamax,
    Lion,
    Muon,
    NAdam,
    RMSprop,
    Rprop,
)
from ._src.torch.convert import functional_state, load_functional_state
from ._src.torch.distance_classes import DAdaptAdamW, Prodigy
from ._src.torch.lamb_adan_classes import AdaBelief, Adan, Lamb
from ._src.torch.lbfgs import LBFGS

# wt-64a: state_dicts in the format of the packages the drop-in classes follow
from ._src.torch.package_state import package_state_dict
from ._src.torch.schedule_free import AdamWScheduleFree, RAdamScheduleFree, SGDScheduleFree
from ._src.transforms import blocks as _transforms
from ._src.transforms import inject as _inject
from ._src.transforms import lookahead as _lookahead
from ._src.transforms import moments as _moments
from ._src.transforms import schedule_free as _schedule_free
from ._src.transforms import schedules as _schedules
from ._src.transforms import wrappers as _wrappers
from ._src.transforms.blocks import *  # noqa: F403
from ._src.transforms.clipping import clip_by_global_norm
from ._src.transforms.inject import *  # noqa: F403
from ._src.transforms.lookahead import *  # noqa: F403
from ._src.transforms.masking import MaskedState, masked, partition
from ._src.transforms.moments import *  # noqa: F403
from ._src.transforms.schedule_free import *  # noqa: F403
from ._src.transforms.schedules import *  # noqa: F403  (each module lists its names in its __all__)
from ._src.transforms.wrappers import *  # noqa: F403

__version__ = "0.1.0"

__all__ = [
    "ASGD",
    "Algorithm",
    "AtFirstStep",
    "Bound",
    "Check",
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
    "Lion",
    "LionState",
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
    "ScheduledState",
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
    *_inject.__all__,
    *_lookahead.__all__,
    *_moments.__all__,
    *_schedule_free.__all__,
    # differentiable optimization at scale
    "distributed",
    "implicit",
    "linear_solve",
    "scan_inner_loop",
    # optax's catalogue
    *_catalogue.__all__,
    *_catalogue_classes.__all__,
    # schedule-free drop-in classes
    "AdamWScheduleFree",
    "RAdamScheduleFree",
    "SGDScheduleFree",
    # the catalogue's in-place drop-in classes, and their algorithms' states
    "AdaBelief",
    "AdaBeliefState",
    "Adan",
    "AdanState",
    "DAdaptAdamW",
    "Lamb",
    "LambState",
    "Prodigy",
    # issue 64: the catalogue's other classes on the in-place path, and their states
    "AdEMAMix",
    "AdEMAMixState",
    "Adopt",
    "AdoptState",
    "Lars",
    "LarsState",
    "MADGRAD",
    "MADGRADState",
    "NAdamW",
    "NAdamWState",
    "NovoGrad",
    "NovoGradState",
    "Signum",
    "SignumState",
    "Yogi",
    "YogiState",
    # wt-64a: state_dicts in the format of the packages the drop-in classes follow
    "package_state_dict",
]


_moved.install()  # old module paths, for pickles made before the layers (first: it reads them)
_public.publish(globals(), __all__)  # pickles name funcopt.AdamState, funcopt.adam(...)
