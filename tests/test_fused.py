"""``fused=True`` on the CPU (funcopt/_src/torch/fused.py): every class's step as compiled kernels.

Each per-element class steps with ``fused=True`` as without it, to float rounding, over
steps where an LR scheduler changes the lr; SGD, Adam, AdamW and Adagrad as torch's own
fused classes too. A scheduler's new hyperparameters and the growing step count never
compile a new kernel. State dicts load both ways between fused and unfused optimizers,
and torch's classes. The errors are torch's, and say why where a class has no fused step.

Compiling costs a second or more per kernel: the tests share them (one configuration per
class, `HYPER`'s, float32), and kernels are kept for the whole process.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from helpers import ALGORITHMS, HYPER, assert_same, fo_cls, kwargs_of, matrices_only, steps_on_dense_gradients

import funcopt as fo
from funcopt._src.engine import inplace
from funcopt._src.torch import fused


@pytest.fixture(autouse=True)
def small_kernels(monkeypatch):
    """Compiled kernels for params of more than 8 elements (not 4096: the tests' params
    are small), the others stepped in the in-place step's chunks."""
    monkeypatch.setattr(inplace, "TINY", 8)


DENSE = [name for name in ALGORITHMS if steps_on_dense_gradients(name)]
TORCH_FUSED = ["Adagrad", "Adam", "AdamW", "SGD"]
STEPS = 6


def make_params(name: str) -> list[torch.nn.Parameter]:
    """A few params of different sizes; one transposed (its gradients and state too: the
    kernel steps it through a flat view of its memory); matrices for Muon."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(6, 5), (7,), (2, 3, 4)]
    if matrices_only(name):
        shapes = [(6, 5), (3, 4)]
    params = [torch.randn(s, generator=gen) for s in shapes]
    params.append(torch.randn(4, 6, generator=gen).t())
    return [torch.nn.Parameter(p) for p in params]


def train(
    opt: torch.optim.Optimizer, params: list[torch.nn.Parameter], steps: int = STEPS, seed: int = 1
) -> None:
    """`steps` steps on random gradients (shaped and strided as their params), the lr
    halved every other step by a scheduler."""
    gen = torch.Generator().manual_seed(seed)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(steps):
        for p in params:
            transposed = not p.is_contiguous()
            g = torch.randn(p.t().shape if transposed else p.shape, generator=gen).to(p.dtype)
            p.grad = g.t() if transposed else g
        opt.step()
        scheduler.step()


def run(name: str, cls: type | None = None, **flags) -> tuple[list[torch.Tensor], dict]:
    params = make_params(name)
    opt = (cls or fo_cls(name))(params, **kwargs_of(HYPER[name]), **flags)
    train(opt, params)
    return [p.detach() for p in params], opt.state_dict()


def without_fused(state_dict: dict) -> dict:
    groups = [{k: v for k, v in g.items() if k != "fused"} for g in state_dict["param_groups"]]
    return {**state_dict, "param_groups": groups}


def counters_float64(state_dict: dict) -> dict:
    """A state dict with its 0-d tensors (step counters: float32 where fused) as float64."""
    state = {
        i: {k: v.double() if isinstance(v, torch.Tensor) and v.dim() == 0 else v for k, v in s.items()}
        for i, s in state_dict["state"].items()
    }
    return {**state_dict, "state": state}


@pytest.mark.parametrize("name", DENSE)
def test_fused_steps_as_unfused(name):
    """The same params and state as the class's default step, to float rounding, with the
    lr changing; the counters are float32, as torch's fused classes keep them."""
    ours, ours_sd = run(name, fused=True)
    ref, ref_sd = run(name)
    compiled = {key[0].name for key in fused._KERNELS}
    # the per-element algorithms by kernels (torch's own for TORCH_FUSED, see
    # test_torch_kernels.py); Adafactor's and Muon's per-tensor math in place
    assert (name in compiled) == (name not in ("Adafactor", "Muon", *TORCH_FUSED)), (name, compiled)
    assert ours_sd["param_groups"][0]["fused"] is True
    steps = [s["step"] for s in ours_sd["state"].values() if "step" in s]
    assert all(s.dtype == torch.float32 for s in steps)
    assert_same(ours, ref)
    assert_same(counters_float64(without_fused(ours_sd)), counters_float64(without_fused(ref_sd)))


