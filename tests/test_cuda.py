"""funcopt on a CUDA GPU (every test is skipped without one).

- The adapter and the functional path against torch.optim on CUDA, over torch's own CUDA
  table of option combinations (capturable, foreach, differentiable, Tensor lr, ...).
- Checkpoints moved between CUDA and CPU resume as torch's do.
- torch.func (grad, vmap) through CUDA steps, with hyperparameters on the GPU or on the
  CPU, agrees with the same computation on the CPU; so do plain autograd and
  forward-mode AD through CUDA steps.
- torch.compile (inductor, so Triton kernels) of the pure step and of the adapter's step.
- fused=True for Adam, AdamW, SGD and Adagrad (torch's own CUDA kernels) bit for bit with
  torch's fused classes, with a GradScaler's scale and inf flag too.
- The whole step of each capturable class (and of the fused ones) recorded once in a
  CUDA graph and replayed for 10 steps equals the eager steps; the functional update
  under torch.compile(mode="reduce-overhead") compiles once.

benchmarks/cuda_check.sh runs these tests and the CUDA benchmarks on a lent GPU.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from helpers import (
    ALGORITHMS,
    HYPER,
    INFOS,
    assert_same,
    compiled_and_eager_steps,
    factory,
    fo_cls,
    functional_kwargs,
    make_params,
    skip_unless_steps_on_gradients,
    skip_unsupported,
    takes,
    torch_cls,
    trainable,
    weight_decay,
)
from torch.func import grad, vmap
from torch.testing._internal.common_optimizers import _get_optim_inputs_including_global_cliquey_kwargs

import funcopt as fo

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
F64 = torch.float64
STEPS = 6


def cuda_inputs(name: str) -> list[tuple[str, dict]]:
    """torch's CUDA configurations for `name`, implementation flags included, plus each
    configuration on the for-loop path (torch's CUDA default is foreach)."""
    info = INFOS[name]
    table = _get_optim_inputs_including_global_cliquey_kwargs("cuda", torch.float32, info)
    out = [(i.desc, copy.deepcopy(i.kwargs)) for i in table]
    out += [(f"{i.desc} & for-loop", {**i.kwargs, "foreach": False}) for i in info.optim_inputs_func("cuda")]
    return out


CASES = [(n, d, k) for n in ALGORITHMS for d, k in cuda_inputs(n)] if CUDA else []


@pytest.mark.parametrize("dtype", [torch.float32, torch.complex64], ids=str)
@pytest.mark.parametrize("name,desc,kwargs", CASES, ids=[f"{n}-{d}" for n, d, _ in CASES])
def test_matches_torch_on_cuda(name, desc, kwargs, dtype):
    skip_unless_steps_on_gradients(name)
    skip_unsupported(name, complex=dtype.is_complex, vectors=True)
    differentiable = kwargs.get("differentiable", False)
    if dtype.is_complex and (differentiable or kwargs.get("fused")):
        pytest.skip("torch supports neither complex differentiable nor complex fused steps")
    base = [p.cuda() for p in make_params(dtype)]
    ref_params, our_params = trainable(base, differentiable), trainable(base, differentiable)
    ref, ours = torch_cls(name)(ref_params, **kwargs), fo_cls(name)(our_params, **kwargs)
    tx = factory(name)(**functional_kwargs(kwargs))
    f_params, f_state = list(base), tx.init(list(base))
    gen = torch.Generator(device="cuda").manual_seed(1)
    for step in range(STEPS):
        grads = [torch.randn(p.shape, generator=gen, device="cuda", dtype=dtype) for p in base]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # .grad of a non-leaf (differentiable)
            for ps in (ref_params, our_params):
                for p, g in zip(ps, grads):
                    p.grad = g.clone()
        ref.step()
        ours.step()
        assert_same(our_params, ref_params, f"params after step {step}")
        assert_same(ours.state_dict(), ref.state_dict(), f"state_dict after step {step}")
        updates, f_state = tx.update(grads, f_state, f_params)
        f_params = fo.apply_updates(f_params, updates)
        assert_same(f_params, ref_params, f"functional params after step {step}")


@pytest.mark.parametrize("source,target", [("cuda", "cpu"), ("cpu", "cuda")])
@pytest.mark.parametrize("name", ALGORITHMS)
def test_checkpoint_moves_between_devices(name, source, target):
    """Trained on one device, resumed on the other: funcopt resumes as torch.optim does,
    and a checkpoint of either library loads into the other."""
    skip_unless_steps_on_gradients(name)
    skip_unsupported(name, vectors=True)
    gen = torch.Generator().manual_seed(0)
    base = make_params(torch.float32)
    grads = [[torch.randn(p.shape, generator=gen) for p in base] for _ in range(6)]

    def run(cls, device, steps, checkpoint=None):
        params = [p.to(device, copy=True).requires_grad_() for p in base]
        opt = cls(name)(params)
        if checkpoint is not None:
            opt.load_state_dict(copy.deepcopy(checkpoint))
        for gs in steps:
            for p, g in zip(params, gs):
                p.grad = g.to(device)
            opt.step()
        return params, opt

    ours_before, ours_opt = run(fo_cls, source, grads[:3])
    ref_before, ref_opt = run(torch_cls, source, grads[:3])
    assert_same(ours_opt.state_dict(), ref_opt.state_dict())
    for checkpoint in (ours_opt.state_dict(), ref_opt.state_dict()):
        ours, ours_opt = run(fo_cls, target, grads[3:], checkpoint)
        ref, ref_opt = run(torch_cls, target, grads[3:], checkpoint)
        assert_same(ours, ref)
        assert_same(ours_opt.state_dict(), ref_opt.state_dict())


def problem(device):
    g = torch.Generator().manual_seed(0)
    params = {"w": torch.randn(4, 3, generator=g, dtype=F64), "b": torch.randn(3, generator=g, dtype=F64)}
    x, y = torch.randn(16, 4, generator=g, dtype=F64), torch.randn(16, 3, generator=g, dtype=F64)
    return {k: v.to(device) for k, v in params.items()}, x.to(device), y.to(device)


def loss_fn(params, x, y):
    return (torch.tanh(x @ params["w"] + params["b"]) - y).pow(2).mean()


def trained_loss(name, lr, data, steps=3):
    params, x, y = data
    tx = factory(name)(lr=lr, **weight_decay(name, 0.05))
    adapted, _, _ = fo.inner_loop(loss_fn, params, tx, [(x, y)] * steps)
    return loss_fn(adapted, x, y)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_hypergradients_and_vmap_on_cuda_match_cpu(name):
    """grad and vmap over lr through 3 CUDA steps agree with the CPU, with the lr tensor
    on the GPU or left on the CPU (a 0-d CPU tensor mixes with CUDA tensors)."""
    skip_unless_steps_on_gradients(name)
    skip_unsupported(name, vectors=True)
    lr = torch.tensor(HYPER[name]["lr"], dtype=F64)
    cpu_data, cuda_data = problem("cpu"), problem("cuda")
    on_cpu = lambda lr: trained_loss(name, lr, cpu_data)  # noqa: E731
    on_cuda = lambda lr: trained_loss(name, lr, cuda_data)  # noqa: E731
    expected_loss, expected_grad = on_cpu(lr), grad(on_cpu)(lr)
    for lr_device in ("cuda", "cpu"):
        torch.testing.assert_close(on_cuda(lr.to(lr_device)).cpu(), expected_loss)
        torch.testing.assert_close(grad(on_cuda)(lr.to(lr_device)).cpu(), expected_grad)
    lrs = torch.linspace(0.5, 1.5, 4, dtype=F64) * lr
    torch.testing.assert_close(vmap(on_cuda)(lrs.cuda()).cpu(), torch.stack([on_cpu(v) for v in lrs]))


@pytest.mark.parametrize("name", ALGORITHMS)
def test_autograd_steps_on_cuda_match_cpu(name):
    """Steps that plain autograd records (a MAML inner loop; small tensors step in
    groups with foreach ops, large ones one by one) and forward-mode AD with dual
    tensors through CUDA steps agree with the CPU, and a frozen leaf stays frozen."""
    skip_unless_steps_on_gradients(name)
    skip_unsupported(name, vectors=True)
    gen = torch.Generator().manual_seed(0)
    shapes = {"small": (4, 3), "scalar": (), "large": (130, 130), "one": (1,), "frozen": (2,)}
    init = {k: torch.randn(s, dtype=F64, generator=gen) for k, s in shapes.items()}

    tx = factory(name)(lr=0.05, **weight_decay(name, 0.05))

    def train(params):
        state = tx.init(params)
        for _ in range(3):
            updates, state = tx.update({k: torch.sin(v) for k, v in params.items()}, state, params)
            params = fo.apply_updates(params, updates)
        return params

    def run(device):
        leaves = {k: v.to(device).requires_grad_(k != "frozen") for k, v in init.items()}
        params = train(leaves)
        assert not params["frozen"].requires_grad and params["one"].requires_grad
        trained = [v.detach().cpu() for v in params.values()]
        loss = sum(v.pow(2).sum() for v in params.values())
        grads = torch.autograd.grad(loss, [v for k, v in leaves.items() if k != "frozen"])
        with torch.autograd.forward_ad.dual_level():
            duals = {
                k: torch.autograd.forward_ad.make_dual(v.detach(), torch.ones_like(v))
                for k, v in leaves.items()
            }
            tangents = [torch.autograd.forward_ad.unpack_dual(v).tangent.cpu() for v in train(duals).values()]
        return trained, [g.cpu() for g in grads], tangents

    on_cuda, on_cpu = run("cuda"), run("cpu")
    assert_same(on_cuda, on_cpu, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_compiled_steps_on_cuda(name):
    """Inductor on CUDA: the pure step (fullgraph, no recompile after the first call)
    and torch.compile(optimizer.step), compiled once, give the eager results. (Under Dynamo, counters
    may move to the GPU, as torch.optim's do: Dynamo makes optimizers capturable.)"""
    import torch._dynamo

    skip_unless_steps_on_gradients(name)
    skip_unsupported(name, vectors=True)
    gen = torch.Generator().manual_seed(0)
    base = [p.cuda() for p in make_params(torch.float32)]
    grads = [[torch.randn(p.shape, generator=gen).cuda() for p in base] for _ in range(4)]
    decay = weight_decay(name, 0.05)
    tx = factory(name)(**decay)
    (comp_p, comp_s), (eager_p, eager_s) = compiled_and_eager_steps(tx, base, grads, backend="inductor")
    assert_same(comp_p, eager_p, rtol=1e-5, atol=1e-6)
    assert_same(list(comp_s), list(eager_s), rtol=1e-5, atol=1e-6)

    on_cpu = lambda opt: {p: {k: v.cpu() for k, v in s.items()} for p, s in opt.state_dict()["state"].items()}  # noqa: E731
    for first_compiled in (0, 1):  # compiled from the first step, or after an eager one
        torch._dynamo.reset()
        ref_params = trainable(base, differentiable=False)
        our_params = trainable(base, differentiable=False)
        ref, ours = (
            torch_cls(name)(ref_params, **decay),
            fo_cls(name)(our_params, **decay),
        )
        our_step = torch.compile(ours.step)
        for i, gs in enumerate(grads):
            for ps in (ref_params, our_params):
                for p, g in zip(ps, gs):
                    p.grad = g.clone()
            ref.step()
            with torch._dynamo.config.patch(error_on_recompile=i > first_compiled):
                (our_step if i >= first_compiled else ours.step)()
        assert_same(our_params, ref_params, rtol=1e-5, atol=1e-6)
        assert_same(on_cpu(ours), on_cpu(ref), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", [n for n in ALGORITHMS if takes(n, "capturable") and n != "Adagrad"])
def test_capturable_step_replays_in_a_cuda_graph(name):  # (torch's Adagrad takes capturable, but ignores it)
    """capturable=True promises a step that a CUDA graph can record (no host sync).
    Recorded once and replayed with new gradients, funcopt's step gives what torch's
    step gives run eagerly. (Its default step: torch's capturable NAdam computes its
    schedule in float32 on the GPU, 3e-6 off after five steps here; funcopt's runs in
    float64, as torch's default step does in Python.)"""
    gen = torch.Generator().manual_seed(0)
    base = [p.cuda() for p in make_params(torch.float32)]
    grads = [[torch.randn(p.shape, generator=gen).cuda() for p in base] for _ in range(4)]
    ref_params = trainable(base, differentiable=False)
    our_params = trainable(base, differentiable=False)
    ref = torch_cls(name)(ref_params, lr=0.1)
    ours = fo_cls(name)(our_params, lr=0.1, capturable=True)
    for p, g in zip(our_params, grads[0]):
        p.grad = g.clone()
    side = torch.cuda.Stream()  # warm up on a side stream, as torch's CUDA-graph notes ask
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        ours.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ours.step()
    for p, g in zip(ref_params, grads[0]):
        p.grad = g.clone()
    ref.step()  # the warm-up step
    for gs in grads:
        for p, g in zip(our_params, gs):
            p.grad.copy_(g)  # the graph reads the gradients it recorded
        graph.replay()
        for p, g in zip(ref_params, gs):
            p.grad = g.clone()
        ref.step()
    torch.cuda.synchronize()
    # within the capturable schedule's float32 rounding (Adam's and AdamW's, as torch's
    # capturable steps, are 2e-6 off torch's default step on the CPU after five steps)
    assert_same(our_params, ref_params, rtol=1e-5, atol=1e-5)


# -- fused=True by torch's kernels, CUDA graphs, reduce-overhead ------------------------

KERNEL_NAMES = ["Adam", "AdamW", "SGD", "Adagrad"]
REPLAYS = 10


def kernel_cases() -> list:
    """torch's CUDA options (capturable, tensor lr, ...) for the classes with torch
    kernels, with fused=True."""
    out = []
    for name in KERNEL_NAMES:
        for i in INFOS[name].optim_inputs_func("cuda"):
            kwargs = {k: v for k, v in i.kwargs.items() if k not in ("foreach", "differentiable")}
            out.append(pytest.param(name, {**kwargs, "fused": True}, id=f"{name}-{i.desc}"))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
@pytest.mark.parametrize("name,kwargs", kernel_cases() if CUDA else [])
def test_torch_kernels_bit_for_bit_on_cuda(name, kwargs, dtype, monkeypatch):
    """fused=True calls torch's CUDA kernel, once a step, with torch's fused class's
    results bit for bit (params, gradients, state)."""
    import test_torch_kernels as tk

    kwargs = {k: v for k, v in kwargs.items() if k != "fused"}
    ours, theirs, ps, qs = tk.twins(name, kwargs, dtype, device="cuda")
    calls = tk.counting(monkeypatch, name)
    tk.train(ours, ps)
    assert len(calls) == tk.STEPS
    tk.train(theirs, qs)
    tk.assert_equal(ours, theirs, ps, qs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("name", KERNEL_NAMES)
def test_torch_kernels_take_grad_scale_and_found_inf_on_cuda(name, dtype):
    import test_torch_kernels as tk

    tk.scaled_steps_alike(name, "cuda", dtype)


def capturable_cases() -> list:
    """Each class that takes capturable, with it; and the classes with torch kernels,
    fused (torch's fused steps are capturable)."""
    out = [pytest.param(n, {"capturable": True}, id=n) for n in ALGORITHMS if takes(n, "capturable")]
    out += [pytest.param(n, {"fused": True}, id=f"{n}-fused") for n in KERNEL_NAMES]
    return out


@pytest.mark.parametrize("name,flags", capturable_cases())
def test_whole_step_in_a_cuda_graph_equals_eager(name, flags):
    """The whole step recorded once in a torch.cuda.CUDAGraph and replayed for 10 steps
    (new gradients copied into the recorded ones) gives the eager steps' params and state
    bit for bit: the step reads nothing on the host."""
    gen = torch.Generator().manual_seed(0)
    base = [p.cuda() for p in make_params(torch.float32)]
    grads = [[torch.randn(p.shape, generator=gen).cuda() for p in base] for _ in range(REPLAYS + 1)]
    kwargs = {"lr": 0.01, **weight_decay(name, 0.05), **flags}
    if name == "SGD":
        kwargs["momentum"] = 0.9
    results = []
    for captured in (True, False):
        params = trainable(base, differentiable=False)
        opt = fo_cls(name)(params, **kwargs)
        for p, g in zip(params, grads[0]):
            p.grad = g.clone()
        side = torch.cuda.Stream()  # the warm-up step (it makes the state) on a side stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            opt.step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if captured:
            with torch.cuda.graph(graph):
                opt.step()
        for gs in grads[1:]:
            for p, g in zip(params, gs):
                p.grad.copy_(g)
            if captured:
                graph.replay()
            else:
                opt.step()
        torch.cuda.synchronize()
        results.append(([p.detach() for p in params], opt.state_dict()["state"]))
    assert_same(results[0], results[1], rtol=0, atol=0)


def copied(tree):
    """Copies of a tree's tensors, one of a tensor that several leaves share (as the
    state's counters): a CUDA graph's outputs are overwritten by its next replay."""
    import optree

    copies: dict[int, torch.Tensor] = {}

    def copy_of(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in copies:
            copies[id(t)] = t.clone()
        return copies[id(t)]

    return optree.tree_map(copy_of, tree)


def reduce_overhead_steps(name: str, device: str, steps: int = 5) -> tuple:
    """(params, state) after `steps` steps of the functional update compiled with
    ``torch.compile(mode="reduce-overhead", fullgraph=True)`` (CUDA graphs on a GPU),
    a recompile after the first failing; the same eager; and the graphs compiled."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    tx = factory(name)(lr=0.01, **weight_decay(name, 0.05))

    def update(grads, state, params):
        updates, state = tx.update(grads, state, params)
        return fo.apply_updates(params, updates), state

    compiled = torch.compile(update, mode="reduce-overhead", fullgraph=True)
    gen = torch.Generator().manual_seed(0)
    base = [p.to(device).contiguous() for p in make_params(torch.float32)]  # as the updated params
    comp_p, comp_s, eager_p, eager_s = base, tx.init(base), base, tx.init(base)
    for i in range(steps):
        grads = [torch.randn(p.shape, generator=gen).to(device) for p in base]
        eager_p, eager_s = update(grads, eager_s, eager_p)
        with torch._dynamo.config.patch(error_on_recompile=i > 0):
            comp_p, comp_s = compiled(grads, comp_s, comp_p)
        comp_p, comp_s = copied((comp_p, comp_s))
    return (comp_p, comp_s), (eager_p, eager_s), torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("name", [n for n in ALGORITHMS if takes(n, "capturable")])
def test_functional_update_under_reduce_overhead_compiles_once(name):
    (comp_p, comp_s), (eager_p, eager_s), graphs = reduce_overhead_steps(name, "cuda")
    assert graphs == 1
    assert_same(comp_p, eager_p, rtol=1e-5, atol=1e-6)
    assert_same(list(comp_s), list(eager_s), rtol=1e-5, atol=1e-6)
