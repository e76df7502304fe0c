"""The layering cannot erode silently: import-linter's contracts (pyproject.toml, [tool.importlinter]) hold for the
package, and break when a forbidden import is added."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT = Path(sys.executable).with_name("lint-imports")
pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (make setup installs it)")


def lint(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run([str(LINT), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_the_layers_hold() -> None:
    result = lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module, line, contract", [
    ("engine/_probe.py", "import oxygen_ros.policy\n", "engine imports nothing else of the package"),
    ("util/_probe.py", "import oxygen_ros.engine\n", "util (host facts, percentiles) imports nothing else"),
    ("policy/_probe.py", "from oxygen_ros.runtime import params\n", "policy imports only the engine"),
    ("toy/world/_probe.py", "import oxygen_ros.engine\n", "the toy world is plain numpy"),
    ("executor/_probe.py", "import oxygen_ros.toy.world\n", "the product rooms do not import the toy room"),
    ("toy/_probe.py", "import oxygen_ros.bench\n", "the toy room (the embedded example) builds on the product"),
    ("params/_probe.py", "from oxygen_ros.robot import limits\n", "params (the one parameter schema) imports nothing"),
    ("robot/_probe.py", "from oxygen_ros.ros import qos\n", "robot (limits, limiter, gate, watchdog"),
    ("robot/_probe.py", "import rclpy\n", "robot (limits, limiter, gate, watchdog"),
    ("robot/_probe.py", "import torch\n", "robot (limits, limiter, gate, watchdog"),
    ("serve/_probe.py", "from oxygen_ros.runtime import params\n", "serve (the openpi-protocol server) imports only"),
    ("bench/_probe.py", "import oxygen_ros.tools.profile\n", "nothing imports tools/"),
    ("engine/_probe.py", "import oxygen_ros.bench\n", "no import cycles between sibling modules"),
    ("engine/_probe.py", "from oxygen_ros.engine.backends.fusion import fused_stack\n",
     "the engine's core reaches the backends only through their selection point"),
    ("policy/_probe.py", "import oxygen_ros.study\n", "no production room imports study"),
    ("evaluation/_probe.py", "import oxygen_ros.serve\n", "evaluation (bag evaluation, demo bags, replay) imports"),
    ("testing/_probe.py", "import oxygen_ros.evaluation\n", "testing (test and demo support) imports only ros"),
    ("bench/_probe.py", "import oxygen_ros.testing.fault_injection\n", "bench (the benchmarks) imports every room"),
    ("tools/_probe.py", "import oxygen_ros.testing.fault_injection\n", "tools (command-line entry points) may"),
    ("toy/sim/_probe.py", "import oxygen_ros.toy.train\n", "toy/sim (the simulator node) imports only"),
    ("toy/train/_probe.py", "import rclpy\n", "toy/train (demonstrations, training, evaluation of the toy model)"),
    ("toy/demo/_probe.py", "import oxygen_ros.toy.train\n", "toy/demo (the closed-loop demo) imports only"),
])
def test_a_forbidden_import_breaks_a_contract(tmp_path: Path, module: str, line: str, contract: str) -> None:
    root = tmp_path / "repo"
    shutil.copytree(REPO / "oxygen_ros", root / "oxygen_ros", ignore=shutil.ignore_patterns("__pycache__", "*.pyc",
                                                                                          "*.safetensors"))
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    (root / "oxygen_ros" / module).write_text(f'"""A deliberately bad import."""\n\n{line}')
    result = lint(root)
    assert result.returncode != 0
    # this contract, not merely some contract, is the one that broke (names wrap over lines in the listing)
    listing = " ".join(result.stdout.split())
    status = re.search(re.escape(contract) + r".*? (KEPT|BROKEN)\b", listing)
    assert status and status.group(1) == "BROKEN", result.stdout[-3000:]


def test_scratch_thread_returns_or_raises_in_the_caller() -> None:
    """Setup work runs on a thread that has ended when ``run_in_scratch_thread`` returns (engine/threads.py)."""
    import threading

    import pytest

    from oxygen_ros.engine.threads import run_in_scratch_thread

    seen = []
    assert run_in_scratch_thread(lambda x, y=0: seen.append(threading.current_thread()) or x + y, 2, y=3) == 5
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()
    with pytest.raises(ValueError, match="bad checkpoint"):
        run_in_scratch_thread(lambda: (_ for _ in ()).throw(ValueError("bad checkpoint")))
