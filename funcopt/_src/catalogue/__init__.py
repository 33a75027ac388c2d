"""optax's catalogue beyond torch.optim: its blocks, aliases and contrib optimizers
(optax's names, arguments and math), each alias a `chain` of public blocks."""

from . import accumulators as _accumulators
from . import adaptive as _adaptive
from . import aliases as _aliases
from . import blocks as _blocks
from . import combinators as _combinators
from . import contrib as _contrib
from . import dog as _dog
from . import lbfgs_scaling as _lbfgs_scaling
from . import linesearch as _linesearch
from . import scaling as _scaling
from . import second_order as _second_order
from . import zoom_linesearch as _zoom_linesearch
from .accumulators import *  # noqa: F403
from .adaptive import *  # noqa: F403
from .aliases import *  # noqa: F403
from .blocks import *  # noqa: F403
from .combinators import *  # noqa: F403
from .contrib import *  # noqa: F403
from .dog import *  # noqa: F403
from .lbfgs_scaling import *  # noqa: F403
from .linesearch import *  # noqa: F403
from .scaling import *  # noqa: F403
from .second_order import *  # noqa: F403
from .zoom_linesearch import *  # noqa: F403

__all__ = [
    *_accumulators.__all__,
    *_adaptive.__all__,
    *_aliases.__all__,
    *_blocks.__all__,
    *_combinators.__all__,
    *_contrib.__all__,
    *_dog.__all__,
    *_lbfgs_scaling.__all__,
    *_linesearch.__all__,
    *_scaling.__all__,
    *_second_order.__all__,
    *_zoom_linesearch.__all__,
]
