"""optax's catalogue beyond torch.optim: its blocks, aliases and contrib optimizers
(optax's names, arguments and math), each alias a `chain` of public blocks."""

from . import blocks as _blocks
from .blocks import *  # noqa: F403

__all__ = [
    *_blocks.__all__,
]
