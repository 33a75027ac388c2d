"""The torch.optim-compatible classes behave as torch's: each scenario runs once with
``torch.optim.X`` and once with ``funcopt.X``, and what it observes must be equal."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import io
import pickle
import sys
import warnings

import pytest
import torch
from helpers import (
    ALGORITHMS,
    HYPER,
    INFOS,
    as_tensors,
    assert_same,
    fo_cls,
    hypergradients_both_ways,
    kwargs_of,
    make,
    matrices_only,
    optim_inputs,
    set_default_dtype,
    skip_unless_steps_on_gradients,
    skip_unsupported,
    torch_cls,
    weight_decay,
)
from torch.optim import lr_scheduler
from torch.optim.optimizer import (
    _device_dtype_check_for_fused,
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

import funcopt as fo

BIAS = True  # the test models' layers have biases, but for a class that steps matrices only


@pytest.fixture(autouse=True)
def _matrices_only_models(request, monkeypatch):
    """For Muon (which steps 2-D params only, as torch's), the test models' layers have
    no bias, and their 0-d params are (1, 1)."""
    callspec = getattr(request.node, "callspec", None)
    name = callspec.params.get("name") if callspec else None
    if name in ALGORITHMS and matrices_only(name):
        monkeypatch.setitem(globals(), "BIAS", False)


def model(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(3, 4, bias=BIAS), torch.nn.Tanh(), torch.nn.Linear(4, 2, bias=BIAS)
    ).to(dtype)


def data(dtype=torch.float32):
    g = torch.Generator().manual_seed(123)
    return torch.randn(8, 3, generator=g, dtype=dtype), torch.randn(8, 2, generator=g, dtype=dtype)


def loss_fn(m, x, y):
    return torch.nn.functional.mse_loss(m(x), y)


def _torch_adagrad_inits_added_groups() -> bool:
    """Whether the installed torch's Adagrad creates the state of a param group added
    after construction (torch 2.13 does, at its first step; 2.11 raised KeyError 'sum').
    funcopt's Adagrad does, on every torch."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adagrad([torch.nn.Parameter(torch.zeros(1))])
    opt.add_param_group({"params": [p]})
    p.grad = torch.ones(1)
    try:
        opt.step()
    except KeyError:
        return False
    return True


needs_lazy_adagrad = pytest.mark.skipif(
    not _torch_adagrad_inits_added_groups(),
    reason="this torch's Adagrad cannot step a param group added after construction",
)


def twin(name, scenario, **tol):
    """Run `scenario(cls)` with torch's class and with funcopt's; compare what it returns."""
    expected = scenario(torch_cls(name))
    actual = scenario(fo_cls(name))
    assert_same(actual, expected, **tol)
    return actual


def skip_without_flag(name, flag):
    """Skip the calling test, of torch's switch `flag`, where torch's class lacks it."""
    if flag not in inspect.signature(torch_cls(name)).parameters:
        pytest.skip(f"torch's {name} has no {flag} flag")


def needs(opt):
    """What the class of `opt` needs, by torch's OptimizerInfo: a closure at each step
    (LBFGS), sparse gradients (SparseAdam)."""
    info = INFOS.get(type(opt).__name__)  # none for fo.Optimizer
    return bool(info and info.step_requires_closure), bool(info and info.only_supports_sparse_grads)


def sparsify(params):
    """The gradients as sparse tensors, for a class that takes only those (SparseAdam)."""
    for p in params:
        if p.grad is not None:
            p.grad = p.grad.to_sparse()


def train(opt, m, steps=5, closure=False):
    x, y = data(next(m.parameters()).dtype)
    needs_closure, sparse = needs(opt)
    losses = []
    for _ in range(steps):

        def closure_fn():
            opt.zero_grad()
            loss = loss_fn(m, x, y)
            loss.backward()
            if sparse:
                sparsify(m.parameters())
            return loss

        if closure or needs_closure:
            losses.append(opt.step(closure_fn).detach())
        else:
            losses.append(closure_fn().detach())
            opt.step()
    return losses


@pytest.mark.parametrize("name", ALGORITHMS)
def test_signature_and_defaults(name):
    def shape(cls):
        return [(p.name, p.kind, p.default) for p in inspect.signature(cls).parameters.values()]

    ours, theirs = shape(fo_cls(name)), shape(torch_cls(name))
    if "fused" not in {p[0] for p in theirs}:  # every funcopt class takes fused (fused.py), last
        assert ours[-1] == ("fused", inspect.Parameter.KEYWORD_ONLY, None)
        ours = ours[:-1]
    assert ours == theirs
    params = [torch.nn.Parameter(torch.randn(2) if BIAS else torch.randn(2, 2))]
    assert fo_cls(name)(params).defaults == torch_cls(name)(params).defaults
    assert isinstance(fo_cls(name)(params), torch.optim.Optimizer)
    repr(fo_cls(name)(params))


@pytest.mark.parametrize("name", ALGORITHMS)
def test_hooks(name):
    """All six hook kinds fire in torch's order with torch's arguments; a step pre-hook
    may replace the arguments, a state_dict post-hook and a load pre-hook the dict."""

    def scenario(cls):
        m = model()
        opt = cls(m.parameters(), lr=0.01)
        log = []
        x, y = data()

        def closure():
            opt.zero_grad()
            loss = loss_fn(m, x, y)
            loss.backward()
            if needs(opt)[1]:
                sparsify(m.parameters())
            return loss

        def pre(o, args, kwargs):
            log.append(("step_pre", len(args), sorted(kwargs)))
            return (o,), {"closure": closure}  # replaces the arguments

        def post(o, args, kwargs):
            log.append(("step_post", len(args), sorted(kwargs)))

        def sd_pre(o):
            log.append(("sd_pre",))

        def sd_post(o, sd):
            log.append(("sd_post", sorted(sd)))
            sd["extra"] = 1
            return sd

        def load_pre(o, sd):
            log.append(("load_pre", "extra" in sd))
            sd = dict(sd)
            sd.pop("extra")
            return sd

        def load_post(o):
            log.append(("load_post",))

        handles = [
            opt.register_step_pre_hook(pre),
            opt.register_step_post_hook(post),
            opt.register_state_dict_pre_hook(sd_pre),
            opt.register_state_dict_post_hook(sd_post),
            opt.register_load_state_dict_pre_hook(load_pre),
            opt.register_load_state_dict_post_hook(load_post),
        ]
        loss = opt.step()  # the pre-hook supplies the closure
        sd = opt.state_dict()
        opt.load_state_dict(sd)
        for h in handles:
            h.remove()
        opt.step(closure)
        return log, [loss.detach()], [p.detach() for p in m.parameters()], sd["extra"]

    log, *_ = twin(name, scenario)
    assert [e[0] for e in log] == ["step_pre", "step_post", "sd_pre", "sd_post", "load_pre", "load_post"]


@pytest.mark.parametrize("name", ALGORITHMS)
def test_global_hooks_fire_once(name):
    calls = []
    h1 = register_optimizer_step_pre_hook(lambda *a: calls.append("pre"))
    h2 = register_optimizer_step_post_hook(lambda *a: calls.append("post"))
    try:
        m = model()
        train(fo_cls(name)(m.parameters()), m, steps=2)
    finally:
        h1.remove()
        h2.remove()
    assert calls == ["pre", "post", "pre", "post"]


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=needs_lazy_adagrad) if n == "Adagrad" else n for n in ALGORITHMS]
)
def test_add_param_group_and_group_options(name):
    if not INFOS[name].supports_param_groups:
        pytest.skip(f"{name} takes one param group, as torch's (supports_param_groups=False)")

    def scenario(cls):
        m = model()
        first, second = list(m[0].parameters()), list(m[2].parameters())
        opt = cls(first, lr=0.01)
        losses = train(opt, m, steps=3)
        opt.add_param_group({"params": second, "lr": 0.05, "weight_decay": 0.1})
        losses += train(opt, m, steps=4)
        return losses, [p.detach() for p in m.parameters()], opt.state_dict()

    twin(name, scenario)


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("set_to_none", [True, False])
def test_zero_grad(name, set_to_none):
    def scenario(cls):
        m = model()
        opt = cls(m.parameters())
        train(opt, m, steps=2)
        opt.zero_grad(set_to_none=set_to_none)
        return [p.grad for p in m.parameters()] if set_to_none else [p.grad.clone() for p in m.parameters()]

    grads = twin(name, scenario)
    assert all(g is None for g in grads) if set_to_none else all((g.to_dense() == 0).all() for g in grads)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_closure(name):
    def scenario(cls):
        m = model()
        opt = cls(m.parameters(), lr=0.01)
        return train(opt, m, steps=4, closure=True), [p.detach() for p in m.parameters()]

    twin(name, scenario)


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("foreach", [False, True])
def test_a_param_listed_twice_steps_twice(name, foreach):
    """A group that lists a param more than once (deprecated, torch warns) steps it once
    per listing, as torch's default step does, bit for bit; eagerly and compiled."""
    skip_unless_steps_on_gradients(name)
    skip_unsupported(name, vectors=True)
    skip_without_flag(name, "foreach")
    import torch._dynamo

    def scenario(cls, compiled=False):
        p, q = torch.nn.Parameter(torch.linspace(-1, 1, 5)), torch.nn.Parameter(torch.linspace(0, 1, 3))
        with pytest.warns(UserWarning, match="duplicate parameters"):
            opt = cls([p, q, p, p], lr=0.1, foreach=foreach if cls is fo_cls(name) else False)
        if compiled:  # each class's step compiles anew (Dynamo's limit counts recompiles of a code object)
            torch._dynamo.reset()
        step = torch.compile(opt.step, fullgraph=True) if compiled else opt.step
        for i in range(3):
            p.grad, q.grad = torch.full((5,), i - 0.5), torch.ones(3)
            step()
        return p.detach(), q.detach(), dict(opt.state[p]), dict(opt.state[q])

    expected = scenario(torch_cls(name))
    assert expected[2].get("step", 9) == 9  # (SGD keeps no step)
    assert_same(scenario(fo_cls(name)), expected, rtol=0, atol=0)
    if not foreach:  # compiled: within round-off, as any compiled step
        assert_same(scenario(fo_cls(name), compiled=True), expected)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_named_parameters(name):
    def scenario(cls):
        m = model()
        opt = cls(m.named_parameters(), lr=0.01)
        train(opt, m, steps=2)
        sd = opt.state_dict()
        m2 = model(seed=1)
        opt2 = cls(m2.named_parameters(), lr=0.01)
        opt2.load_state_dict(sd)
        return sd, opt2.state_dict()["param_groups"]

    sd, _ = twin(name, scenario)
    names = ["0.weight", "0.bias", "2.weight", "2.bias"] if BIAS else ["0.weight", "2.weight"]
    assert sd["param_groups"][0]["param_names"] == names


