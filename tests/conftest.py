"""Shared helpers: run the real command line (the error boundary lives in planner.cli.main)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(*args: str, debug: bool = False, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("PLANNER_DEBUG", None)
    if debug:
        env["PLANNER_DEBUG"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "planner", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


def one_error_line(result: subprocess.CompletedProcess, code: int = 2) -> str:
    """Assert the run failed with `code` and told the human in exactly one line; return it."""
    assert result.returncode == code, (result.returncode, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


