"""Copy, from a clone of ros/rosdistro, the rules for every dependency key in package.xml (Jazzy, Ubuntu noble).

    python tools/rosdep_keys.py ROSDISTRO_GIT_DIR [--out test/fixtures/rosdep/keys.yaml]

For each key: the Jazzy release that provides it (jazzy/distribution.yaml), else its rule in rosdep/base.yaml or
rosdep/python.yaml (ubuntu only), else nothing (the test then fails on it). The output names the rosdistro commit it
was read from. test/test_rosdep_keys.py checks package.xml against the copy (no network in the test).
"""

from __future__ import annotations

import argparse
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DEPEND_TAGS = ("depend", "build_depend", "buildtool_depend", "build_export_depend", "exec_depend", "test_depend",
               "doc_depend", "buildtool_export_depend")
ROSDEP_FILES = ("rosdep/base.yaml", "rosdep/python.yaml")


def package_keys(package_xml: Path) -> list[str]:
    """Every dependency key of ``package_xml``, in file order, without repeats."""
    keys: list[str] = []
    for element in ET.parse(package_xml).getroot():
        if element.tag in DEPEND_TAGS and element.text and element.text.strip() not in keys:
            keys.append(element.text.strip())
    return keys


def _show(git_dir: Path, path: str) -> str:
    return subprocess.run(["git", "--git-dir", str(git_dir), "show", f"HEAD:{path}"], check=True,
                          capture_output=True, text=True).stdout


def collect(git_dir: Path, keys: list[str]) -> dict:
    """The fixture's content: source, commit, and one entry per key."""
    commit, date = subprocess.run(["git", "--git-dir", str(git_dir), "log", "-1", "--format=%H %cI"], check=True,
                                  capture_output=True, text=True).stdout.split()
    distribution = yaml.safe_load(_show(git_dir, "jazzy/distribution.yaml"))
    released: dict[str, dict] = {}
    for name, repository in distribution["repositories"].items():
        release = repository.get("release")
        if release:
            for package in release.get("packages", [name]):
                released[package] = {"repository": name, "version": release.get("version")}
    rules = {path: yaml.safe_load(_show(git_dir, path)) for path in ROSDEP_FILES}
    entries: dict[str, dict] = {}
    for key in keys:
        if key in released:
            entries[key] = {"source": "jazzy/distribution.yaml", **released[key]}
            continue
        for path, data in rules.items():
            if key in data:
                entries[key] = {"source": path, "ubuntu": data[key].get("ubuntu")}
                break
    return {"source": "https://github.com/ros/rosdistro", "commit": commit, "commit_date": date,
            "distro": "jazzy", "platform": "ubuntu noble (24.04)",
            "note": "written by tools/rosdep_keys.py; keys missing here are missing upstream", "keys": entries}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rosdistro", type=Path, help="git directory of a ros/rosdistro clone")
    parser.add_argument("--out", type=Path, default=REPO / "test" / "fixtures" / "rosdep" / "keys.yaml")
    args = parser.parse_args(argv)
    data = collect(args.rosdistro, package_keys(REPO / "package.xml"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(yaml.safe_dump(data, sort_keys=False, width=120))
    print(f"{args.out}: {len(data['keys'])} keys from ros/rosdistro {data['commit']}")


if __name__ == "__main__":
    main()