@pytest.mark.parametrize("name", ALGORITHMS)
def test_tensor_lr(name):
    def scenario(cls):
        m = model()
        opt = cls(m.parameters(), lr=torch.tensor(0.01))
        return train(opt, m, steps=5), opt.state_dict()

    twin(name, scenario)


@pytest.mark.parametrize("name", ["Adamax", "NAdam"])
def test_betas_as_one_tensor(name):
    """torch.optim takes betas as one tensor of 2 elements (its default step unpacks it)."""

    def scenario(cls):
        m = model()
        opt = cls(m.parameters(), betas=torch.tensor([0.8, 0.9]))
        return train(opt, m, steps=5), opt.state_dict()

    twin(name, scenario)


SCHEDULERS = {
    "StepLR": lambda opt: lr_scheduler.StepLR(opt, step_size=2, gamma=0.5),
    "ExponentialLR": lambda opt: lr_scheduler.ExponentialLR(opt, gamma=0.9),
    "CosineAnnealingLR": lambda opt: lr_scheduler.CosineAnnealingLR(opt, T_max=6),
    "LambdaLR": lambda opt: lr_scheduler.LambdaLR(opt, lambda e: 1 / (e + 1)),
    "OneCycleLR": lambda opt: lr_scheduler.OneCycleLR(
        opt, max_lr=0.05, total_steps=12, cycle_momentum="betas" in opt.defaults
    ),
    "CyclicLR": lambda opt: lr_scheduler.CyclicLR(
        opt, base_lr=0.001, max_lr=0.05, step_size_up=3, cycle_momentum=False
    ),
    "ReduceLROnPlateau": lambda opt: lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5),
}


