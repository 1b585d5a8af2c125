"""Row labels and figure names are built only from morlfed's own settings, as the command line writes them.

That is ``engine=vectorised``, never ``engine.name_vectorised_``; a key that some command line added
by mistake (``+evn=...``) never makes a variant.
"""

from __future__ import annotations

from pathlib import Path

from test_evaluate import write_run

from morlfed import envs
from morlfed.analysis.campaign_figures import run_stem, unique_stems
from morlfed.analysis.runs import Run, load_runs
from morlfed.analysis.variants import variant_labels
from morlfed.metrics import equally_spaced_weights


def test_labels_and_names_are_the_settings_as_typed(tmp_path: Path):
    spec = envs.get_spec("deep-sea-treasure")
    front = envs.known_front(spec)
    front_u = envs.known_front(spec, gamma=1.0)
    assert front is not None and front_u is not None
    w = equally_spaced_weights(2, 3)
    extras: dict[str, dict[str, object]] = {
        "a": {"engine": {"name": "vectorised"}},
        "b": {"engine": {"name": "sb3"}, "evn": "mo-lunar-lander"},  # runs from before +evn= was refused
        "c": {"engine": {"name": "sb3"}, "n_client": 5, "logger": {"_target_": "x.Tensorboard"}},
    }
    for name, extra in extras.items():
        write_run(tmp_path / name, spec, w, front[:3], front_u[:3], seed=ord(name), extra=extra)
    loaded, skipped = load_runs([tmp_path])
    runs = [r for r in loaded if isinstance(r, Run)]
    assert skipped == [] and len(runs) == 3
    labels = variant_labels(runs)
    assert labels == ["fedpref (engine=vectorised)", "fedpref (engine=sb3)", "fedpref (engine=sb3)"]
    assert run_stem(runs[0], labels[0]) == "deep-sea-treasure_fedpref_engine=vectorised_equidistant_seed97"
    many = "fedpref+FT (algo.top_r=0.5, local_steps=100)"
    assert run_stem(runs[0], many) == "deep-sea-treasure_fedpref+FT_algo.top_r=0.5,local_steps=100_equidistant_seed97"


def test_runs_sharing_a_name_get_their_directory_or_a_hash(tmp_path: Path):
    spec = envs.get_spec("deep-sea-treasure")
    front = envs.known_front(spec)
    assert front is not None
    w = equally_spaced_weights(2, 3)
    for folder in ("x/run", "y/run", "y/other"):
        write_run(tmp_path / folder, spec, w, front[:3], front[:3])
    runs = [r for r in load_runs([tmp_path])[0] if isinstance(r, Run)]  # the same configuration and seed, thrice
    stems = unique_stems(runs, ["fedpref"] * 3)
    assert len(set(stems)) == 3
    base = "deep-sea-treasure_fedpref_equidistant_seed0"
    assert stems[1] == f"{base}_other"  # y/other: its directory's name is its own
    assert stems[0] != stems[2] and all(len(s) == len(base) + 7 for s in (stems[0], stems[2]))  # two runs: a hash
