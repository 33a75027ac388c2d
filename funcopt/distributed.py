"""Meta-learning over processes: `all_reduce_mean` for meta-gradients, `unshard` for
FSDP2-sharded params in a functional inner loop."""

from ._src.distributed import all_reduce_mean, unshard

__all__ = ["all_reduce_mean", "unshard"]