@pytest.mark.parametrize("sched", list(SCHEDULERS))
@pytest.mark.parametrize("name", ALGORITHMS)
def test_lr_schedulers(name, sched):
    """Schedulers drive lr (and betas, for OneCycleLR) exactly as with torch."""

    def scenario(cls):
        m = model()
        opt = cls(m.parameters(), lr=0.01)
        scheduler = SCHEDULERS[sched](opt)
        losses, lrs, betas = [], [], []
        for _ in range(10):
            loss = train(opt, m, steps=1)[0]
            losses.append(loss)
            if sched == "ReduceLROnPlateau":
                scheduler.step(1.0)  # never improves: lr is cut
            else:
                scheduler.step()
            lrs.append(float(opt.param_groups[0]["lr"]))
            betas.append(opt.param_groups[0].get("betas"))
        return losses, lrs, betas, [p.detach() for p in m.parameters()]

    _, lrs, betas, _ = twin(name, scenario)
    assert len(set(lrs)) > 1
    if sched == "OneCycleLR" and betas[0] is not None:
        assert len({b[0] for b in betas}) > 1  # OneCycleLR rewrote beta1 each step


BIT_CASES = [
    (name, desc, kwargs, reload)
    for name in ALGORITHMS
    for desc, kwargs in optim_inputs(name, with_flags=False)
    for reload in ([False, True] if desc == "default" else [False])
]


@pytest.mark.parametrize(
    "name,desc,kwargs,reload", BIT_CASES, ids=[f"{n}-{d}{'-reload' * r}" for n, d, _, r in BIT_CASES]
)
def test_bit_for_bit_with_torch_over_many_steps(name, desc, kwargs, reload):
    """40 steps on a problem that amplifies any difference in rounding (a 1-ulp
    difference grows to ~1e-4 here: torch's own foreach and for-loop NAdam differ that
    much), for each of torch's option sets: the params equal those of torch's default
    step bit for bit, NAdam's too, whose ``mu_product *= mu`` rounds in the counter's
    dtype. With `reload`, the state goes through torch's ``load_state_dict`` onto
    float64 params, which casts mu_product (not step) to float64."""

    twin(name, lambda cls: amplifying_run(cls, {"lr": 0.01, **kwargs}, reload), rtol=0, atol=0)


def amplifying_run(cls, options, reload=False):
    """The params and state after 40 steps of `cls(**options)` on a problem that
    amplifies a 1-ulp difference; with `reload`, in float64, reloaded at step 5."""
    torch.manual_seed(0)
    dtype = torch.float64 if reload else torch.float32
    m = torch.nn.Sequential(
        torch.nn.Linear(8, 16, bias=BIAS), torch.nn.Tanh(), torch.nn.Linear(16, 1, bias=BIAS)
    ).to(dtype)
    x, y = torch.randn(64, 8, dtype=dtype), torch.randn(64, 1, dtype=dtype)
    opt = cls(m.parameters(), **options)
    needs_closure, sparse = needs(opt)

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(m(x), y)
        loss.backward()
        if sparse:
            sparsify(m.parameters())
        return loss

    for i in range(40):
        if reload and i == 5:
            sd = opt.state_dict()
            opt = cls(m.parameters(), **options)
            opt.load_state_dict(sd)
        if needs_closure:
            opt.step(closure)
        else:
            closure()
            opt.step()
    return [p.detach() for p in m.parameters()], opt.state_dict()["state"]


