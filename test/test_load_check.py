"""The load check (oxygen_ros/testing/load.py, tools/load_check.sh): CPU hogs that really burn a core and are gone
after the block, and rounds of a pytest selection with pass/fail and wall time per round."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oxygen_ros.testing.load import cpu_hogs, load_check, main

# Run in an interpreter of its own, as the tool runs. In .ci/run one hog once read as ended (return code 0) while the
# checker waited: the pytest process had been left on SCHED_FIFO 99 by an earlier export test (SVT-AV1 as root),
# so the checker and its hogs inherited it and the two busy hogs starved the checker until their own deadline.
# encode_video now puts those threads back (test_normal_priority.py), and a hog runs at SCHED_OTHER.
_HOGS_CHECK = """
import json, os, time
from pathlib import Path
from oxygen_ros.testing.load import cpu_hogs

def cpu_s(pid):
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

out = {}
try:  # a real-time parent (where allowed): the hogs still run at normal priority
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
except (AttributeError, OSError):
    pass
with cpu_hogs(2, max_s=60) as procs:
    out["running"] = [p.poll() is None for p in procs]
    time.sleep(1.0)  # past the interpreter's start
    out["policy"] = [os.sched_getscheduler(p.pid) for p in procs]
    end = time.monotonic() + 20  # a shared, loaded host gives each a fraction of a core
    while time.monotonic() < end and min(cpu_s(p.pid) for p in procs) < 0.5:
        time.sleep(0.1)
    out["cpu_s"] = [cpu_s(p.pid) for p in procs]
out["after"] = [p.returncode for p in procs]
with cpu_hogs(1, max_s=0.5) as (p,):  # bounded in time on its own
    out["bounded"] = p.wait(timeout=30)
print(json.dumps(out))
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_hogs_burn_cpu_and_are_killed_at_exit() -> None:
    done = subprocess.run([sys.executable, "-c", _HOGS_CHECK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["running"] == [True, True], out
    assert out["policy"] == [os.SCHED_OTHER] * 2, out  # normal load even beside a real-time parent
    assert min(out["cpu_s"]) >= 0.5, out  # busy, not sleeping: each burns CPU time
    assert all(rc is not None and rc != 0 for rc in out["after"]), out  # killed by the block's end, not before
    assert out["bounded"] == 0, out  # ended at its own deadline
    with pytest.raises(ValueError), cpu_hogs(-1):
        pass


def test_rounds_report_pass_fail_and_wall_time(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "test_sample.py").write_text("import os\n\ndef test_ok():\n    pass\n\n"
                                             "def test_flag():\n    assert not os.path.exists('fail')\n")
    t0 = time.monotonic()
    results = load_check(["test_sample.py"], hogs=1, rounds=2, cwd=tmp_path, log_dir=tmp_path / "logs")
    elapsed = time.monotonic() - t0
    assert [r.passed for r in results] == [True, True]
    # each round's wall time is its own pytest run: a python start at least, and the rounds within the call
    assert min(r.wall_s for r in results) >= 0.1 and sum(r.wall_s for r in results) <= elapsed, results
    assert "2 passed" in results[0].summary and (tmp_path / "logs" / "round_2.log").exists()
    out = capsys.readouterr().out
    assert f"round 2: PASS (rc 0) in {results[1].wall_s:.1f} s" in out, out
    assert "round 1: PASS" in out and "round 2: PASS" in out and "1 CPU hog(s) running" in out
    (tmp_path / "fail").write_text("")
    [failed] = load_check(["test_sample.py"], hogs=0, rounds=1, cwd=tmp_path, show=False)
    assert not failed.passed and failed.returncode == 1 and "1 failed" in failed.summary
    assert failed.line().startswith("round 1: FAIL (rc 1)")
    [quiet] = load_check(["-q", "test_sample.py"], hogs=0, rounds=1, cwd=tmp_path, show=False)  # -qq: no summary
    assert quiet.summary.startswith("1 passed, 1 failed (counted from the progress): FAILED"), quiet.summary
    with pytest.raises(SystemExit):
        main(["--rounds", "0", "x"])


def test_a_command_instead_of_pytest(tmp_path: Path) -> None:
    """``--command``: the arguments run as they are (CI's entry point beside the hogs); its exit status decides."""
    script = "import sys\nprint('ci: total 3 s: ' + sys.argv[1])\nsys.exit(0 if sys.argv[1] == 'passed' else 1)\n"
    (tmp_path / "ci.py").write_text(script)
    [ok] = load_check([sys.executable, "ci.py", "passed"], hogs=1, rounds=1, cwd=tmp_path, show=False, command=True)
    assert ok.passed and ok.summary == "ci: total 3 s: passed", ok
    [bad] = load_check([sys.executable, "ci.py", "FAILED"], hogs=0, rounds=1, cwd=tmp_path, show=False, command=True)
    assert not bad.passed and bad.returncode == 1 and bad.summary == "ci: total 3 s: FAILED", bad
