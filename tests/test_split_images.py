from __future__ import annotations

import hashlib
import random
import shutil
import urllib.error
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import CONFIGS, quiet_args
from PIL import Image

from cl_lightning.data import SplitMNIST, SplitTinyImageNet
from cl_lightning.data import split_images as split_module
from cl_lightning.data.mnist import load_mnist
from cl_lightning.data.split_images import find_tiny_imagenet

# Five classes listed out of sorted order in wnids.txt; a class's images are a flat colour plus noise, so an image's
# class can be read back from its mean colour (the class holding a greyscale JPEG is grey itself).
WNIDS = ["n09999999", "n01443537", "n04067472", "n02124075", "n03444034"]
PALETTE = [(128, 128, 128), (230, 30, 30), (30, 200, 40), (40, 60, 220), (220, 200, 30)]
COLOURS = dict(zip(sorted(WNIDS), PALETTE, strict=True))
N_TRAIN, N_VAL = 6, 2


def _jpeg(path: Path, colour: tuple[int, int, int], rng: np.random.Generator, grey: bool = False) -> None:
    pixels = np.clip(np.array(colour)[None, None] + rng.integers(-8, 9, (64, 64, 3)), 0, 255).astype(np.uint8)
    image = Image.fromarray(pixels)
    (image.convert("L") if grey else image).save(path, quality=95)


def build_tiny_imagenet(root: Path) -> Path:
    """A miniature tiny-imagenet-200/ in the real layout (train boxes, val annotations, test folder included)."""
    folder = root / "tiny-imagenet-200"
    rng = np.random.default_rng(0)
    (folder / "val" / "images").mkdir(parents=True)
    (folder / "test" / "images").mkdir(parents=True)
    (folder / "wnids.txt").write_text("\n".join(WNIDS) + "\n")
    (folder / "words.txt").write_text("".join(f"{w}\tthing {w}\n" for w in WNIDS))
    annotations = []
    for w in WNIDS:
        images = folder / "train" / w / "images"
        images.mkdir(parents=True)
        boxes = []
        for i in range(N_TRAIN):
            _jpeg(images / f"{w}_{i}.JPEG", COLOURS[w], rng, grey=(w == WNIDS[1] and i == 0))
            boxes.append(f"{w}_{i}.JPEG\t0\t0\t63\t63\n")
        (folder / "train" / w / f"{w}_boxes.txt").write_text("".join(boxes))
        annotations += [(w, k) for k in range(N_VAL)]
    random.Random(0).shuffle(annotations)  # the real file lists classes interleaved
    lines = []
    for n, (w, _) in enumerate(annotations):
        _jpeg(folder / "val" / "images" / f"val_{n}.JPEG", COLOURS[w], rng)
        lines.append(f"val_{n}.JPEG\t{w}\t0\t0\t63\t63\n")
    (folder / "val" / "val_annotations.txt").write_text("".join(lines))
    _jpeg(folder / "test" / "images" / "test_0.JPEG", (0, 0, 0), rng)
    return folder


@pytest.fixture
def tiny_root(tmp_path: Path) -> Path:
    build_tiny_imagenet(tmp_path)
    return tmp_path


def _stream(root: Path, **kw) -> SplitTinyImageNet:
    args = {"num_tasks": 6, "train_size": 12, "query_size": 4, "chunk_size": 2, "num_classes": 5, "download": False}
    return SplitTinyImageNet(**{**args, **kw}, data_root=str(root))


def _class_of(images: torch.Tensor) -> list[str]:
    """The wnid whose colour is nearest each image's mean colour."""
    means = images.float().mean((-1, -2)) * (255 if images.dtype != torch.uint8 else 1)  # (N, 3)
    palette = torch.tensor([COLOURS[w] for w in sorted(WNIDS)], dtype=torch.float32)
    return [sorted(WNIDS)[i] for i in torch.cdist(means, palette).argmin(1).tolist()]


