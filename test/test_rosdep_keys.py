"""package.xml a robot can resolve: every dependency key is a Jazzy package or has a rosdep rule for Ubuntu noble
(checked against test/fixtures/rosdep/keys.yaml, a copy of ros/rosdistro's rules written by tools/rosdep_keys.py),
and every third-party module the package imports is covered by package.xml or by requirements-robot.txt."""

from __future__ import annotations

import ast
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "test" / "fixtures" / "rosdep" / "keys.yaml"
DEPEND_TAGS = ("depend", "build_depend", "buildtool_depend", "build_export_depend", "exec_depend", "test_depend",
               "doc_depend", "buildtool_export_depend")

# Where each third-party import of the package comes from on the robot: a package.xml key, "pip:<name>" for
# requirements-robot.txt, or "jetpack" (torch: JetPack's CUDA build, checked by oxygen-doctor).
# Optional extras that the node never imports are named with the reason instead.
IMPORT_SOURCES = {
    "rclpy": "rclpy", "rcl_interfaces": "rcl_interfaces", "ament_index_python": "ament_index_python",
    "builtin_interfaces": "builtin_interfaces", "std_msgs": "std_msgs", "sensor_msgs": "sensor_msgs",
    "std_srvs": "std_srvs", "trajectory_msgs": "trajectory_msgs", "diagnostic_msgs": "diagnostic_msgs",
    "rosgraph_msgs": "rosgraph_msgs", "lifecycle_msgs": "lifecycle_msgs", "launch": "launch",
    "launch_ros": "launch_ros", "urdf_parser_py": "urdfdom_py",
    "numpy": "python3-numpy", "yaml": "python3-yaml", "cv2": "python3-opencv", "PIL": "python3-pil",
    "matplotlib": "python3-matplotlib", "tqdm": "python3-tqdm", "rich": "python3-rich", "lxml": "python3-lxml",
    "msgpack": "python3-msgpack", "websockets": "python3-websockets",
    "safetensors": "pip:safetensors", "sentencepiece": "pip:sentencepiece", "rosbags": "pip:rosbags",
    "pyarrow": "pip:pyarrow", "av": "pip:av",  # oxygen-export-lerobot (an offline tool)
    "grpc": "pip:grpcio", "google": "pip:protobuf",
    "torch": "jetpack",
    "ray": "optional: fleet evaluation on a Ray cluster (pip install ray; sequential without it)",
    "openpi_client": "optional: the openpi comparison benchmark (workstation only)",
    "openpi": "optional: the openpi comparison benchmark (workstation only)",
}


def package_keys() -> list[str]:
    root = ET.parse(REPO / "package.xml").getroot()
    return [e.text.strip() for e in root if e.tag in DEPEND_TAGS and e.text]


def resolves_on_noble(rule: object) -> bool:
    """Whether a rosdep rule's ``ubuntu`` entry gives noble something to install (a list, an installer entry, or
    a per-release mapping whose noble, else '*', entry is not null)."""
    if isinstance(rule, dict) and not ({"pip", "apt", "source"} & set(rule)):
        rule = rule.get("noble", rule.get("*"))
    return bool(rule)


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if match:
            out[match.group(1).lower()] = match.group(2)
    return out


@pytest.fixture(scope="module")
def fixture() -> dict:
    return yaml.safe_load(FIXTURE.read_text())


def test_the_copy_names_its_source(fixture: dict) -> None:
    assert fixture["source"] == "https://github.com/ros/rosdistro" and re.fullmatch(r"[0-9a-f]{40}", fixture["commit"])
    assert fixture["distro"] == "jazzy" and "noble" in fixture["platform"]


def test_every_package_xml_key_resolves_for_jazzy_on_noble(fixture: dict) -> None:
    keys = package_keys()
    assert keys and len(keys) == len(set(keys)), "a key is listed twice"
    unresolved = []
    for key in keys:
        entry = fixture["keys"].get(key)
        if entry is None:
            unresolved.append(f"{key}: not a Jazzy package and no rosdep rule (re-run tools/rosdep_keys.py?)")
        elif entry["source"] == "jazzy/distribution.yaml":
            assert entry["version"], key
        elif not resolves_on_noble(entry.get("ubuntu")):
            unresolved.append(f"{key}: {entry['source']} has no rule for ubuntu noble ({entry.get('ubuntu')!r})")
    assert not unresolved, "rosdep install would fail on the robot:\n" + "\n".join(unresolved)
    assert set(fixture["keys"]) == set(keys), "the copy holds keys package.xml no longer uses: re-run the tool"


def test_a_key_without_a_noble_rule_is_caught() -> None:
    """The check itself: rules seen in rosdistro that give noble nothing, or give it something."""
    assert not resolves_on_noble(None)
    assert not resolves_on_noble({"*": ["python3-torch"], "noble": None})
    assert not resolves_on_noble({"focal": ["x"]})
    assert resolves_on_noble(["python3-numpy"]) and resolves_on_noble({"*": ["python3-tqdm"]})
    assert resolves_on_noble({"pip": {"packages": ["transformers"]}})


def _third_party_imports() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "oxygen_ros").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "oxygen_ros"}


def test_every_import_is_installed_on_the_robot() -> None:
    keys = set(package_keys())
    robot = pins(REPO / "requirements-robot.txt")
    missing = []
    for module in sorted(_third_party_imports()):
        source = IMPORT_SOURCES.get(module)
        if source is None:
            missing.append(f"{module}: unknown to IMPORT_SOURCES (add its package.xml key or requirements-robot.txt)")
        elif source.startswith("pip:") and source[4:] not in robot:
            missing.append(f"{module}: not in requirements-robot.txt")
        elif ":" not in source and source != "jetpack" and source not in keys:
            missing.append(f"{module}: key {source} not in package.xml")
    assert not missing, "\n".join(missing)


def test_robot_requirements_keep_jetpack_torch_and_the_distro_ros() -> None:
    robot = pins(REPO / "requirements-robot.txt")
    lines = [ln.split("#")[0].strip() for ln in (REPO / "requirements-robot.txt").read_text().splitlines()]
    assert not [ln for ln in lines if re.match(r"^(torch|torchvision|ros-)", ln, re.I)]
    assert "python3-torch" not in package_keys()  # rosdep's is Ubuntu's CPU build
    workstation = pins(REPO / "requirements.txt")
    assert robot and all(workstation.get(name) == version for name, version in robot.items()), \
        "requirements-robot.txt and requirements.txt pin different versions"
