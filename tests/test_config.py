"""Settings: paths are made absolute where they enter, since the children run in folders of their own."""

from __future__ import annotations

from pathlib import Path

from harness.config import Settings


def test_relative_paths_in_settings_are_resolved_against_the_current_folder(tmp_path, monkeypatch):
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    s = Settings(data_dir=Path("data"), scratch_dir=Path("../scratch"), problems_dir=Path("../kb/level2"))
    assert (s.data_dir, s.scratch_dir, s.problems_dir) == (
        tmp_path.resolve() / "work" / "data", tmp_path.resolve() / "scratch", tmp_path.resolve() / "kb" / "level2")


def test_a_relative_problems_dir_from_the_environment_is_resolved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HARNESS_PROBLEMS_DIR", "kb")
    monkeypatch.setenv("HARNESS_DATA_DIR", "~/kh")
    s = Settings()
    assert s.problems_dir == tmp_path.resolve() / "kb" and s.data_dir == Path.home().resolve() / "kh"
    assert Settings(problems_dir=None).problems_dir is None


def test_exchange_memory_is_read_from_the_environment_and_validated(monkeypatch):
    import pytest
    from pydantic import ValidationError

    assert Settings().exchange_memory == "auto"
    monkeypatch.setenv("HARNESS_EXCHANGE_MEMORY", "host")
    assert Settings().exchange_memory == "host"
    monkeypatch.setenv("HARNESS_EXCHANGE_MEMORY", "gpu")
    with pytest.raises(ValidationError, match="exchange_memory"):
        Settings()
