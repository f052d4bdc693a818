"""Every Python block of README.md runs as written, as a script of its own, and the scheduler
example prints what the README says it prints."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def _run(code: str, tmp_path: Path) -> str:
    script = tmp_path / "block.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, f"README block failed:\n{code}\n{done.stderr}"
    return done.stdout


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_block_runs_as_written(index, tmp_path):
    if "polydev.backends import ray" in BLOCKS[index]:
        pytest.importorskip("ray", reason="the remote-device block needs the ray extra")
    _run(BLOCKS[index], tmp_path)


def test_the_scheduler_example_prints_what_the_readme_says(tmp_path):
    (block,) = [b for b in BLOCKS if "Scheduler(" in b]
    first_line = _run(block, tmp_path).splitlines()[0]
    assert f"`{first_line}`" in README.read_text()


def test_ci_runs_the_readme_test_command_as_written():
    """.ci/run runs the bash block after "Run the tests:": it installs everything
    (tests/setup.sh), requires every optional part, and ends with pytest."""
    section = README.read_text().split("Run the tests:", 1)[1]
    command = re.search(r"```bash\n(.*?)\n```", section, re.S).group(1)
    assert "bash tests/setup.sh" in command and command.endswith("python -m pytest -q tests")
    for part in ("OPENCL", "MODELS", "RAY", "LLAMA_CPP"):
        assert f"POLYDEV_REQUIRE_{part}=1" in command
    assert '"Run the tests:"' in (README.parent / ".ci" / "run").read_text()
