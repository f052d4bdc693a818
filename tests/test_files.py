"""polydev.files: the one write-then-rename that every derived file goes through (built
kernels, probe answers, the assembled default model)."""

from __future__ import annotations

import pytest

from polydev.files import replacing, write_atomic


def test_write_atomic_replaces_the_whole_file_and_leaves_nothing_beside_it(tmp_path):
    target = tmp_path / "answers.json"
    write_atomic(target, b"old")
    write_atomic(target, "new, as UTF-8: \u00e9")
    assert target.read_bytes() == "new, as UTF-8: \u00e9".encode()
    assert [p.name for p in tmp_path.iterdir()] == ["answers.json"]


def test_a_writer_writes_beside_the_target_under_another_name_with_its_suffix(tmp_path):
    target = tmp_path / "kernels.so"
    with replacing(target, suffix=".so") as tmp:
        assert tmp.parent == target.parent and tmp != target and tmp.name.endswith(".so")
        assert tmp.exists() and not target.exists()      # nothing under the name until done
        tmp.write_bytes(b"library")
    assert target.read_bytes() == b"library" and not tmp.exists()


def test_a_writer_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path):
    target = tmp_path / "model.gguf"
    target.write_bytes(b"whole")
    with pytest.raises(ValueError, match="checksum"):
        with replacing(target) as tmp:
            tmp.write_bytes(b"half")
            raise ValueError("checksum did not match")
    assert target.read_bytes() == b"whole"
    assert [p.name for p in tmp_path.iterdir()] == ["model.gguf"]


def test_a_written_file_has_the_mode_a_plain_new_file_would(tmp_path):
    """Readable by others as the umask allows (a cache filled by one user, read by another),
    not mkstemp's owner-only mode."""
    write_atomic(tmp_path / "model.gguf", b"weights")
    plain = tmp_path / "plain"
    plain.write_bytes(b"x")
    assert (tmp_path / "model.gguf").stat().st_mode & 0o777 == plain.stat().st_mode & 0o777