TENSOR_HYPERPARAMS = [
    ("Adadelta", dict(lr=0.37, weight_decay=0.1, rho=0.77)),
    ("Adagrad", dict(lr=0.37, lr_decay=0.05, weight_decay=0.1)),
    ("Adamax", dict(lr=0.37, betas=(0.3, 0.97), weight_decay=0.013)),
    # with these values, 1 - lr * weight_decay rounds differently in float32 than in doubles
    ("NAdam", dict(lr=0.05, betas=(0.83, 0.97), weight_decay=0.37, decoupled_weight_decay=True)),
    # mu_product *= mu rounds to float32 from float64 here (with float64 tensors)
    ("NAdam", dict(lr=0.013, betas=(0.83, 0.97), weight_decay=0.013, momentum_decay=0.03)),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name,options", TENSOR_HYPERPARAMS, ids=[n for n, _ in TENSOR_HYPERPARAMS])
def test_tensor_hyperparameters_bit_for_bit_with_torch(name, options, dtype):
    """Hyperparameters given as 0-d tensors (of the params' dtype, or float64 for
    float32 params) step as torch's default step does, bit for bit: torch computes its
    per-step scalars (lr over a bias correction, NAdam's momentum coefficients and
    decoupled decay factor) in the tensors' dtype then, and so does the schedule."""
    twin(name, lambda cls: amplifying_run(cls, as_tensors(options, dtype)), rtol=0, atol=0)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_compiled_step_with_lr_scheduler(name):
    """torch.compile(optimizer.step, fullgraph=True) after a scheduler is attached (whose
    wrapper of step Dynamo would not trace), with a tensor lr that the scheduler sets in
    place: one compile, the params of torch's eager step under the same schedule, and
    none of the scheduler's call-order warnings."""
    skip_unless_steps_on_gradients(name)
    import torch._dynamo

    def scenario(cls):
        torch._dynamo.reset()
        m = model()
        opt = cls(m.parameters(), lr=torch.tensor(0.05))
        scheduler = SCHEDULERS["LambdaLR"](opt)
        step = opt.step
        if cls is fo_cls(name):
            step = torch.compile(opt.step, fullgraph=True, backend="aot_eager")
        x, y = data()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for i in range(5):
                opt.zero_grad()
                loss_fn(m, x, y).backward()
                with torch._dynamo.config.patch(error_on_recompile=i > 0):
                    step()
                scheduler.step()
        assert not [w for w in caught if "optimizer.step()" in str(w.message)]
        return [p.detach() for p in m.parameters()], float(opt.param_groups[0]["lr"])

    twin(name, scenario, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_lr_scheduler_warns_of_its_step_first_as_torch(name):
    """A scheduler stepped before the optimizer warns, as with torch's classes; in the
    right order it does not."""
    for cls in (torch_cls(name), fo_cls(name)):
        for scheduler_first in (True, False):
            m = model()
            opt = cls(m.parameters(), lr=0.01)
            scheduler = SCHEDULERS["StepLR"](opt)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                if scheduler_first:
                    scheduler.step()
                train(opt, m, steps=1)
                scheduler.step()
            messages = [str(w.message) for w in caught if "lr_scheduler.step()" in str(w.message)]
            assert len(messages) == scheduler_first, (cls, messages)


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("direction", ["funcopt->torch", "torch->funcopt"])
def test_checkpoint_interop(name, direction):
    """A state_dict saved by one side loads into the other (also through torch.save and
    torch.load(weights_only=True)), and training then continues identically."""
    src_cls, dst_cls = (fo_cls(name), torch_cls(name))
    if direction == "torch->funcopt":
        src_cls, dst_cls = dst_cls, src_cls
    m = model()
    decay = {"weight_decay": 0.01} if "weight_decay" in inspect.signature(src_cls).parameters else {}
    src = src_cls(m.parameters(), lr=0.01, **decay)
    train(src, m, steps=4)
    buffer = io.BytesIO()
    torch.save(src.state_dict(), buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert_same(saved, src.state_dict())

    m2 = copy.deepcopy(m)
    dst = dst_cls(m2.parameters(), lr=0.5)  # hyperparameters come from the checkpoint
    dst.load_state_dict(saved)
    assert_same(dst.state_dict(), src.state_dict())
    assert_same(train(dst, m2, steps=4), train(src, m, steps=4))
    assert_same(list(m2.parameters()), list(m.parameters()))
    assert_same(dst.state_dict(), src.state_dict())


@pytest.mark.parametrize("name", ALGORITHMS)
def test_state_dict_deterministic_and_copies(name):
    """torch's test_state_dict_deterministic, plus deepcopy and pickle of the optimizer."""

    def scenario(cls):
        m = model()
        opt = cls(m.parameters(), lr=0.01)
        train(opt, m, steps=3)
        m2 = copy.deepcopy(m)
        opt2 = cls(m2.parameters(), lr=0.01)
        opt2.load_state_dict(copy.deepcopy(opt.state_dict()))
        train(opt, m, steps=3)
        train(opt2, m2, steps=3)
        public = {k for k in opt.__dict__ if not k.startswith("_")}
        assert public == {k for k in copy.deepcopy(opt).__dict__ if not k.startswith("_")}
        clone = pickle.loads(pickle.dumps(opt))
        clone_params = [p for g in clone.param_groups for p in g["params"]]
        needs_closure, sparse = needs(clone)
        for p in clone_params:
            p.grad = torch.ones_like(p).to_sparse() if sparse else torch.ones_like(p)
        if not needs_closure:  # (torch's LBFGS pickles no _params: unpickled, it cannot step)
            clone.step()  # an unpickled optimizer still steps
        return opt.state_dict(), opt2.state_dict(), list(m.parameters()), list(m2.parameters())

    sd, sd2, p, p2 = twin(name, scenario)
    assert_same(sd, sd2)
    assert_same(p, p2)


def with_number_counters(state_dict):
    """A copy of `state_dict` with its counters (step, mu_product) as Python numbers, as
    older checkpoints hold them."""
    out = copy.deepcopy(state_dict)
    for p_state in out["state"].values():
        for key in ("step", "mu_product"):
            if torch.is_tensor(p_state.get(key)):  # (SparseAdam's step is one already, as torch's)
                p_state[key] = p_state[key].item()
    return out


def _flags_restored_on_load(name):
    """The flags that torch's class sets back to their defaults where a loaded param group
    lacks them (torch's Adafactor: foreach, not maximize)."""
    opt = torch_cls(name)([torch.nn.Parameter(torch.zeros(2, 2))])
    flags = ("maximize", "foreach", "fused", "differentiable", "capturable")
    state = opt.__getstate__()
    for group in state["param_groups"]:
        for flag in flags:
            group.pop(flag, None)
    opt.__setstate__(state)
    return [flag for flag in flags if flag in opt.param_groups[0]]


@pytest.mark.parametrize("name", ALGORITHMS)
def test_load_older_state_dicts(name):
    """Checkpoints without the newer flags, or with Python-number steps, still load and
    step (torch's test_can_load_older_state_dict and test_load_nontensor_step)."""

    def scenario(cls):
        m = model()
        opt = cls(m.parameters(), lr=0.01)
        train(opt, m, steps=3)
        old = with_number_counters(opt.state_dict())
        for group in old["param_groups"]:
            for flag in _flags_restored_on_load(name):
                group.pop(flag, None)
        opt.load_state_dict(old)
        train(opt, m, steps=2)
        return opt.state_dict(), list(m.parameters())

    twin(name, scenario)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_hyperparameters_read_every_step(name):
    """Editing param_groups between steps takes effect, as in torch."""

    def scenario(cls):
        m = model()
        opt = cls(m.parameters(), lr=0.01)
        train(opt, m, steps=2)
        for group in opt.param_groups:
            group["lr"] = 0.002
            group["weight_decay"] = 0.3
            group["maximize"] = True
            if "betas" in group:
                group["betas"] = (0.5, 0.9)
        return train(opt, m, steps=3), opt.state_dict()

    twin(name, scenario)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_default_dtype_float64(name):
    """Under set_default_dtype(float64) counters are float64, as in torch."""
    with set_default_dtype(torch.float64):

        def scenario(cls):
            m = model(torch.float64)
            opt = cls(m.parameters())
            return train(opt, m, steps=3), opt.state_dict()

        _, sd = twin(name, scenario)
        step = (
            sd["state"].get(0, {}).get("step")
        )  # (SparseAdam's a Python int, LBFGS and SGD none, as torch's)
        assert not torch.is_tensor(step) or step.dtype == torch.float64


@pytest.mark.parametrize("name", ALGORITHMS)
def test_steps_under_another_default_device(name):
    """Steps taken while another device is the default (``torch.set_default_device``, or
    ``with torch.device(...)``) equal plain ones, for the class and the functional update:
    funcopt makes its host scalars on the CPU, not on the default device (on a GPU that
    would cost a copy and a sync per step). Here that device is meta, which holds no
    values, where torch 2.13's Adagrad, Adamax and NAdam steps fail."""
    skip_unless_steps_on_gradients(name)

    def scenario(default_device):
        m = model()
        opt = fo_cls(name)(m.parameters(), **weight_decay(name, 0.1))
        x, y = data()
        tx = make(name, weight_decay(name, 0.1))
        params = {k: v.detach().clone() for k, v in m.named_parameters()}
        state = tx.init(params)
        for _ in range(3):
            opt.zero_grad()
            loss_fn(m, x, y).backward()
            grads = {k: v.grad.clone() for k, v in m.named_parameters()}
            with default_device:
                opt.step()
                updates, state = tx.update(grads, state, params)
                params = fo.apply_updates(params, updates)
        with default_device:  # counters saved as numbers become tensors there
            opt.load_state_dict(with_number_counters(opt.state_dict()))
        opt.zero_grad()
        loss_fn(m, x, y).backward()
        with default_device:
            opt.step()
        return list(m.parameters()), opt.state_dict(), params, state

    assert_same(scenario(torch.device("meta")), scenario(contextlib.nullcontext()))


@pytest.mark.parametrize("name", ALGORITHMS)
def test_capturable_on_cpu_is_rejected(name):
    if "capturable" not in inspect.signature(torch_cls(name)).parameters:
        pytest.skip("no capturable flag")
    for cls in (torch_cls(name), fo_cls(name)):
        p = torch.nn.Parameter(torch.randn(3))
        p.grad = torch.randn(3)
        with pytest.raises(AssertionError, match="capturable=True"):
            cls([p], capturable=True).step()


@pytest.mark.parametrize("name", [n for n in ALGORITHMS if n != "Adagrad"])  # torch's Adagrad: no capturable
def test_capturable_step_reads_nothing_on_the_host(name, monkeypatch):
    """A capturable step must not read a tensor's value in Python (that syncs with the
    GPU and breaks CUDA-graph capture). Checked on the CPU with the device check lifted
    and every way of reading a value forbidden; tests/test_cuda.py replays a real CUDA
    graph."""
    skip_without_flag(name, "capturable")
    from funcopt._src.torch import adapter

    def twin_step(cls, capturable, forbid=False):
        torch.manual_seed(0)
        m = model()
        opt = cls(m.parameters(), lr=0.1, **weight_decay(name, 0.1), capturable=capturable)
        x, y = data()
        for _ in range(3):
            opt.zero_grad()
            loss_fn(m, x, y).backward()
            with monkeypatch.context() as patch:
                for reader in ("item", "tolist", "__float__", "__int__", "__bool__") if forbid else ():
                    patch.setattr(
                        torch.Tensor, reader, lambda self, r=reader: pytest.fail(f"{r} in a capturable step")
                    )
                opt.step()
        return list(m.parameters())

    monkeypatch.setattr(adapter, "_check_capturable", lambda params, name="": None)
    ours = twin_step(fo_cls(name), capturable=True, forbid=True)
    # The same math as torch's: its capturable step (a GPU's; here with the device check
    # of torch's step functions lifted too), which computes some schedules from the float32
    # step tensor (Adam's bias corrections, as fo's capturable Adam does: tests/test_adam.py),
    # or its default step, whose schedule is in double precision (fo's capturable NAdam's).
    for module in [m for k, m in sys.modules.items() if k.startswith("torch.optim.")]:
        if hasattr(module, "_get_capturable_supported_devices"):
            monkeypatch.setattr(module, "_get_capturable_supported_devices", lambda *args, **kwargs: ["cpu"])
    expected = [twin_step(torch_cls(name), capturable) for capturable in (True, False)]
    close = [all(torch.allclose(a, e, rtol=1e-5, atol=1e-6) for a, e in zip(ours, ps)) for ps in expected]
    assert any(close), "the params differ from those of torch's capturable step and of its default one"


def _diff_fn(p, grad, state, cls, kwargs, *ignored):
    """torch's TestDifferentiableOptimizer: a step as a function of param, grad and state."""
    p = p.clone()
    p.grad = grad
    state = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    opt = cls([p], **kwargs)
    opt.state[p].update(state)
    opt.step()
    return (p,) + tuple(v for v in opt.state[p].values() if isinstance(v, torch.Tensor) and v.requires_grad)


def differentiable_state(name, p):
    """A param's state after 10 of torch's steps: its counters, and random buffers (in
    [0, 1), as torch's TestDifferentiableOptimizer has them) that require grad."""
    q = torch.nn.Parameter(p.detach().clone())
    opt = torch_cls(name)([q])
    for _ in range(10):
        q.grad = torch.rand_like(q)
        opt.step()
    return {k: torch.rand_like(v, requires_grad=True) if v.dim() > 0 else v for k, v in opt.state[q].items()}


@pytest.mark.parametrize("name", ALGORITHMS)
@pytest.mark.parametrize("kwargs", [{}, {"weight_decay": 0.1, "maximize": True}])
def test_differentiable_step_gradcheck(name, kwargs):
    """differentiable=True: the step is differentiable w.r.t. param, grad and state
    (torch's TestDifferentiableOptimizer), and agrees with torch's."""
    skip_without_flag(name, "differentiable")
    torch.manual_seed(0)
    p = torch.rand(10, requires_grad=True, dtype=torch.float64)
    grad = torch.rand(10, requires_grad=True, dtype=torch.float64)
    state = differentiable_state(name, p)
    kwargs = {**kwargs, "differentiable": True}
    # only the options the class has (Rprop has no weight_decay)
    kwargs = {k: v for k, v in kwargs.items() if k in inspect.signature(fo_cls(name)).parameters}
    torch.autograd.gradcheck(
        _diff_fn,
        (p, grad, state, fo_cls(name), kwargs, *[v for v in state.values() if v.requires_grad]),
    )
    ours = _diff_fn(p, grad, state, fo_cls(name), kwargs)
    theirs = _diff_fn(p, grad, state, torch_cls(name), kwargs)
    assert_same(ours, theirs)
    inputs = (p, grad, *[v for v in state.values() if v.requires_grad])
    g_ours = torch.autograd.grad(sum(o.sum() for o in ours), inputs)
    g_theirs = torch.autograd.grad(sum(o.sum() for o in theirs), inputs)
    assert_same(g_ours, g_theirs)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_differentiable_steps_give_the_hypergradients_of_tensor_hyperparameters(name):
    """differentiable=True with every hyperparameter a tensor that requires grad: the
    loss after three steps is differentiable w.r.t. them and the initial params, and
    equals the functional inner loop's. torch's own classes fail here (a tensor
    `alpha`/`value`, or an in-place write to a tensor autograd saved)."""
    skip_without_flag(name, "differentiable")
    ours, expected = hypergradients_both_ways(
        lambda params, hp: fo_cls(name)(params, **kwargs_of(hp), differentiable=True),
        lambda hp: make(name, hp),
        HYPER[name],
    )
    assert_same(ours, expected)
    assert all(g.abs() > 0 for g in expected[1:-1]), expected


def _sparse_grad(i, n=6):
    """An uncoalesced sparse gradient touching two entries (one of them twice)."""
    idx = torch.tensor([[i % n, i % n, (i + 2) % n]])
    return torch.sparse_coo_tensor(idx, torch.tensor([0.3, -0.1, 0.7]) * (i + 1), (n,), check_invariants=True)


# torch's own sparse Adagrad builds its sparse tensors without saying whether to check them
@pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled:UserWarning:torch.optim")
@pytest.mark.parametrize("kwargs", [{}, {"lr": 0.1, "lr_decay": 0.2}, {"maximize": True}])
def test_adagrad_sparse_gradients(kwargs):
    def scenario(cls):
        p = torch.nn.Parameter(torch.linspace(-1, 1, 6))
        opt = cls([p], **kwargs)
        for i in range(8):
            p.grad = _sparse_grad(i)
            opt.step()
        return p.detach(), opt.state_dict()

    p, _ = twin("Adagrad", scenario)
    # the functional path accepts sparse gradients too
    tx = fo.adagrad(**kwargs)
    params = [torch.linspace(-1, 1, 6)]
    state = tx.init(params)
    for i in range(8):
        updates, state = tx.update([_sparse_grad(i)], state, params)
        params = fo.apply_updates(params, updates)
    assert_same(params[0], p)


def test_adagrad_fused_flag():
    """fused=True is accepted on CPU and keeps torch's state layout (float32 step)."""

    def scenario(cls):
        m = model(torch.float64)
        opt = cls(m.parameters(), fused=True)
        sd0 = copy.deepcopy(opt.state_dict())
        return sd0, train(opt, m, steps=3), opt.state_dict()

    sd0, _, _ = twin("Adagrad", scenario)
    assert sd0["state"][0]["step"].dtype == torch.float32


def test_adagrad_fused_steps_as_torchs_fused_step():
    """fused=True gives torch's fused step bit for bit, also for a transposed param
    whose gradient, set by hand, is contiguous (torch 2.13's fused CPU kernel pairs the
    elements of such a param and gradient wrongly: torch's class gets the gradient laid
    out as the param, where its kernel is right)."""

    def scenario(cls, laid_out_as_param=False):
        g = torch.Generator().manual_seed(0)
        p = torch.nn.Parameter(torch.randn(4, 100, generator=g).t())
        opt = cls([p], lr=0.1, weight_decay=0.1, fused=True)
        for _ in range(3):
            grad = torch.randn(p.shape, generator=g)  # contiguous, unlike p
            p.grad = torch.empty_like(p).copy_(grad) if laid_out_as_param else grad
            opt.step()
        return p.detach(), opt.state_dict()["state"]

    assert_same(scenario(fo.Adagrad), scenario(torch.optim.Adagrad, laid_out_as_param=True), rtol=0, atol=0)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_grad_scaler(name):
    """torch.amp.GradScaler drives the step as with torch's class: a step whose scaled
    gradients overflow is skipped and the scale lowered. Adagrad's fused=True takes the
    scale and the inf flag itself (``_step_supports_amp_scaling``, as torch's fused
    class): it is called on that step too, and unscales the gradients in place."""
    skip_unless_steps_on_gradients(name)
    flags = {"fused": True} if name == "Adagrad" else {}
    hooks = {}

    def scenario(cls):
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 3, bias=BIAS)
        opt = cls(m.parameters(), lr=0.1, **flags)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        steps = []
        opt.register_step_post_hook(lambda *_: steps.append(1))
        for i in range(4):
            opt.zero_grad()
            loss = m(torch.randn(2, 4)).square().sum()
            scaler.scale(loss * (float("inf") if i == 1 else 1.0)).backward()
            scaler.step(opt)
            scaler.update()
        hooks[cls] = len(steps)
        grads = [p.grad.clone() for p in m.parameters()]
        return [p.detach() for p in m.parameters()], opt.state_dict()["state"], grads, scaler.get_scale()

    *_, scale = twin(name, scenario)
    assert scale == 2.0**9 and hooks[fo_cls(name)] == (4 if flags else 3)
    # torch 2.10's and 2.11's fused Adagrad left the scaling to the scaler, which skips the
    # overflowing step: params and state agree, only the step count differs
    torch_fused = torch.optim.Adagrad([torch.zeros(1, requires_grad=True)], fused=True)
    if not flags or getattr(torch_fused, "_step_supports_amp_scaling", False):
        assert hooks[torch_cls(name)] == hooks[fo_cls(name)]


def test_grad_scaler_unscales_every_group_once():
    """A group that turns fused off steps unscaled gradients too (torch's class fails
    there), each gradient unscaled once: as torch's unfused class with the scaler's
    own unscaling."""

    def scenario(cls, fused):
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 3)
        groups = [{"params": [m.weight]}, {"params": [m.bias], "fused": None if fused else False}]
        opt = cls(groups, lr=0.1, **({"fused": True} if fused else {}))
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
        for _ in range(3):
            opt.zero_grad()
            scaler.scale(m(torch.randn(2, 4)).square().sum()).backward()
            scaler.step(opt)
            scaler.update()
        return [p.detach() for p in m.parameters()], opt.state_dict()["state"]  # sums of unscaled squares

    assert_same(scenario(fo.Adagrad, fused=True), scenario(torch.optim.Adagrad, fused=False))


def test_adagrad_fused_does_not_step_if_found_inf():
    """torch's test_fused_does_not_step_if_foundinf: with ``found_inf`` set (as a
    GradScaler sets it), a fused step leaves params, state and gradients as they were."""
    for grad_scale in (None, torch.ones(1)):
        params = [torch.ones(1, requires_grad=True) for _ in range(5)]
        for p in params:
            p.grad = torch.ones_like(p)
        opt = fo.Adagrad(params, fused=True)
        opt.grad_scale, opt.found_inf = grad_scale, torch.ones(())
        opt.step()
        for p in params:
            assert_same(
                (p.detach(), p.grad, opt.state[p]["step"]), (torch.ones(1), torch.ones(1), torch.zeros(()))
            )


def test_adagrad_fused_rejects_params_on_meta_as_torch():
    """torch's test_fused_error_on_params_on_meta: a fused step of params on the meta
    device raises torch's error, with its list of devices."""

    def scenario(cls):
        with torch.device("meta"):
            m = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Sigmoid(), torch.nn.Linear(3, 1))
        opt = cls(m.parameters(), fused=True)
        for p in m.parameters():
            p.grad = torch.rand_like(p)
        with pytest.raises(RuntimeError) as error:
            opt.step()
        return str(error.value)

    expected = scenario(torch.optim.Adagrad)
    if "'cuda'" not in expected:  # torch 2.10's and 2.11's Adagrad had no fused CUDA step
        with pytest.raises(RuntimeError) as error:
            _device_dtype_check_for_fused(torch.empty(1, device="meta"))
        expected = str(error.value)
    assert "`fused=True` requires all the params to be floating point Tensors" in expected
    assert scenario(fo.Adagrad) == expected


