"""The scripts in examples/ run as users run them (on a small test model)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("regex")

from model_files import write_test_model  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    return str(write_test_model(tmp_path_factory.mktemp("ex") / "m.gguf", n_layer=2))


@pytest.mark.parametrize("script, extra", [("split_layers.py", []),
                                           ("logits_per_device.py", []),
                                           ("trace_decode_step.py", ["TRACE"])])
def test_example_runs(tmp_path, small_model, script, extra):
    args = [str(tmp_path / "trace.json") if a == "TRACE" else a for a in extra]
    done = subprocess.run([sys.executable, str(EXAMPLES / script), small_model, *args],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    if extra:
        assert (tmp_path / "trace.json").stat().st_size > 0
