"""precision=bf16: the vectorised DQN's matrix products in bfloat16 (mixed precision).

It is refused where it is not implemented. The vectorised DDPG's bfloat16 steps are checked in
``tests/test_precision_ddpg.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import CliRunner

from morlfed.envs import get_spec
from morlfed.tasks.rl import precision
from morlfed.tasks.rl.task import RLTask
from morlfed.tasks.rl.vectorised.dqn import StackedDQN
from morlfed.tasks.rl.vectorised.engine import stacked_algorithm
from morlfed.tasks.rl.vectorised.learner import Batch


def _learner(precision: str) -> StackedDQN:
    _, learner, _ = stacked_algorithm(get_spec("mo-lunar-lander"), 3, 0, 10_000, "cpu", precision)
    assert isinstance(learner, StackedDQN)
    return learner


def _batch(n: int, size: int, seed: int) -> Batch:
    rng = np.random.default_rng(seed)

    def f(*shape: int) -> torch.Tensor:
        return torch.from_numpy(rng.standard_normal(size=shape).astype(np.float32))

    return Batch(
        observations=f(n, size, 8),
        actions=torch.from_numpy(rng.integers(0, 4, (n, size, 1))),
        next_observations=f(n, size, 8),
        dones=torch.from_numpy((rng.random((n, size, 1)) < 0.1).astype(np.float32)),
        rewards=f(n, size, 1),
    )


def test_a_bf16_step_follows_the_fp32_step() -> None:
    """A bfloat16 step follows the fp32 step on the same clients, parameters and batches.

    Bfloat16 products give the fp32 losses to a bfloat16 rounding and move the parameters the same
    way.
    """
    fp32, bf16 = _learner("fp32"), _learner("bf16")
    start = fp32.online.clone()
    mask, mu, centre = torch.ones(3, dtype=torch.bool), torch.zeros(3), torch.zeros(3, fp32.layout.dim)
    for step in range(3):
        batch = _batch(3, 64, step)
        loss32 = fp32.gradient_step(batch, mask, mu, centre)["loss"]
        loss16 = bf16.gradient_step(batch, mask, mu, centre)["loss"]
        torch.testing.assert_close(loss16, loss32, rtol=2e-2, atol=1e-3)
    assert bf16.online.dtype == torch.float32  # the parameters Adam updates stay float32
    moved32, moved16 = fp32.online - start, bf16.online - start
    cosine = torch.nn.functional.cosine_similarity(moved32, moved16, dim=1)
    assert bool((cosine > 0.95).all()), cosine


def test_bf16_keeps_the_td_errors_of_large_q_values() -> None:
    """Q-values near 50 with TD errors well under 1: the bf16 loss and gradient follow float32's.

    Q-values near 50 are a landing's discounted return. Q-values rounded to bfloat16 (steps of 0.25
    there) would make the TD errors mostly rounding: the first bf16 implementation's losses were
    55-79% high and its gradients' cosine similarity to float32's 0.96-0.99.
    """
    fp32, bf16 = _learner("fp32"), _learner("bf16")
    bias = fp32.mlp.output_names()[-1]
    for learner in (fp32, bf16):
        for i in range(3):
            flat = learner.online[i].clone()
            fp32.mlp.views(flat.unsqueeze(0))[bias].fill_(50.0)
            learner.load(i, flat)
    batch = _batch(3, 128, 0)
    # no terminations and rewards 50 * (1 - gamma): the targets are about 50 too
    batch = Batch(
        batch.observations,
        batch.actions,
        batch.next_observations,
        torch.zeros_like(batch.dones),
        torch.full_like(batch.rewards, 50 * (1 - fp32.gamma)),
    )
    mask, mu, centre = torch.ones(3, dtype=torch.bool), torch.zeros(3), torch.zeros(3, fp32.layout.dim)
    loss32 = fp32.gradient_step(batch, mask, mu, centre)["loss"]
    loss16 = bf16.gradient_step(batch, mask, mu, centre)["loss"]
    assert bool((loss32 < 0.05).all()), loss32  # TD errors well under Huber's threshold of 1
    torch.testing.assert_close(loss16, loss32, rtol=2e-2, atol=0.0)
    grad32, grad16 = fp32.online.grad, bf16.online.grad
    assert grad32 is not None and grad16 is not None
    cosine = torch.nn.functional.cosine_similarity(grad32, grad16, dim=1)
    assert bool((cosine > 0.999).all()), cosine


def test_a_client_outside_the_mask_is_left_exactly_as_it_is() -> None:
    learner = _learner("bf16")
    before = learner.online.clone()
    mask = torch.tensor([True, False, True])
    learner.gradient_step(_batch(3, 64, 0), mask, torch.zeros(3), torch.zeros(3, learner.layout.dim))
    assert torch.equal(learner.online[1], before[1])
    assert not torch.equal(learner.online[0], before[0])


def test_a_loaded_model_reaches_the_next_bf16_step() -> None:
    """The low-precision copies follow load(): a client given new parameters is stepped from them."""
    a, b = _learner("bf16"), _learner("bf16")
    flat = torch.randn(a.layout.dim) * 0.05
    for learner in (a, b):
        learner.load(1, flat)
    mask, mu, centre = torch.ones(3, dtype=torch.bool), torch.zeros(3), torch.zeros(3, a.layout.dim)
    a.gradient_step(_batch(3, 64, 0), mask, mu, centre)  # a's copies were made before the load
    fresh = _learner("bf16")
    fresh.load(1, flat)
    fresh.gradient_step(_batch(3, 64, 0), mask, mu, centre)
    assert torch.equal(a.online[1], fresh.online[1])


def test_an_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16"):
        _learner("fp16")
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16"):
        stacked_algorithm(get_spec("mo-lunar-lander-continuous"), 2, 0, 1000, "cpu", "fp16")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["precision=bf16", "engine=sb3"], "precision=bf16 is implemented by the vectorised engine;"),
        (["precision=fp16"], "precision must be one of fp32, bf16, auto"),
    ],
)
def test_the_cli_refuses_what_is_not_implemented(
    morlfed_cli: CliRunner, tmp_path: Path, overrides: list[str], message: str
) -> None:
    done = morlfed_cli([*overrides, f"hydra.run.dir={tmp_path / 'run'}"])
    assert done.returncode == 2
    assert message in done.stderr
    assert not (tmp_path / "run").exists()


def test_a_bf16_run_records_its_precision(morlfed_cli: CliRunner, tmp_path: Path) -> None:
    args = ["engine=vectorised", "precision=bf16", "n_clients=2", "rounds=1", "local_steps=300", "progress=false"]
    done = morlfed_cli([*args, f"hydra.run.dir={tmp_path / 'run'}"])
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert (metrics["engine"], metrics["precision"]) == ("vectorised", "bf16")


def test_bf16_is_native_where_the_processor_names_bfloat16_instructions(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n")
    assert not precision.bf16_native("cpu", cpuinfo)
    for flag in ("avx512_bf16", "amx_bf16"):
        cpuinfo.write_text(f"processor\t: 0\nflags\t\t: fpu avx512f {flag} avx512bw\n")
        assert precision.bf16_native("cpu", cpuinfo)
    assert not precision.bf16_native("cpu", tmp_path / "absent")


def test_auto_takes_the_spec_precision_only_with_the_vectorised_engine_on_native_bf16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = get_spec("mo-lunar-lander")
    bf16_spec, fp32_spec = spec.replace(precision="bf16"), spec.replace(precision="fp32")
    native = {"value": True}
    monkeypatch.setattr(precision, "bf16_native", lambda device: native["value"])
    assert precision.resolve_precision("auto", bf16_spec, "vectorised", "cpu") == "bf16"
    assert precision.resolve_precision("auto", bf16_spec, "sb3", "cpu") == "fp32"
    assert precision.resolve_precision("auto", fp32_spec, "vectorised", "cpu") == "fp32"
    assert precision.resolve_precision("fp32", bf16_spec, "vectorised", "cpu") == "fp32"  # an explicit setting wins
    prefs = np.full((2, 4), 0.25)
    assert RLTask(bf16_spec, prefs, "auto", "cpu", "auto").precision == "bf16"  # the spec's engine: vectorised
    assert RLTask(bf16_spec, prefs, "sb3", "cpu", "auto").precision == "fp32"
    native["value"] = False  # torch would emulate bfloat16 products, slower than float32 ones
    assert precision.resolve_precision("auto", bf16_spec, "vectorised", "cpu") == "fp32"
    assert RLTask(bf16_spec, prefs, "auto", "cpu", "auto").precision == "fp32"
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16, auto"):
        precision.resolve_precision("fp16", fp32_spec, "vectorised", "cpu")


def test_a_spec_names_bf16_only_for_the_vectorised_engine() -> None:
    with pytest.raises(ValueError, match="precision bf16 is implemented by the vectorised engine;"):
        get_spec("mo-lunar-lander").replace(engine="sb3", precision="bf16")
    with pytest.raises(ValueError, match="precision bf16 is implemented by the vectorised engine;"):
        get_spec("mo-lunar-lander-continuous").replace(precision="bf16")  # its engine: sb3
    assert get_spec("mo-lunar-lander-continuous").replace(engine="vectorised", precision="bf16").precision == "bf16"
    with pytest.raises(ValueError, match="precision must be one of fp32, bf16"):
        get_spec("mo-lunar-lander").replace(precision="fp16")
