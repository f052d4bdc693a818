"""``POLYDEV_*`` variables: declared once, checked when polydev starts (a warning naming the
variable and what it accepts), an error where a bad value is used, and all in README's table."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from polydev.env import VARIABLES, check_environment, env_float, env_int
from polydev.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def clean_env(monkeypatch):
    for name in [n for n in os.environ if n.startswith("POLYDEV_")]:
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize("name, value, said", [
    ("POLYDEV_CPU_WEIGHT_CACHE_MB", "abc", "is not a finite number of 0 or more"),
    ("POLYDEV_CPU_WEIGHT_CACHE_MB", "nan", "is not a finite number of 0 or more"),
    ("POLYDEV_SCHED_DEBUG", "3", "is out of range: expected an integer from 0 to 2"),
    ("POLYDEV_SCHED_DEBUG", "1.5", "is not an integer from 0 to 2"),
    ("POLYDEV_RAY_TIMEOUT", "0", "is out of range: expected a finite number of 0.001 or more"),
    ("POLYDEV_OP_OFFLOAD_MIN_BATCH", "-4", "is out of range: expected an integer of 0 or more"),
])
def test_a_bad_value_is_a_warning_at_start_and_an_error_where_used(clean_env, caplog, name,
                                                                   value, said):
    clean_env.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="polydev.env"):
        (warning,) = check_environment()
    assert warning.startswith(f"{name}={value!r} {said}")
    assert warning in caplog.text
    read = env_int if VARIABLES[name].kind is int else env_float
    with pytest.raises(ConfigError, match=re.escape(f"{name}={value!r} {said}")):
        read(name)


def test_an_unknown_name_is_a_warning_with_the_likely_one(clean_env):
    clean_env.setenv("POLYDEV_CPU_NATVE", "0")
    assert check_environment() == ["POLYDEV_CPU_NATVE is not a variable polydev reads (did you "
                                   "mean POLYDEV_CPU_NATIVE?)"]


def test_good_values_and_defaults(clean_env):
    assert check_environment() == []
    assert env_int("POLYDEV_SCHED_DEBUG") == 0 and env_float("POLYDEV_RAY_TIMEOUT") == 60.0
    assert env_float("POLYDEV_CPU_WEIGHT_CACHE_MB") is None       # the reader's own default
    clean_env.setenv("POLYDEV_SCHED_DEBUG", " 2 ")
    clean_env.setenv("POLYDEV_BACKENDS", "cpu")
    assert check_environment() == [] and env_int("POLYDEV_SCHED_DEBUG") == 2


def test_the_command_line_warns_at_start_and_still_lists_devices():
    env = {**os.environ, "POLYDEV_CPU_WEIGHT_CACHE_MB": "abc"}
    done = subprocess.run([sys.executable, "-m", "polydev.tools.cli", "devices"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "CPU" in done.stdout
    assert ("POLYDEV_CPU_WEIGHT_CACHE_MB='abc' is not a finite number of 0 or more; it is an "
            "error where polydev uses it") in done.stderr
    assert "Traceback" not in done.stderr


def test_every_variable_is_declared_and_in_the_readme():
    """Each POLYDEV_* name the code reads is declared (so the start-up check knows it), and
    each declared one has a row in README's table."""
    readme = (ROOT / "README.md").read_text()
    documented = set(re.findall(r"^\| `(POLYDEV_[A-Z0-9_]+)`", readme, re.M))
    assert set(VARIABLES) == documented
    used = set()
    for folder in ("runtime", "backends", "models", "tools", "tests"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name != "test_env.py":           # its typos are on purpose
                used |= set(re.findall(r"\"(POLYDEV_[A-Z0-9_]+)\"", path.read_text()))
    assert used <= set(VARIABLES), used - set(VARIABLES)
