"""The rosbags side of the bags: ROS 2 message types (with this package's own messages) and storage plugins.

Nothing here needs ROS installed: the typestore is rosbags' (the newest ROS 2 distro it knows), and
ActionChunk / LanguageOutput are registered from ``msg/*.msg`` (the source tree's or an installed package's) or,
when neither is found, from the embedded copies in :data:`EMBEDDED_MSGS`.
"""

from __future__ import annotations

import array
import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
from rosbags.rosbag2 import StoragePlugin
from rosbags.typesys import Stores, get_types_from_msg, get_typestore

__all__ = [
    "ACTION_TYPE",
    "EMBEDDED_MSGS",
    "IMAGE_TYPES",
    "LANGUAGE_TYPE",
    "STORAGES",
    "bag_storage",
    "find_msg_dir",
    "get_ros2_typestore",
    "oxygen_typestore",
    "to_typestore",
]

ACTION_TYPE = "oxygen_ros/msg/ActionChunk"
LANGUAGE_TYPE = "oxygen_ros/msg/LanguageOutput"
IMAGE_TYPES = ("sensor_msgs/msg/Image", "sensor_msgs/msg/CompressedImage")
STORAGES = {"sqlite3": StoragePlugin.SQLITE3, "mcap": StoragePlugin.MCAP}

# Fallback copies of msg/*.msg (field lines must match the files; test_evaluate_bag checks).
EMBEDDED_MSGS: dict[str, str] = {
    ACTION_TYPE: """\
std_msgs/Header header
uint64 frame_index
string[] joint_names
uint32 horizon
uint32 action_dim
float32[] actions
builtin_interfaces/Duration dt
builtin_interfaces/Duration inference_latency
uint32 first_step
string subtask
""",
    LANGUAGE_TYPE: """\
std_msgs/Header header
uint64 request_id
uint64 frame_index
string task
string stream
string text
uint32 num_tokens
bool eos
builtin_interfaces/Duration latency
""",
}


def get_ros2_typestore() -> Any:
    """rosbags typestore for the newest ROS 2 distro this rosbags knows (kilted, else jazzy, else humble)."""
    for name in ("ROS2_KILTED", "ROS2_JAZZY", "ROS2_HUMBLE"):
        if hasattr(Stores, name):
            return get_typestore(getattr(Stores, name))
    raise RuntimeError("rosbags has no ROS 2 typestore")


def find_msg_dir() -> Path | None:
    """The folder holding ActionChunk.msg and LanguageOutput.msg: the source tree's ``msg/``, else
    ``<prefix>/share/oxygen_ros/msg`` of an installed package (ament index, AMENT_PREFIX_PATH, sys.prefix)."""
    candidates = [Path(__file__).resolve().parents[2] / "msg"]
    try:
        from ament_index_python.packages import get_package_share_directory

        candidates.append(Path(get_package_share_directory("oxygen_ros")) / "msg")
    except Exception:  # not installed, or oxygen_ros is not in the ament index
        pass
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p] + [sys.prefix]
    candidates += [Path(p) / "share" / "oxygen_ros" / "msg" for p in prefixes]
    names = [t.rsplit("/", 1)[1] + ".msg" for t in EMBEDDED_MSGS]
    return next((c for c in candidates if all((c / n).is_file() for n in names)), None)


def oxygen_typestore() -> tuple[Any, str]:
    """A ROS 2 rosbags typestore with ActionChunk and LanguageOutput registered, and where they came from
    (a ``msg/`` folder, or ``"embedded"`` when no .msg files are found)."""
    ts = get_ros2_typestore()
    msg_dir = find_msg_dir()
    types: dict = {}
    for name, embedded in EMBEDDED_MSGS.items():
        text = (msg_dir / (name.rsplit("/", 1)[1] + ".msg")).read_text() if msg_dir else embedded
        types.update(get_types_from_msg(text, name))
    ts.register(types)
    return ts, str(msg_dir) if msg_dir else "embedded"


def to_typestore(msg: Any, ts: Any) -> Any:
    """A generated ROS message (as the node publishes it) -> the same message as a rosbags typestore object, for
    the bag writer (its CDR zeroes padding bytes, so equal messages give equal bag bytes)."""
    fields = {}
    for name in msg.get_fields_and_field_types():
        value = getattr(msg, name)
        if hasattr(value, "get_fields_and_field_types"):
            value = to_typestore(value, ts)
        elif isinstance(value, list) and value and hasattr(value[0], "get_fields_and_field_types"):
            value = [to_typestore(v, ts) for v in value]
        elif isinstance(value, array.array):
            value = np.asarray(value)  # rosbags holds primitive sequences as numpy arrays
        fields[name] = value
    cls = type(msg)
    return ts.types[f"{cls.__module__.split('.')[0]}/msg/{cls.__name__}"](**fields)


def bag_storage(bag: Path) -> str:
    """``sqlite3`` or ``mcap``: a bag's storage (metadata.yaml, else file extensions)."""
    meta = bag / "metadata.yaml"
    if meta.is_file():
        m = re.search(r"storage_identifier:\s*['\"]?(\w+)", meta.read_text())
        if m and m.group(1) in STORAGES:
            return m.group(1)
    return "mcap" if bag.is_dir() and any(bag.glob("*.mcap")) else "sqlite3"