def test_adagrad_share_memory():
    """share_memory() puts the sums in shared memory, as torch's Adagrad does, and steps
    (small params in chunks, large ones in segments) write into them in place, so
    Hogwild processes sharing the optimizer see each other's updates."""
    from funcopt._src.engine import inplace

    def scenario(cls):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(n)) for n in (3, 16, inplace.SEGMENT + 5)]
        opt = cls(params, lr=0.1)
        opt.share_memory()
        sums = [opt.state[p]["sum"] for p in params]
        for _ in range(2):
            for p in params:
                p.grad = torch.randn_like(p)
            opt.step()
        assert all(opt.state[p]["sum"] is s and s.is_shared() for p, s in zip(params, sums))
        return [p.detach() for p in params], sums

    twin("Adagrad", scenario)


@needs_lazy_adagrad
def test_adagrad_initial_accumulator_comes_from_defaults():
    """torch quirk: a group's own initial_accumulator_value is ignored."""

    def scenario(cls):
        a, b = torch.nn.Parameter(torch.randn(3)), torch.nn.Parameter(torch.randn(3))
        opt = cls(
            [{"params": [a]}, {"params": [b], "initial_accumulator_value": 5.0}],
            initial_accumulator_value=0.5,
        )
        c = torch.nn.Parameter(torch.randn(3))
        opt.add_param_group({"params": [c], "initial_accumulator_value": 7.0})
        for p in (a, b, c):
            p.grad = torch.ones(3)
        opt.step()
        return opt.state_dict()

    sd = twin("Adagrad", scenario)
    assert float(sd["state"][1]["sum"][0]) == 1.5  # 0.5 from the defaults, plus 1