def test_reads_the_real_layout_with_pil(tiny_root: Path) -> None:
    s = _stream(tiny_root)
    train, val = s.class_images(2)
    assert train.shape == (N_TRAIN, 3, 32, 32)
    assert val.shape == (N_VAL, 3, 32, 32)
    assert train.dtype == torch.uint8
    assert _class_of(train) == [sorted(WNIDS)[2]] * N_TRAIN  # classes in sorted-wnid order, as ImageFolder
    assert _class_of(val) == [sorted(WNIDS)[2]] * N_VAL  # validation images found through val_annotations.txt
    wnid = sorted(WNIDS)[2]
    path = tiny_root / "tiny-imagenet-200" / "train" / wnid / "images" / f"{wnid}_3.JPEG"
    with Image.open(path) as im:
        expected = np.asarray(im.convert("RGB").resize((32, 32), Image.BILINEAR))
    assert torch.equal(train[3], torch.from_numpy(expected).permute(2, 0, 1))
    grey, _ = s.class_images(0)  # n01443537 (listed second): its greyscale JPEG becomes 3 equal channels
    assert torch.equal(grey[0, 0], grey[0, 1])


def test_task_is_a_relabelled_pair_and_regenerates_bit_for_bit(tiny_root: Path) -> None:
    s = _stream(tiny_root)
    seen = set()
    for t in range(6):
        a, b = s.classes(t)
        assert a != b
        assert {a, b} <= set(range(5))
        seen |= {a, b}
        d = s.generate(t)
        assert d.train_x.shape == (12, 3, 32, 32)
        assert d.query_x.shape == (4, 3, 32, 32)
        assert d.train_x.min() >= 0
        assert d.train_x.max() <= 1
        assert d.train_y.bincount().tolist() == [6, 6]
        assert d.query_y.bincount().tolist() == [2, 2]
        names = sorted(WNIDS)
        for x, y in ((d.train_x, d.train_y), (d.query_x, d.query_y)):
            assert _class_of(x) == [names[a] if int(label) == 0 else names[b] for label in y]
    assert len(seen) >= 4  # classes recur and vary across tasks
    fresh = _stream(tiny_root)
    for u, v in zip(s.generate(3), fresh.generate(3), strict=True):
        assert torch.equal(u, v)
    assert not torch.equal(_stream(tiny_root, seed=1).generate(3).train_x, s.generate(3).train_x)


def test_decoded_classes_are_cached_on_disk(tiny_root: Path) -> None:
    s = _stream(tiny_root)
    first = s.generate(0)
    folder = tiny_root / "tiny-imagenet-200"
    cached = sorted(p.name for p in (folder / "cl_lightning_cache" / "32px").iterdir())
    assert cached == sorted(f"{sorted(WNIDS)[c]}.pt" for c in s.classes(0))
    shutil.rmtree(folder / "train")  # a fresh stream must now read the cache, not the JPEGs
    again = _stream(tiny_root).generate(0)
    for u, v in zip(first, again, strict=True):
        assert torch.equal(u, v)