@pytest.mark.parametrize("name", ["Adam", "Adagrad", "RMSprop", "SGD"])
def test_fused_steps_in_bfloat16(name):
    """In bfloat16 the kernels compute in float32 and round once per stored tensor (as
    torch's fused kernels do), where the default step rounds after every op: both stay
    within bfloat16's rounding of the same steps run in float32."""
    runs = []
    for dtype, flags in ((torch.bfloat16, {"fused": True}), (torch.bfloat16, {}), (torch.float32, {})):
        params = [torch.nn.Parameter(p.detach().to(torch.bfloat16).to(dtype)) for p in make_params(name)]
        train(fo_cls(name)(params, **kwargs_of(HYPER[name]), **flags), params)
        assert all(p.dtype == dtype for p in params)
        runs.append([p.detach().float() for p in params])
    fused_run, default_run, exact = runs
    assert_same(fused_run, exact, rtol=2**-6, atol=2**-6)  # two ulps near 1
    assert_same(default_run, exact, rtol=2**-6, atol=2**-6)


@pytest.mark.parametrize("name", TORCH_FUSED)
def test_fused_steps_as_torchs_fused(name):
    (ours, ours_sd), (ref, ref_sd) = run(name, fused=True), run(name, getattr(torch.optim, name), fused=True)
    assert_same(ours, ref)
    assert_same(ours_sd, ref_sd)


def test_no_recompiles_as_hyperparameters_change_and_steps_go_by():
    """A scheduler's lr, new betas, eps and weight decay (nonzero to nonzero) and the
    growing step count run the kernels already compiled, without a recompile."""
    params = make_params("Adam")
    opt = fo.Adam(params, lr=0.1, weight_decay=0.1, fused=True)
    train(opt, params, steps=2)
    kernels, graphs = len(fused._KERNELS), torch._dynamo.utils.counters["stats"]["unique_graphs"]
    group = opt.param_groups[0]
    group.update(betas=(0.8, 0.95), eps=1e-3, weight_decay=0.01)
    train(opt, params, steps=5, seed=2)
    assert (len(fused._KERNELS), torch._dynamo.utils.counters["stats"]["unique_graphs"]) == (kernels, graphs)
    assert opt.state[params[0]]["step"] == 7


def test_a_param_of_one_element_or_none(monkeypatch):
    """0-d params and params of one element (which the dynamic kernel compiles apart for)
    and empty ones step as without fused, also by a compiled kernel."""
    monkeypatch.setattr(inplace, "TINY", -1)

    def scenario(**flags):
        params = [torch.nn.Parameter(torch.tensor(v)) for v in (1.5, [2.0], [])] + make_params("Adam")
        opt = fo.Adam(params, lr=0.1, **flags)
        for i in range(3):
            for p in params:
                p.grad = torch.full_like(p, 0.5 - i)
            opt.step()
        return [p.detach() for p in params], counters_float64(without_fused(opt.state_dict()))

    assert_same(scenario(fused=True), scenario())


