"""Every Python block of README.md runs as written, as a script of its own, and the scheduler
example prints what the README says it prints."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
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
    block = BLOCKS[index]
    if "polydev.backends import ray" in block:
        pytest.importorskip("ray", reason="the remote-device block needs the ray extra")
    if _SERVER_URL in block:                # a client: it talks to a live polydev serve
        pytest.importorskip("openai", reason="the client block needs the openai package")
        with _polydev_serve() as url:
            _run(block.replace(_SERVER_URL, url), tmp_path)
        return
    _run(block, tmp_path)


_SERVER_URL = "http://127.0.0.1:8080"


@contextmanager
def _polydev_serve():
    """``polydev serve`` on the default model at a free port, until it answers /health."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = "import sys; from polydev.tools.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--port", str(port),
                             "--device", "none", "--no-progress"], stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "polydev serve failed"
            try:
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)


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
