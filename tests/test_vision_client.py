"""The vision client honours the client protocol as the RL client does.

Every FitTask option, per-model losses measured before training, proximal and personal terms, seeded
training that never touches the global RNG, and L-/S-/G-acc evaluation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from morlfed.core.protocol import FitTask
from morlfed.tasks.vision.client import VisionClient, s_acc_clients
from morlfed.tasks.vision.experiment import VisionSetup
from morlfed.tasks.vision.models import build_model

N = 4
MODEL = {"name": "mlp", "hidden": [16]}


def setup_for(seed: int = 0, s_share: float = 0.5) -> VisionSetup:
    data = {"name": "digits", "batch_size": 16, "lr": 0.1, "s_share": s_share}
    return VisionSetup.from_config(data, MODEL, {"name": "dirichlet", "alpha": 1.0}, N, seed)


@pytest.fixture(scope="module")
def setup() -> VisionSetup:
    return setup_for()


def client(setup: VisionSetup, cid: int = 0, seed: int = 0, epochs: int = 1) -> VisionClient:
    return setup.client_factory(seed, epochs)(cid)


def reference_loss(setup: VisionSetup, cid: int, params: torch.Tensor) -> float:
    """Mean cross-entropy of ``params`` on client ``cid``'s training data, computed independently."""
    model = build_model("mlp", (1, 8, 8), 10, torch.Generator(), hidden=[16])
    names = [n for n, _ in model.named_parameters()]
    sizes = [p.numel() for p in model.parameters()]
    model.load_state_dict({n: t.view_as(p) for n, t, p in zip(names, params.split(sizes), model.parameters())})
    idx = torch.as_tensor(setup.partition.train[cid])
    with torch.no_grad():
        return float(F.cross_entropy(model(setup.dataset.inputs(idx)), setup.dataset.labels[idx]))


def test_layout_declares_the_classifier_as_head_and_clients_share_the_initial_model(setup):
    a, b = client(setup, 0), client(setup, 1)
    assert a.layout.head == ("head.weight", "head.bias")
    assert a.layout.dim == 64 * 16 + 16 + 16 * 10 + 10
    assert torch.equal(a.initial_params(), b.initial_params())
    assert not torch.equal(a.initial_params(), client(setup, 0, seed=1).initial_params())


def test_fit_is_seeded_per_client_and_round_and_leaves_the_global_rng_alone(setup):
    torch_state, np_state = torch.random.get_rng_state(), np.random.get_state()[1].copy()
    start = client(setup).initial_params()
    first = client(setup).fit(FitTask(start, round=1))
    again = client(setup).fit(FitTask(start, round=1))
    later = client(setup).fit(FitTask(start, round=2))
    assert torch.equal(first.params, again.params) and not torch.equal(first.params, later.params)
    assert torch.equal(torch.random.get_rng_state(), torch_state) and np.array_equal(np.random.get_state()[1], np_state)


def test_training_lowers_the_loss_and_reports_metrics(setup):
    c = client(setup, epochs=5)
    start = c.initial_params()
    res = c.fit(FitTask(start, round=1, report_losses=True))
    assert res.num_samples == c.num_train == len(setup.partition.train[0])
    assert res.losses.shape == (1,) and res.losses[0] == pytest.approx(reference_loss(setup, 0, start), rel=1e-5)
    assert reference_loss(setup, 0, res.params) < 0.5 * reference_loss(setup, 0, start)
    m = res.metrics
    assert 0 <= m["train_accuracy"] <= 100 and m["train_reward"] == m["train_accuracy"] and m["train_loss"] > 0
    assert res.model_index is None


def test_train_all_returns_each_model_trained_as_train_best_would_and_the_received_losses(setup):
    start = client(setup, 1).initial_params()
    models = torch.stack([start, start + 0.05 * torch.randn(start.shape, generator=torch.Generator().manual_seed(1))])
    res = client(setup, 1).fit(FitTask(models.clone(), round=3, train_all=True, report_losses=True))
    assert res.params.shape == models.shape and res.model_index is None
    expected = torch.tensor([reference_loss(setup, 1, m) for m in models])
    torch.testing.assert_close(res.losses, expected, rtol=1e-5, atol=1e-6)
    worse = start + 3.0 * torch.randn(start.shape, generator=torch.Generator().manual_seed(2))
    for k in range(2):  # model k among a far worse one: train_best trains model k alone, in its slot k
        pair = models.clone()
        pair[1 - k] = worse
        one = client(setup, 1).fit(FitTask(pair, round=3, train_best=True))
        assert one.params.shape == start.shape and one.model_index == k
        torch.testing.assert_close(one.params, res.params[k], rtol=0, atol=1e-6)


def test_train_best_trains_the_lowest_loss_model_and_breaks_exact_ties_at_random(setup):
    c = client(setup, 2)
    start = c.initial_params()
    good = client(setup, 2, epochs=5).fit(FitTask(start, round=1)).params  # fits client 2's data
    res = c.fit(FitTask(torch.stack([start, good]), round=2, train_best=True))
    assert res.model_index == 1 and res.losses[1] < res.losses[0] and res.params.shape == start.shape
    tied = torch.stack([start, start, start])
    picks = [c.fit(FitTask(tied.clone(), round=r, train_best=True)).model_index for r in range(1, 13)]
    assert len(set(picks)) > 1
    assert picks == [
        client(setup, 2).fit(FitTask(tied.clone(), round=r, train_best=True)).model_index for r in range(1, 13)
    ]


