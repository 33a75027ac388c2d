"""fo.Optimizer runs any transformation or factory as a torch.optim.Optimizer: torch-named
factories, optax-named building blocks in a chain, and the wrappers. Each steps as its
functional update does (the oracle: ``tx.update`` and ``fo.apply_updates`` on the same
params and gradients), a param group may set any argument of the factory, and the state
survives torch.save / torch.load(weights_only=True) and torch.distributed.checkpoint,
resuming bit for bit. inject_hyperparams' values are the param groups' (so lr schedulers
drive them)."""

from __future__ import annotations

import io
from typing import Any

import optree
import pytest
import torch
import torch.distributed.checkpoint as dcp
from helpers import assert_same
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

import funcopt as fo


def adamw_chain(lr: float, weight_decay: float) -> fo.GradientTransformation:
    return fo.chain(fo.scale_by_adam(), fo.add_decayed_weights(weight_decay), fo.scale_by_learning_rate(lr))


def clipped_rms(lr: float) -> fo.GradientTransformation:
    return fo.chain(
        fo.clip_by_global_norm(1.0), fo.scale_by_rms(bias_correction=True), fo.scale_by_learning_rate(lr)
    )


def multi_steps(lr: float) -> fo.GradientTransformation:
    return fo.MultiSteps(fo.adam(lr=lr), every_k_schedule=2)


def if_finite(lr: float) -> fo.GradientTransformation:
    return fo.apply_if_finite(fo.adam(lr=lr, amsgrad=True), max_consecutive_errors=2)


def matrices_only(lr: float) -> fo.GradientTransformation:
    return fo.masked(fo.adam(lr=lr), lambda ps: optree.tree_map(lambda p: p.ndim > 1, ps))


def scheduled_adamw(lr: float) -> fo.GradientTransformation:
    return fo.adamw(lr=fo.linear_schedule(lr, lr / 10, transition_steps=4))


# name -> (factory, the constructor's hyperparameters)
CASES: dict[str, tuple[Any, dict[str, Any]]] = {
    "fo.adam": (fo.adam, {"lr": 0.05, "amsgrad": True}),
    "fo.sgd": (fo.sgd, {"lr": 0.1, "momentum": 0.9}),  # no momentum_buffer before the first step
    "fo.nadam": (fo.nadam, {"lr": 0.05, "weight_decay": 0.1}),
    "chain of building blocks": (adamw_chain, {"lr": 0.05, "weight_decay": 0.1}),
    "clip, scale_by_rms": (clipped_rms, {"lr": 0.05}),
    "inject_hyperparams(fo.adamw)": (fo.inject_hyperparams(fo.adamw), {"lr": 0.05}),
    "MultiSteps": (multi_steps, {"lr": 0.05}),
    "apply_if_finite": (if_finite, {"lr": 0.05}),
    "masked": (matrices_only, {"lr": 0.05}),
    "schedule_free_adamw": (fo.schedule_free_adamw, {"learning_rate": 0.05, "weight_decay": 0.1}),
    "a schedule": (scheduled_adamw, {"lr": 0.05}),
}
SHAPES = [(4, 3), (4,), (5,), ()]


