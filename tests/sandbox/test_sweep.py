"""What a sandbox uid left behind is swept; a path another sweep took first is no error."""

from __future__ import annotations

import logging
import os

from harness.sandbox import sweep


def test_a_path_gone_before_its_sweep_removes_it_is_skipped_without_an_error(tmp_path, monkeypatch, caplog):
    """On an H100 host the uid sweeps of two evaluations and the scratch sweep met the same left-over dir: one
    removed it, the other logged `ERROR could not remove ... No such file or directory`. Gone is what a sweep
    wants; a file it cannot remove is still an error."""
    (tmp_path / "left-over").mkdir()
    (tmp_path / "stuck").write_text("x")

    def remove(path, st):
        raise FileNotFoundError(2, "No such file or directory") if path.endswith("left-over") else \
            PermissionError(13, "Permission denied")

    monkeypatch.setattr(sweep, "_remove", remove)
    removed: list[str] = []
    with caplog.at_level(logging.ERROR, logger="harness.sandbox"):
        sweep._sweep_dir(str(tmp_path), os.getuid(), removed)
    assert removed == []
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and "stuck" in errors[0] and "Permission denied" in errors[0], errors