def test_proximal_term_pulls_the_trained_model_to_its_centre(setup):
    start = client(setup).initial_params()
    free = client(setup, epochs=3).fit(FitTask(start, round=1)).params
    tied = client(setup, epochs=3).fit(FitTask(start, round=1, prox_mu=5.0)).params
    assert (tied - start).norm() < 0.5 * (free - start).norm()
    centre = start + 1.0
    pulled = client(setup, epochs=3).fit(FitTask(start, round=1, prox_mu=5.0, prox_centre=centre)).params
    assert (pulled - centre).norm() < (free - centre).norm()
    c = client(setup)
    c.fit(FitTask(start, round=1, prox_mu=1.0))
    assert c._optimizer is None  # the wrapper is gone after the fit


def test_personal_model_is_trained_towards_the_shared_one_kept_and_evaluated(setup):
    c = client(setup, 3, epochs=2)
    start = c.initial_params()
    assert c.evaluate(None, 0).metrics == c.evaluate(start, 0).metrics  # no personal model yet: the initial one
    res = c.fit(FitTask(torch.stack([start, start]), round=1, train_best=True, personal_lambda=0.1))
    personal = c.personal_model(3)
    assert personal is not None and not torch.equal(personal, res.params)
    assert {"personal_train_loss", "personal_train_accuracy"} <= set(res.metrics)
    assert c.evaluate(None, 0).metrics == c.evaluate(personal, 0).metrics
    state = c.get_state(3)
    c.fit(FitTask(res.params, round=2, personal_lambda=0.1))
    assert not torch.equal(c.personal_model(3), state["personal"])
    c.set_state(3, state)
    assert torch.equal(c.personal_model(3), state["personal"])
    # The personal model continues from its own state; lambda pulls it to the newly trained shared model.
    gaps = {}
    for lam in (0.0, 5.0):
        c = client(setup, 3, epochs=2)
        c.fit(FitTask(start, round=1, personal_lambda=lam))
        shared = c.fit(FitTask(start + 0.3, round=2, personal_lambda=lam)).params
        gaps[lam] = float((c.personal_model(3) - shared).norm() / (shared - start).norm())
    assert gaps[0.0] > 0.9 and gaps[5.0] < 0.1


def test_evaluation_reports_l_s_and_g_accuracy():
    for share, same_as in ((0.0, "l_acc"), (1.0, "g_acc")):
        s = setup_for(s_share=share)
        c = client(s, 1, epochs=3)
        params = c.fit(FitTask(c.initial_params(), round=1)).params
        ev = c.evaluate(params, 0)
        assert ev.metrics["s_acc"] == pytest.approx(ev.metrics[same_as])
    s = setup_for()
    params = client(s, 0, epochs=3).fit(FitTask(client(s, 0).initial_params(), round=1)).params
    evs = [client(s, cid).evaluate(params, 0) for cid in range(N)]
    assert len({round(e.metrics["g_acc"], 9) for e in evs}) == 1  # the same model on the same pooled data
    model = build_model("mlp", (1, 8, 8), 10, torch.Generator(), hidden=[16])
    sizes = [p.numel() for p in model.parameters()]
    with torch.no_grad():
        for p, t in zip(model.parameters(), params.split(sizes)):
            p.copy_(t.view_as(p))
        for cid, ev in enumerate(evs):
            idx = torch.as_tensor(s.partition.test[cid])
            pred = model(s.dataset.inputs(idx)).argmax(1)
            assert ev.metrics["l_acc"] == pytest.approx(100 * float((pred == s.dataset.labels[idx]).double().mean()))
            assert ev.scalarised == ev.metrics["l_acc"] and ev.vector_return.shape == (0,)
    others = s_acc_clients(0, 21, 0.5, seed=3)
    assert len(others) == 10 and 0 not in others and np.array_equal(others, s_acc_clients(0, 21, 0.5, seed=3))


@pytest.mark.parametrize(
    "change, message",
    [
        ({"params": torch.zeros(7)}, r"shape \[1210\] or \[K, 1210\]"),
        ({"train_all": True}, r"train_all needs \[K, 1210\] params"),
        ({"params": torch.zeros(2, 1210)}, r"need one of train_best or train_all"),
        ({"prox_mu": -1.0}, r"prox_mu must be a finite number >= 0"),
        (
            {"params": torch.zeros(2, 1210), "train_all": True, "personal_lambda": 1.0},
            r"cannot be combined with train_all",
        ),
    ],
)
def test_tasks_the_client_cannot_honour_raise_value_error(setup, change, message):
    task = FitTask(**{"params": torch.zeros(1210), **change})
    with pytest.raises(ValueError, match=message):
        client(setup).fit(task)


@pytest.mark.parametrize("epochs", [0, 2.5])
def test_a_local_budget_that_is_not_a_positive_integer_is_refused(setup, epochs):
    with pytest.raises(ValueError, match=f"local_steps must be an integer >= 1, got {epochs}"):
        client(setup, epochs=epochs)
