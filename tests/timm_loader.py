"""timm's optimizer classes, loaded from its ``timm/optim`` modules alone: ``import timm``
imports torchvision (whose PyPI wheel is built for a CUDA torch), which these modules do
not use. Install timm with ``pip install --no-deps timm==1.0.31`` (as CI does). For the
tests (test_timm_reference.py) and the benchmarks (catalogue_step.py)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

CLASSES = {
    "Lamb": "lamb",
    "Lars": "lars",
    "Lion": "lion",
    "Adan": "adan",
    "AdaBelief": "adabelief",
    "MADGRAD": "madgrad",
    "NvNovoGrad": "nvnovograd",
    "NAdamW": "nadamw",
    "Adopt": "adopt",
}
"""timm's class -> its module in ``timm.optim``."""


def timm_optimizers() -> types.SimpleNamespace | None:
    """timm's optimizer classes (`CLASSES`) as attributes, or None without timm."""
    spec = importlib.util.find_spec("timm")  # (finds the package without running its __init__)
    if spec is None or not spec.submodule_search_locations:
        return None
    root = list(spec.submodule_search_locations)[0]
    stubs = {"timm": root, "timm.optim": os.path.join(root, "optim")}
    saved = {name: sys.modules.get(name) for name in stubs}
    for name, path in stubs.items():  # packages whose __init__ is not run
        package = types.ModuleType(name)
        package.__path__ = [path]
        sys.modules[name] = package
    try:
        return types.SimpleNamespace(
            **{
                cls: getattr(importlib.import_module(f"timm.optim.{module}"), cls)
                for cls, module in CLASSES.items()
            }
        )
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
