"""``bench/env_step.py``: the envs' own cost per step, and the stepping floor of a default round."""

from __future__ import annotations

import pytest
from conftest import load_bench


def test_it_prints_each_envs_step_cost_and_round_floor(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_bench("env_step")
    assert bench.main(["--envs", "deep-sea-treasure", "minecart", "--steps", "300"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:3]}
    assert set(rows) == {"deep-sea-treasure", "minecart"}
    for name, words in rows.items():
        per_step_us, round_s = float(words[1]), float(words[-1].rstrip("s"))
        assert per_step_us > 0
        # the round's floor is the step cost times the spec's default clients x local steps
        spec = bench.get_spec(name)
        assert round_s == pytest.approx(per_step_us * 1e-6 * spec.n_clients * spec.local_steps, rel=0.05, abs=0.06)