@pytest.mark.parametrize("name", ALGORITHMS)
def test_bfloat16_params(name):
    def scenario(cls):
        m = model(torch.bfloat16)
        opt = cls(m.parameters(), lr=0.01)
        return train(opt, m, steps=3), opt.state_dict()

    _, sd = twin(name, scenario)
    buffers = [v for v in sd["state"].get(0, {}).values() if torch.is_tensor(v) and v.dim() > 0]
    assert all(b.dtype == torch.bfloat16 for b in buffers)  # (none for SGD without momentum)


@pytest.mark.parametrize("first_compiled", [0, 2])
@pytest.mark.parametrize("default_dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ALGORITHMS)
def test_compiled_step_matches_torch_eager(name, default_dtype, first_compiled):
    """torch.compile(optimizer.step, fullgraph=True), from the first step or after eager
    steps: same params and state as torch's eager step, compiled once (the state is
    created outside the traced code), with no graph break. Under a float64 default dtype
    the counters are 0-d float64 tensors, whose direct in-place writes torch 2.13's
    compiler can drop."""
    skip_unless_steps_on_gradients(name)
    import torch._dynamo

    def scenario(cls):
        torch._dynamo.reset()
        with set_default_dtype(default_dtype):
            m = model()
            scalar = torch.nn.Parameter(torch.tensor(0.5) if BIAS else torch.full((1, 1), 0.5))  # 0-d state
            opt = cls([*m.parameters(), scalar], lr=0.1)
            # fullgraph: no graph break (torch's own classes break the graph here)
            compiled = (
                torch.compile(opt.step, fullgraph=True, backend="aot_eager")
                if cls is fo_cls(name)
                else opt.step
            )
            x, y = data()
            for i in range(first_compiled + 3):
                opt.zero_grad()
                (loss_fn(m, x, y) + scalar**2).backward()
                with torch._dynamo.config.patch(error_on_recompile=i > first_compiled):
                    (compiled if i >= first_compiled else opt.step)()
            return [p.detach() for p in m.parameters()], scalar.detach(), opt.state_dict()["state"]

    twin(name, scenario, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("given", [{}, {"weight_decay": 0.0}], ids=["unnamed", "named"])
def test_group_sets_a_factory_argument_the_constructor_did_not_name(given):
    """HF Trainer and timm give groups a weight_decay that the constructor never named:
    the group's value is used (it was dropped), and a key that is no argument of the
    factory stays in the group, as torch keeps it, without reaching the factory."""
    torch.manual_seed(0)
    w0 = torch.randn(5)
    ours, theirs = torch.nn.Parameter(w0.clone()), torch.nn.Parameter(w0.clone())
    opt = fo.Optimizer([{"params": [ours], "weight_decay": 0.5, "tag": "decay"}], fo.nadam, lr=0.1, **given)
    reference = torch.optim.NAdam([{"params": [theirs], "weight_decay": 0.5, "tag": "decay"}], lr=0.1)
    for _ in range(3):
        g = torch.randn(5)
        ours.grad, theirs.grad = g.clone(), g.clone()
        opt.step()
        reference.step()
    torch.testing.assert_close(ours.data, theirs.data)
    assert opt.param_groups[0]["tag"] == "decay" and opt.param_groups[0]["weight_decay"] == 0.5


def test_optimizer_built_in_a_compiled_frame_steps():
    """torch.compile breaks the graph in torch.optim.Optimizer.__init__; attributes set
    before it were lost there, and step() failed on the missing transformation."""
    p, q = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    opt = torch.compile(lambda: fo.NAdam([p], lr=0.1), backend="eager")()
    generic = torch.compile(lambda: fo.Optimizer([q], fo.nadam, lr=0.1), backend="eager")()
    reference = torch.nn.Parameter(torch.ones(2))
    torch_opt = torch.optim.NAdam([reference], lr=0.1)
    for t in (p, q, reference):
        t.grad = torch.tensor([1.0, -2.0])
    opt.step()
    generic.step()
    torch_opt.step()
    torch.testing.assert_close(p.data, reference.data)
    torch.testing.assert_close(q.data, reference.data)


def test_compiled_chain_step_warns_nothing_and_steps_as_eager():
    """``torch.compile(opt.step)`` of an `fo.Optimizer` over a chain (its pure update,
    written back) raises no warning from dynamo, as torch's classes compile, and steps
    as the eager optimizer does."""
    factory = lambda lr: fo.chain(fo.scale_by_adam(), fo.scale_by_learning_rate(lr))  # noqa: E731
    torch._dynamo.reset()
    results = []
    for compiled in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        opt = fo.Optimizer(model.parameters(), factory, lr=0.01)
        step = torch.compile(opt.step) if compiled else opt.step
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(3):
                opt.zero_grad()
                model(torch.randn(3, 4)).sum().backward()
                step()
        results.append([p.detach() for p in model.parameters()])
    torch.testing.assert_close(results[1], results[0])


def test_a_users_algorithm_with_a_torch_name_takes_no_torch_habits():
    """torch's Adagrad makes its state at construction; funcopt's Adagrad algorithm, run by
    `fo.Optimizer`, does too. A user's algorithm that takes the name (here a copy of it)
    is not torch's class, and makes its state at the first step, as any other."""
    adagrad = fo.engine.registered("Adagrad")
    mine = dataclasses.replace(adagrad)
    p = torch.nn.Parameter(torch.ones(2))
    hyperparams = dict(
        lr=0.1, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10, maximize=False
    )
    assert fo.Optimizer([p], adagrad, **hyperparams).state[p]
    opt = fo.Optimizer([p], mine, **hyperparams)
    assert not opt.state
    p.grad = torch.ones(2)
    opt.step()
    assert set(opt.state[p]) == {"step", "sum"}