@pytest.mark.parametrize("name", ["Adam", "NAdam"])
def test_state_dict_loads_between_fused_unfused_and_torch(name):
    """A fused optimizer's state dict loads into the unfused class and into torch's class,
    and theirs into the fused one; each then steps on as the one it was saved from."""
    torch_fused = {"fused": True} if name in TORCH_FUSED else {}
    cls, torch_cls = fo_cls(name), getattr(torch.optim, name)
    params = make_params(name)
    source = cls(params, **kwargs_of(HYPER[name]), fused=True)
    train(source, params, steps=2)
    saved = source.state_dict()
    results = []
    for make in (lambda ps: cls(ps, fused=True), lambda ps: cls(ps), lambda ps: torch_cls(ps, **torch_fused)):
        copies = [torch.nn.Parameter(p.detach().clone()) for p in params]
        opt = make(copies)
        opt.load_state_dict(copy.deepcopy(saved))  # (loaded tensors may be the saved ones)
        train(opt, copies, steps=2, seed=3)
        results.append([p.detach() for p in copies])
    for other in results[1:]:
        assert_same(other, results[0])
    # and back: an unfused optimizer's state dict into a fused one
    params = make_params(name)
    plain = cls(params, **kwargs_of(HYPER[name]))
    train(plain, params, steps=2)
    into = cls(make_params(name), fused=True)
    into.load_state_dict(plain.state_dict())
    assert_same(
        counters_float64(without_fused(into.state_dict())),
        counters_float64(without_fused(plain.state_dict())),
    )


def test_a_class_torch_does_not_fuse_keeps_torchs_state_dict_unless_fused():
    p = torch.nn.Parameter(torch.randn(3))
    assert fo.NAdam([p]).state_dict() == torch.optim.NAdam([p]).state_dict()
    opt = fo.NAdam([p], fused=True)
    opt.load_state_dict(torch.optim.NAdam([p]).state_dict())
    assert not opt.param_groups[0].get("fused")  # as torch's Adam: a loaded group's flags are the saved ones


@pytest.mark.parametrize(
    "flags", [{"fused": True, "differentiable": True}, {"fused": True, "foreach": True}], ids=str
)
def test_conflicting_flags_fail_as_torch(flags):
    outcomes = []
    for cls in (torch.optim.Adam, fo.NAdam, fo.Rprop):
        with pytest.raises(RuntimeError) as error:
            cls([torch.nn.Parameter(torch.randn(2))], **flags)
        outcomes.append(str(error.value))
    assert len(set(outcomes)) == 1


@pytest.mark.parametrize("dtype", [torch.complex64, torch.float32], ids=str)
def test_complex_or_meta_params_fail_as_torch(dtype):
    outcomes = []
    for cls in (torch.optim.Adam, fo.RMSprop):
        device = "meta" if dtype == torch.float32 else "cpu"
        p = torch.nn.Parameter(torch.randn(2, dtype=dtype, device=device))
        p.grad = torch.ones_like(p)
        with pytest.raises(RuntimeError) as error:
            cls([p], fused=True).step()
        outcomes.append(str(error.value))
    assert len(set(outcomes)) == 1


@pytest.mark.parametrize("name", ["SparseAdam", "LBFGS"])
def test_classes_with_no_fused_step_say_why(name):
    p = torch.nn.Parameter(torch.randn(2))
    fo_cls(name)([p], fused=False)
    with pytest.raises(RuntimeError, match=f"{name} has no fused step: .*sparse gradients|closure"):
        fo_cls(name)([p], fused=True)


def test_grad_scaler_hands_a_class_torch_does_not_fuse_its_scale():
    """With fused=True a GradScaler hands the step its scale and inf flag, as to torch's
    fused classes: the overflowing step changes nothing, the others step on unscaled
    gradients, as the unfused class under the scaler's own unscaling."""

    def scenario(**flags):
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 3)
        opt = fo.NAdam(m.parameters(), lr=0.1, **flags)
        assert getattr(opt, "_step_supports_amp_scaling", False) == bool(flags)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        for i in range(4):
            opt.zero_grad()
            loss = m(torch.randn(2, 4)).square().sum()
            scaler.scale(loss * (float("inf") if i == 1 else 1.0)).backward()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # the scheduler-less step order warning
                scaler.step(opt)
            scaler.update()
        return [p.detach() for p in m.parameters()], counters_float64(without_fused(opt.state_dict()))

    assert_same(scenario(fused=True), scenario())
