"""torch: the torch.optim face (the drop-in `Optimizer` classes, checkpoint conversion, the
fused and in-place chain steps). It may import every other layer; nothing imports it but
the package root."""
