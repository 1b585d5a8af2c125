"""Reading a run directory's metrics.json across the layouts morlfed has written."""

from __future__ import annotations

import json

import pytest

from morlfed.analysis.run_files import RunDirError, read_info


def test_a_vision_run_names_its_partition_and_an_older_one_reads_the_same(tmp_path):
    base = {"task": "vision", "algo": "fedavg", "label": "fedavg", "data": "digits", "seed": 0, "finetune": False}
    (tmp_path / "metrics.json").write_text(json.dumps({**base, "partition": "iid"}))
    assert read_info(tmp_path)["partition"] == "iid"
    # before the partition group had its own name, a vision run stored it as dist
    (tmp_path / "metrics.json").write_text(json.dumps({**base, "dist": "iid"}))
    info = read_info(tmp_path)
    assert info["partition"] == "iid" and "dist" not in info
    (tmp_path / "metrics.json").write_text(json.dumps(base))
    with pytest.raises(RunDirError, match=r"missing key\(s\) \['partition'\]"):
        read_info(tmp_path)
