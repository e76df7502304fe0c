"""What a non-editable ``pip install .`` gets: every subpackage, the embedded model without its training artefacts,
the presets and launch files, and console scripts that resolve to real functions."""

from __future__ import annotations

import configparser
import importlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("oxygen_ros", "config", "launch", "resource", "setup.py", "setup.cfg", "pyproject.toml", "package.xml",
           "README.md", "LICENSE")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(path, src / name)
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(src)], check=True, capture_output=True, timeout=300)
    return zipfile.ZipFile(next(out.glob("oxygen_ros-*.whl")))


def test_every_package_and_the_model_ship(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    packages = {str(p.parent.relative_to(REPO)) for p in (REPO / "oxygen_ros").rglob("*.py")
                if "__pycache__" not in p.parts}
    for package in packages:
        assert f"{package}/__init__.py" in names, f"{package} is not a package (missing from a pip install)"
    toy = "oxygen_ros/toy/model/"
    assert {toy + f for f in ("model.safetensors", "config.json", "norm_stats.json", "tokenizer.model")} <= names
    assert not {n for n in names if n.startswith(toy) and ("train_log" in n or "train_curves" in n)}
    data = [n for n in names if ".data/data/share/oxygen_ros/" in n]
    assert any(n.endswith("config/tabletop.yaml") for n in data) and any(n.endswith("oxygen.launch.py") for n in data)


def test_console_scripts_resolve(wheel: zipfile.ZipFile) -> None:
    info = next(n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    parser = configparser.ConfigParser()
    parser.read_string(wheel.read(info).decode())
    scripts = dict(parser["console_scripts"])
    assert {"oxygen-node", "oxygen-sim", "oxygen-demo", "oxygen-bench", "oxygen-evaluate-bag"} <= set(scripts)
    for name, target in scripts.items():
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), name
