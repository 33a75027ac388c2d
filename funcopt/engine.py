"""Write your own optimizer: the ops protocol its math is written against, and the helpers
for that math and its per-step scalars. `funcopt.Algorithm` (with `funcopt.Bound`) turns
the math into the pure factory, the in-place torch.optim step, ``fused=True``, and the
torch.func behaviour at once; ``docs/adding-an-algorithm.md`` shows how, on Lion.
"""

from ._src.engine.algorithm import Hyperparams, registered
from ._src.engine.ops import Coef, Ops, at_least, counter_product, nonzero, power

__all__ = ["Coef", "Hyperparams", "Ops", "at_least", "counter_product", "nonzero", "power", "registered"]
