"""Start an oxygen node (or another node module) as a child process on its own ROS domain (:class:`NodeProcess`).

Nothing here imports ROS: the child is ``python -m oxygen_ros.ros --ros-args --params-file <file> -p ...``, so
it works from a source checkout, a pip install or a colcon install alike (the interpreter defaults to this one).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["NodeProcess", "ros_env", "source_checkout", "yaml_value"]


def source_checkout() -> Path | None:
    """The repository root when this package runs from a source checkout (``package.xml`` and ``config/`` next to
    the ``oxygen_ros`` package directory), else None (an installed package)."""
    root = Path(__file__).resolve().parents[2]
    return root if (root / "package.xml").is_file() and (root / "config").is_dir() else None


def yaml_value(value: Any) -> str:
    """A parameter value as the YAML text ``-p name:=<text>`` expects (strings single-quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(yaml_value(v) for v in value) + "]"
    raise TypeError(f"unsupported parameter value {value!r}")


def ros_env(domain_id: int, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for a child ROS process on an isolated domain, discovering on localhost only."""
    env = dict(os.environ if base is None else base)
    env.update(ROS_DOMAIN_ID=str(domain_id), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", PYTHONUNBUFFERED="1",
               RCUTILS_COLORIZED_OUTPUT="0")
    return env


class NodeProcess:
    """``python -m oxygen_ros.ros`` (or another node ``module``) as a child process; its output goes to a log
    file.

    Args:
        params_file: a ROS params YAML (``--params-file``), or None.
        overrides: ``-p name:=value`` overrides.
        remaps: ``-r from:=to`` remappings.
        domain_id: ROS_DOMAIN_ID of the child.
        log_path: where stdout+stderr go (default: a temporary file).
        python: the interpreter that runs the node.
        module: the node's module (``python -m <module> --ros-args ...``).
        cwd: the child's working directory (default: the source checkout's root when running from one, else this
            process's working directory).
        env: extra environment variables of the child.
    """

    def __init__(self, params_file: str | Path | None = None, overrides: Mapping[str, Any] | None = None,
                 remaps: Mapping[str, str] | None = None, domain_id: int = 0, log_path: str | Path | None = None,
                 python: str = sys.executable, module: str = "oxygen_ros.ros",
                 cwd: str | Path | None = None, env: Mapping[str, str] | None = None) -> None:
        self.cmd = [python, "-m", module, "--ros-args"]
        if params_file is not None:
            self.cmd += ["--params-file", str(params_file)]
        for name, value in (overrides or {}).items():
            self.cmd += ["-p", f"{name}:={yaml_value(value)}"]
        for src, dst in (remaps or {}).items():
            self.cmd += ["-r", f"{src}:={dst}"]
        self.env = ros_env(domain_id)
        self.env.update(env or {})
        if log_path is None:
            fd, log_path = tempfile.mkstemp(prefix="oxygen_node_", suffix=".log")
            os.close(fd)
        self.log_path = Path(log_path)
        self.cwd = Path(cwd) if cwd is not None else source_checkout()
        self.proc: subprocess.Popen | None = None

    def start(self) -> NodeProcess:
        """Start the child (stdout and stderr to :attr:`log_path`, its own session); returns self."""
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                         cwd=self.cwd, start_new_session=True)
        return self

    @property
    def alive(self) -> bool:
        """The child was started and has not exited."""
        return self.proc is not None and self.proc.poll() is None

    def output(self) -> str:
        """Everything the node printed so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_for_output(self, text: str, timeout: float) -> bool:
        """Wait until the child printed ``text`` (False after ``timeout`` seconds or once it exited without)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in self.output():
                return True
            if not self.alive:
                return text in self.output()
            time.sleep(0.05)
        return False

    def stop(self, sig: int = signal.SIGINT, timeout: float = 15.0) -> int | None:
        """Send ``sig`` (default SIGINT, like Ctrl-C) and wait; kill after ``timeout``. Returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def __enter__(self) -> NodeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