def test_missing_folder_error_names_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(FileNotFoundError, match=r"tiny-imagenet-200\.zip and extract it into") as err:
        find_tiny_imagenet(tmp_path, download=False)
    assert str(tmp_path / "tiny-imagenet-200") in str(err.value)
    assert "data_root" in str(err.value)

    def offline(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(split_module.urllib.request, "urlopen", offline)
    with pytest.raises(FileNotFoundError, match=r"automatic download failed.*no network"):
        _stream(tmp_path, download=True).generate(0)


def _zip_of(folder: Path, archive: Path) -> str:
    with zipfile.ZipFile(archive, "w") as z:
        for p in sorted(folder.rglob("*")):
            z.write(p, p.relative_to(folder.parent))
    return hashlib.md5(archive.read_bytes()).hexdigest()


def test_download_checks_and_extracts_the_archive(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    md5 = _zip_of(build_tiny_imagenet(tmp_path / "server"), tmp_path / "tiny.zip")
    monkeypatch.setattr(split_module, "TINY_IMAGENET_URL", (tmp_path / "tiny.zip").as_uri())
    monkeypatch.setattr(split_module, "TINY_IMAGENET_MD5", "0" * 32)
    with pytest.raises(FileNotFoundError, match="corrupt"):
        find_tiny_imagenet(tmp_path / "bad")
    assert not list((tmp_path / "bad").iterdir())  # the rejected archive is not left behind
    monkeypatch.setattr(split_module, "TINY_IMAGENET_MD5", md5)
    folder = find_tiny_imagenet(tmp_path / "data")
    assert folder == (tmp_path / "data" / "tiny-imagenet-200").resolve()
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["tiny-imagenet-200"]
    s = SplitTinyImageNet(num_tasks=2, train_size=12, query_size=4, chunk_size=2, num_classes=5, data_root=str(folder))
    assert s.generate(1).train_x.shape == (12, 3, 32, 32)  # data_root may also be the folder itself


def test_too_large_a_task_names_the_argument(tiny_root: Path) -> None:
    with pytest.raises(ValueError, match=r"train_size to at most 12"):
        _stream(tiny_root, train_size=20).generate(0)
    with pytest.raises(ValueError, match=r"query_size to at most 4"):
        _stream(tiny_root, query_size=6).generate(0)
    with pytest.raises(ValueError, match="even"):
        _stream(tiny_root, train_size=11)


@pytest.mark.parametrize(
    "config",
    [
        "bp_split_tiny_imagenet",
        "qoa_split_tiny_imagenet",
        "cbp_split_tiny_imagenet",
        "ewc_split_tiny_imagenet",
        "knn_split_tiny_imagenet",
        "full_attention_split_tiny_imagenet",
        "maml_replay_split_tiny_imagenet",
    ],
)
def test_split_tiny_imagenet_runs_end_to_end(tiny_root: Path, tmp_path: Path, config: str) -> None:
    from cl_lightning.run.cli import main

    small = {
        "bp_split_tiny_imagenet": ["--model.init_args.hidden_sizes=[16, 16]"],
        "qoa_split_tiny_imagenet": [
            "--model.init_args.memory_size=8", "--model.init_args.support_size=6", "--model.init_args.hidden=16",
        ],
        "cbp_split_tiny_imagenet": ["--model.init_args.hidden_sizes=[16, 16]"],
        "ewc_split_tiny_imagenet": ["--model.init_args.hidden_sizes=[16, 16]"],
        "knn_split_tiny_imagenet": ["--model.init_args.memory_size=8", "--model.init_args.support_size=6"],
        "full_attention_split_tiny_imagenet": [
            "--model.init_args.memory_size=8", "--model.init_args.support_size=6", "--model.init_args.embed_dim=14",
            "--model.init_args.num_layers=1",
        ],
        "maml_replay_split_tiny_imagenet": [
            "--model.init_args.hidden_sizes=[16]", "--model.init_args.memory_size=8",
            "--model.init_args.num_pseudo_tasks=2", "--model.init_args.support_size=2",
            "--model.init_args.query_size=2", "--model.init_args.inner_steps=1",
        ],
    }[config]  # fmt: skip
    cli = main(
        [
            "--config", str(CONFIGS / f"{config}.yaml"),
            "--data.stream.init_args.num_tasks=3", "--data.stream.init_args.train_size=12",
            "--data.stream.init_args.query_size=4", "--data.stream.init_args.chunk_size=2",
            "--data.stream.init_args.num_classes=5", f"--data.stream.init_args.data_root={tiny_root}",
            "--data.stream.init_args.download=false", "--data.context_size=6", "--data.backward_lag=1",
            "--data.num_probe_tasks=2", *small,
            "--trainer.accelerator=cpu", *quiet_args(tmp_path),
        ],
        run=False,
    )  # fmt: skip
    assert cli.model.input_shape == (3, 32, 32)
    if not config.startswith("knn"):  # kNN works on raw pixels
        encoder = cli.model.net[0] if config.startswith("maml") else cli.model.encoder
        assert encoder.out_features == 1152  # the paper's shared CNN
    cli.trainer.fit(cli.model, cli.datamodule)
    m = cli.trainer.callback_metrics
    assert cli.trainer.current_epoch == 3
    if not config.startswith("knn"):  # kNN does not train
        assert torch.isfinite(m["train/loss"])
    ep = cli.datamodule.stream.episode(2, 6)
    cli.model.eval()
    with torch.set_grad_enabled(config.startswith("maml")):  # MAML adapts on the context at evaluation
        acc = (cli.model.predict_episode(*ep[:3]).argmax(-1) == ep.query_y).float().mean()
    torch.testing.assert_close(m["eval/forward_acc"], acc)
    assert 0 <= m["eval/backward_acc"] <= 1
    assert {"eval/acc_matrix/task_0", "eval/acc_matrix/task_2"} <= set(m)


def test_split_mnist_pairs_digits_and_holds_out_test_images() -> None:
    s = SplitMNIST(num_tasks=50, train_size=200, query_size=40, seed=2)
    train_images, train_labels = load_mnist(None, "train")
    test_images, test_labels = load_mnist(None, "test")
    pairs = {s.classes(t) for t in range(50)}
    assert all(a != b for a, b in pairs)
    assert len(pairs) > 25  # of the 90 ordered pairs
    a, b = s.classes(7)
    d = s.generate(7)
    assert d.train_x.shape == (200, 1, 28, 28)
    assert d.train_y.bincount().tolist() == [100, 100]
    assert d.query_y.bincount().tolist() == [20, 20]
    to_bytes = lambda x: {bytes(im) for im in (x * 255).round().to(torch.uint8).flatten(1).numpy()}  # noqa: E731
    for label, digit in ((0, a), (1, b)):
        assert to_bytes(d.train_x[d.train_y == label]) <= to_bytes(train_images[train_labels == digit].float() / 255)
        assert to_bytes(d.query_x[d.query_y == label]) <= to_bytes(test_images[test_labels == digit].float() / 255)
    for u, v in zip(d, SplitMNIST(num_tasks=50, train_size=200, query_size=40, seed=2).generate(7), strict=True):
        assert torch.equal(u, v)
    assert SplitMNIST(num_tasks=2, image_size=14).generate(0).train_x.shape == (1000, 1, 14, 14)
    with pytest.raises(ValueError, match="query_size to at most 1784"):
        SplitMNIST(num_tasks=3, query_size=2000).generate(0)  # digit 5 has 892 test images


def test_backprop_learns_split_mnist_above_chance(tmp_path: Path) -> None:
    from cl_lightning.run.cli import main

    cli = main(
        [
            "--config", str(CONFIGS / "bp_split_mnist.yaml"),
            "--data.stream.init_args.num_tasks=2", "--data.stream.init_args.train_size=300",
            "--data.stream.init_args.query_size=100", "--data.num_probe_tasks=0", "--data.backward_lag=1",
            "--model.init_args.optimizer.init_args.lr=0.003",
            "--trainer.accelerator=cpu", *quiet_args(tmp_path),
        ],
        run=False,
    )  # fmt: skip
    assert cli.model.input_shape == (1, 28, 28)
    cli.trainer.fit(cli.model, cli.datamodule)
    assert cli.trainer.callback_metrics["eval/forward_acc"] > 0.8  # two digits, chance is 0.5


@pytest.mark.parametrize(
    "config", ["bp_split_mnist", "qoa_split_mnist", "bp_split_tiny_imagenet", "qoa_split_tiny_imagenet"]
)
@pytest.mark.parametrize("quick", [False, True], ids=["paper", "quick"])
def test_split_configs_instantiate(config: str, quick: bool, tmp_path: Path) -> None:
    from cl_lightning.run.cli import main

    args = ["--config", str(CONFIGS / f"{config}.yaml")] + (["--config", str(CONFIGS / "quick.yaml")] if quick else [])
    cli = main([*args, f"--trainer.logger.init_args.save_dir={tmp_path}"], run=False)
    assert cli.trainer.max_epochs == cli.datamodule.num_tasks == (30 if quick else 9000)
    assert cli.model.input_shape == ((1, 28, 28) if "mnist" in config else (3, 32, 32))
    assert cli.model.num_outputs == 2
    assert cli.model.encoder.out_features == 1152
    if "qoa" in config:
        assert cli.model.scorer.first.in_features == 2 * 1152  # no label input (the plotted "V1" code)
        assert (cli.model.buffer.capacity, cli.model.support_size) == (200, 180)
