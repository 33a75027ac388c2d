"""The catalogue's drop-in classes against timm's optimizers, where timm is installed (CI
installs it without its dependencies: only its optimizer modules are loaded). funcopt's
classes follow optax; the algorithm pages (docs/algorithms/lamb.md, lars.md, madgrad.md, novograd.md,
adabelief.md, adan.md) say with which of timm's options the two agree, and these tests
check those claims (float64, 20 steps, relative to the distance travelled)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import torch
from timm_loader import timm_optimizers

import funcopt as fo

timm_optim = timm_optimizers()
if timm_optim is None:
    pytest.skip("timm is not installed (pip install --no-deps timm==1.0.31)", allow_module_level=True)

STEPS = 20


def run(make: Callable[[list[torch.nn.Parameter]], Any]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    params = [
        torch.nn.Parameter(torch.randn(s, generator=g, dtype=torch.float64)) for s in [(3, 4), (4,), (2, 3)]
    ]
    start = [p.detach().clone() for p in params]
    opt = make(params)
    for step in range(STEPS):
        g = torch.Generator().manual_seed(10 + step)
        targets = [torch.randn(p.shape, generator=g, dtype=torch.float64) for p in params]
        opt.zero_grad()
        (sum(((p - t) ** 2).sum() for p, t in zip(params, targets)) / 2).backward()
        opt.step()
    return [p.detach() for p in params], start


def difference(ours: Callable[..., Any], theirs: Callable[..., Any]) -> float:
    """The largest difference of the params after STEPS, over the largest distance moved."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (a, start), (b, _) = run(ours), run(theirs)
    moved = max(float((y - x).abs().max()) for y, x in zip(b, start))
    return max(float((x - y).abs().max()) for x, y in zip(a, b)) / moved


AGREE = {  # funcopt's class, timm's with the options under which the two agree, tolerance
    "Lamb, weight decay, no clipping": (
        lambda p: fo.Lamb(p, lr=0.01, weight_decay=0.1),
        lambda p: timm_optim.Lamb(p, lr=0.01, weight_decay=0.1, max_grad_norm=None),
        1e-12,
    ),
    "Lamb, always_adapt": (
        lambda p: fo.Lamb(p, lr=0.01),
        lambda p: timm_optim.Lamb(p, lr=0.01, weight_decay=0.0, max_grad_norm=None, always_adapt=True),
        1e-12,
    ),
    "Lars, no weight decay": (
        lambda p: fo.Lars(p, lr=0.1),
        lambda p: timm_optim.Lars(p, lr=0.1, momentum=0.9, eps=0.0, always_adapt=True),
        1e-12,
    ),
    "MADGRAD": (lambda p: fo.MADGRAD(p, lr=0.01), lambda p: timm_optim.MADGRAD(p, lr=0.01), 1e-12),
    "MADGRAD, weight decay": (
        lambda p: fo.MADGRAD(p, lr=0.01, weight_decay=0.1),
        lambda p: timm_optim.MADGRAD(p, lr=0.01, weight_decay=0.1),
        1e-12,
    ),
    "AdaBelief, not rectified": (
        lambda p: fo.AdaBelief(p, lr=0.01),
        lambda p: timm_optim.AdaBelief(p, lr=0.01, rectify=False),
        1e-12,
    ),
    # timm keeps NovoGrad's second moment as a float32 scalar
    "NovoGrad": (
        lambda p: fo.NovoGrad(p, lr=0.01, betas=(0.95, 0.98), eps=1e-8),
        lambda p: timm_optim.NvNovoGrad(p, lr=0.01),
        1e-6,
    ),
}

DIFFER = {  # where the pages say the two differ (more than `at least`)
    "Lamb defaults (timm clips the gradients' norm, decays 0.01)": (
        lambda p: fo.Lamb(p, lr=0.01),
        lambda p: timm_optim.Lamb(p, lr=0.01),
        1e-3,
    ),
    "Lars with weight decay (timm's trust-ratio denominator)": (
        lambda p: fo.Lars(p, lr=0.1, weight_decay=0.01),
        lambda p: timm_optim.Lars(p, lr=0.1, momentum=0.9, weight_decay=0.01, eps=0.0),
        1e-4,
    ),
    "Adan (optax weights the gradient difference by 1 - b2)": (
        lambda p: fo.Adan(p, lr=0.01, eps_root=0.0),
        lambda p: timm_optim.Adan(p, lr=0.01, no_prox=True),
        0.1,
    ),
    "AdaBelief rectified (timm's default)": (
        lambda p: fo.AdaBelief(p, lr=0.01),
        lambda p: timm_optim.AdaBelief(p, lr=0.01),
        0.1,
    ),
}


@pytest.mark.parametrize("case", list(AGREE))
def test_agrees_with_timm(case):
    ours, theirs, tol = AGREE[case]
    assert difference(ours, theirs) < tol


@pytest.mark.parametrize("case", list(DIFFER))
def test_differs_from_timm_where_documented(case):
    ours, theirs, at_least = DIFFER[case]
    assert difference(ours, theirs) > at_least