def gradients(steps: int, seed: int = 1, case: str = "") -> list[list[torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = [[torch.randn(s, generator=g) for s in SHAPES] for _ in range(steps)]
    if case == "apply_if_finite":
        out[1][0] = torch.full(SHAPES[0], float("inf"))  # a step it skips
    return out


def new_params(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).requires_grad_() for s in SHAPES]


def step(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    for p, g in zip(params, grads):
        p.grad = g.clone()
    optimizer.step()


@pytest.mark.parametrize("case", CASES)
def test_steps_as_its_functional_update(case):
    factory, hp = CASES[case]
    params = new_params()
    optimizer = fo.Optimizer(params, factory, **hp)
    tx = factory(**hp)
    keys = [str(i) for i in range(len(params))]
    f_params = {k: p.detach().clone() for k, p in zip(keys, params)}
    f_state = tx.init(f_params)
    # a chain of building blocks steps in place (chain_inplace.py), with the pure update's ops
    for grads in gradients(5, case=case):
        step(optimizer, params, grads)
        updates, f_state = tx.update(dict(zip(keys, grads)), f_state, f_params)
        f_params = fo.apply_updates(f_params, updates)
        assert_same([p.detach() for p in params], list(f_params.values()), rtol=0, atol=0)
    assert_same(fo.functional_state(optimizer, f_params), f_state, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["Adam", "SGD", "NAdam", "AdamW", "Adagrad"])
def test_torch_named_factory_steps_as_torch_class(name):
    hp = {"lr": 0.05, "weight_decay": 0.1}
    if name == "SGD":
        hp["momentum"] = 0.9
    ours, ref = new_params(), new_params()
    optimizer = fo.Optimizer(ours, getattr(fo, name.lower()), **hp)
    reference = getattr(torch.optim, name)(ref, **hp)
    for grads in gradients(3, seed=2):  # finite ones
        step(optimizer, ours, grads)
        step(reference, ref, grads)
    assert_same(ours, ref)


def test_param_groups_override_any_factory_argument():
    """A group sets hyperparameters the constructor named (lr) and others it did not
    (amsgrad, eps, betas of fo.adam), as torch.optim's groups do."""
    ours, ref = new_params(), new_params()
    groups = (
        lambda ps: [  # noqa: E731
            {"params": ps[:1], "amsgrad": True, "eps": 1e-3},
            {"params": ps[1:3], "lr": 0.01, "betas": (0.8, 0.9)},
            {"params": ps[3:]},
        ]
    )
    optimizer = fo.Optimizer(groups(ours), fo.adam, lr=0.05)
    reference = torch.optim.Adam(groups(ref), lr=0.05)
    # every argument of the factory is in every group, at its default unless set (issue 62)
    assert [g["amsgrad"] for g in optimizer.param_groups] == [g["amsgrad"] for g in reference.param_groups]
    for grads in gradients(3, seed=2):
        step(optimizer, ours, grads)
        step(reference, ref, grads)
    assert_same(ours, ref)
    assert sorted(optimizer.state[ours[0]]) == ["exp_avg", "exp_avg_sq", "max_exp_avg_sq", "step"]


@pytest.mark.parametrize(
    "factory,defaults,override",
    [
        (adamw_chain, {"lr": 0.05, "weight_decay": 0.1}, {"weight_decay": 0.5}),
        (fo.inject_hyperparams(fo.adamw), {"lr": 0.05}, {"weight_decay": 0.3, "betas": (0.8, 0.9)}),
        (fo.schedule_free_adamw, {"learning_rate": 0.05}, {"b1": 0.8, "weight_decay": 0.2}),
        (multi_steps, {"lr": 0.05}, {"lr": 0.01}),
    ],
    ids=["chain", "inject_hyperparams", "schedule_free_adamw", "MultiSteps"],
)
def test_a_group_steps_as_an_optimizer_of_its_values(factory, defaults, override):
    """Groups step apart, each as an optimizer made with its values would."""
    ours, alone = new_params(), new_params()
    optimizer = fo.Optimizer([{"params": ours[:2]}, {"params": ours[2:], **override}], factory, **defaults)
    first = fo.Optimizer(alone[:2], factory, **defaults)
    second = fo.Optimizer(alone[2:], factory, **{**defaults, **override})
    for grads in gradients(3, seed=2):
        step(optimizer, ours, grads)
        step(first, alone[:2], grads[:2])
        step(second, alone[2:], grads[2:])
    assert_same(ours, alone, rtol=0, atol=0)


def train(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], grads_seq) -> None:
    for grads in grads_seq:
        step(optimizer, params, grads)


@pytest.mark.parametrize("case", CASES)
def test_state_dict_save_and_load_resumes_bit_for_bit(case):
    factory, hp = CASES[case]
    grads_seq = gradients(6, case=case)
    straight = new_params()
    uninterrupted = fo.Optimizer(straight, factory, **hp)
    train(uninterrupted, straight, grads_seq)

    params = new_params()
    first = fo.Optimizer(params, factory, **hp)
    train(first, params, grads_seq[:3])
    buffer = io.BytesIO()
    torch.save({"params": [p.detach() for p in params], "optimizer": first.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)
    resumed = [p.clone().requires_grad_() for p in checkpoint["params"]]
    second = fo.Optimizer(resumed, factory, **hp)
    second.load_state_dict(checkpoint["optimizer"])
    # dtypes as a new state makes them (torch's load casts all but 'step' to the params')
    assert_same(second.state_dict(), first.state_dict(), rtol=0, atol=0)
    train(second, resumed, grads_seq[3:])
    assert_same(resumed, straight, rtol=0, atol=0)
    assert_same(second.state_dict(), uninterrupted.state_dict(), rtol=0, atol=0)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 4)
        self.scale = torch.nn.Parameter(torch.ones(5))
        self.offset = torch.nn.Parameter(torch.zeros(()))

    def loss(self, x: torch.Tensor) -> torch.Tensor:
        return (self.linear(x).tanh().sum(1, keepdim=True) * self.scale).pow(2).mean() + self.offset.cos()


def train_model(model: Model, optimizer: torch.optim.Optimizer, batches: list[torch.Tensor]) -> None:
    for x in batches:
        optimizer.zero_grad()
        model.loss(x).backward()
        optimizer.step()


@pytest.mark.parametrize("case", CASES)
def test_distributed_checkpoint_resumes_bit_for_bit(case, tmp_path):
    """torch.distributed.checkpoint in one process: get_optimizer_state_dict, dcp.save,
    then a new model and optimizer, dcp.load and set_optimizer_state_dict."""
    factory, hp = CASES[case]
    batches = [torch.randn(8, 3, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    torch.manual_seed(0)
    straight = Model()
    torch.manual_seed(0)
    model = Model()
    uninterrupted = fo.Optimizer(straight.parameters(), factory, **hp)
    train_model(straight, uninterrupted, batches)
    optimizer = fo.Optimizer(model.parameters(), factory, **hp)
    train_model(model, optimizer, batches[:3])
    with pytest.warns(UserWarning, match="single process"):
        dcp.save(
            {"model": model.state_dict(), "optim": get_optimizer_state_dict(model, optimizer)},
            checkpoint_id=tmp_path,
        )

    resumed = Model()
    again = fo.Optimizer(resumed.parameters(), factory, **hp)
    state = {"model": resumed.state_dict(), "optim": get_optimizer_state_dict(resumed, again)}
    with pytest.warns(UserWarning, match="single process"):
        dcp.load(state, checkpoint_id=tmp_path)
    resumed.load_state_dict(state["model"])
    set_optimizer_state_dict(resumed, again, state["optim"])
    assert_same(again.state_dict(), optimizer.state_dict(), rtol=0, atol=0)
    train_model(resumed, again, batches[3:])
    assert_same(list(resumed.parameters()), list(straight.parameters()), rtol=0, atol=0)
    assert_same(again.state_dict(), uninterrupted.state_dict(), rtol=0, atol=0)


def test_inject_hyperparams_values_are_the_groups_and_follow_a_scheduler():
    """With inject_hyperparams, group['lr'] is the injected lr: a scheduler that changes it
    changes the step, and the state's hyperparams record the values of the last step.
    The oracle replaces state.hyperparams['lr'] between functional updates."""
    params = new_params()
    optimizer = fo.Optimizer(
        [{"params": params[:2]}, {"params": params[2:], "weight_decay": 0.3}],
        fo.inject_hyperparams(fo.adamw),
        lr=0.1,
    )
    assert [g["lr"] for g in optimizer.param_groups] == [0.1, 0.1]
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    txs = [fo.inject_hyperparams(fo.adamw)(lr=0.1), fo.inject_hyperparams(fo.adamw)(lr=0.1, weight_decay=0.3)]
    f_params = [p.detach().clone() for p in params]
    f_states = [txs[0].init(f_params[:2]), txs[1].init(f_params[2:])]
    for i, grads in enumerate(gradients(5, seed=2)):
        step(optimizer, params, grads)
        lr = 0.1 * 0.5**i
        for j, (tx, part) in enumerate(zip(txs, (slice(0, 2), slice(2, 4)))):
            s = f_states[j]
            s = s._replace(hyperparams={**s.hyperparams, "lr": torch.full_like(s.hyperparams["lr"], lr)})
            updates, f_states[j] = tx.update(grads[part], s, f_params[part])
            f_params[part] = fo.apply_updates(f_params[part], updates)
        scheduler.step()
        assert_same([p.detach() for p in params], f_params, rtol=0, atol=0)
        assert optimizer.state[params[0]]["hyperparams.lr"] == torch.tensor(lr, dtype=torch.float32)
    assert optimizer.state[params[3]]["hyperparams.weight_decay"] == torch.tensor(0.3, dtype=torch.float32)
    assert optimizer.state[params[0]]["hyperparams.weight_decay"] == torch.tensor(1e-2, dtype=torch.float32)


def test_inject_hyperparams_steps_as_its_factory_in_the_adapter():
    """The adapter passes each group's values to the factory at every step, so
    fo.inject_hyperparams(fo.adamw) is not needed there: it steps as fo.adamw, to
    float32 round-off (it makes the hyperparameters float32 tensors)."""
    ours, plain = new_params(), new_params()
    injected = fo.Optimizer(ours, fo.inject_hyperparams(fo.adamw), lr=0.05, weight_decay=0.2)
    reference = fo.Optimizer(plain, fo.adamw, lr=0.05, weight_decay=0.2)
    for grads in gradients(3, seed=2):
        step(injected, ours, grads)
        step(reference, plain, grads)
    assert_same(ours, plain)


def test_a_shared_slot_is_one_tensor_that_advances_for_every_param():
    """State kept once for all params (a count) is the group's: one tensor, stepped once
    per step, also for a param without a gradient; loaded back, it is one tensor of its
    own dtype again (torch's load casts it to the params' dtype)."""
    params = new_params()
    optimizer = fo.Optimizer(params, adamw_chain, lr=0.05, weight_decay=0.1)
    grads = gradients(3, seed=2)
    step(optimizer, params, grads[2])
    params[1].grad = None
    optimizer.step()
    counts = [optimizer.state[p]["0.count"] for p in params]
    assert all(c is counts[0] for c in counts) and counts[0].dtype == torch.int32 and int(counts[0]) == 2
    other = fo.Optimizer(new_params(), adamw_chain, lr=0.05, weight_decay=0.1)
    other.load_state_dict(optimizer.state_dict())
    loaded = [other.state[p]["0.count"] for p in other.param_groups[0]["params"]]
    assert all(c is loaded[0] for c in loaded) and loaded[0].dtype == torch.int32


def test_lookahead_is_refused_with_what_to_do():
    with pytest.raises(TypeError, match="cannot run fo.lookahead.*functional API"):
        fo.Optimizer(new_params(), lambda lr: fo.lookahead(fo.adam(lr=lr), 2, 0.5), lr=0.1)
