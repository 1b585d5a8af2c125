"""Vision datasets: digits is built in; missing datasets are a clear error, found early.

A torchvision dataset that is missing, or torchvision itself, is a clear error naming what to do,
found before anything is imported or downloaded.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from morlfed.tasks.vision.data import DATASETS, DatasetUnavailable, check_dataset_files, load_dataset

HAS_TORCHVISION = importlib.util.find_spec("torchvision") is not None


def test_digits_is_built_in_and_normalised():
    ds = load_dataset("digits")
    assert len(ds) == 1797 and ds.input_shape == (1, 8, 8) and ds.n_classes == 10
    assert ds.images.dtype == torch.uint8 and int(ds.images.max()) <= 16
    x = ds.inputs(torch.arange(len(ds)))
    assert x.dtype == torch.float32 and abs(float(x.mean())) < 1e-4 and abs(float(x.std()) - 1) < 1e-3
    assert load_dataset("digits") is ds  # loaded once per process


def test_unknown_dataset_lists_the_valid_names():
    with pytest.raises(
        DatasetUnavailable, match=r"unknown dataset 'svhn'; valid: digits, mnist, fashion-mnist, cifar10, cifar100"
    ):
        load_dataset("svhn")


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_torchvision_dataset_needs_a_root(name):
    with pytest.raises(
        DatasetUnavailable,
        match=rf"data={name} is read from a local folder: set data.root=DIR, a folder holding "
        rf"{DATASETS[name].folder}/ .* or add data.download=true",
    ):
        load_dataset(name)


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_missing_dataset_says_where_to_put_which_files(name, tmp_path):
    info = DATASETS[name]
    folder = tmp_path / info.folder
    folder.mkdir(parents=True)
    (folder / info.files[0]).write_bytes(b"")  # one file present, the others missing
    with pytest.raises(DatasetUnavailable) as err:
        load_dataset(name, tmp_path)
    message = str(err.value)
    assert f"dataset {name} not found: {folder} lacks {', '.join(info.files[1:])}." in message
    assert f"data.root={tmp_path} must hold {info.folder}/" in message and "data.download=true" in message
    assert not (tmp_path / info.folder / info.files[1]).exists()  # nothing was downloaded


def test_files_present_or_download_pass_the_file_check(tmp_path):
    info = DATASETS["cifar10"]
    check_dataset_files(info, tmp_path, download=True)  # torchvision will fetch them into root
    (tmp_path / info.folder).mkdir()
    for f in info.files:
        (tmp_path / info.folder / f).write_bytes(b"")
    check_dataset_files(info, tmp_path, download=False)


@pytest.mark.skipif(HAS_TORCHVISION, reason="torchvision is installed here")
def test_missing_torchvision_names_the_extra(tmp_path):
    info = DATASETS["mnist"]
    (tmp_path / info.folder).mkdir(parents=True)
    for f in info.files:
        (tmp_path / info.folder / f).write_bytes(b"")
    with pytest.raises(
        DatasetUnavailable, match=r"need torchvision, which cannot be imported .* -m pip install -e '\.\[vision\]'"
    ):
        load_dataset("mnist", tmp_path)
