"""Files the candidate's process wrote, as the trusted side reads them (in process: no children)."""

from __future__ import annotations

import os

import pytest

from harness.sandbox.trusted import UntrustedFile, read_untrusted


def test_a_regular_file_is_read(tmp_path):
    (tmp_path / "out_0.pt").write_bytes(b"x" * 10)
    assert read_untrusted(tmp_path / "out_0.pt", 100) == b"x" * 10


def test_a_fifo_in_place_of_an_output_is_refused_at_once_not_waited_on(tmp_path):
    os.mkfifo(tmp_path / "out_0.pt")  # a plain open() would block here until the evaluation's deadline
    with pytest.raises(UntrustedFile, match="not a regular file"):
        read_untrusted(tmp_path / "out_0.pt", 100)


def test_a_link_in_place_of_an_output_is_not_followed(tmp_path):
    (tmp_path / "secret").write_bytes(b"s")
    (tmp_path / "out_0.pt").symlink_to(tmp_path / "secret")
    with pytest.raises(UntrustedFile, match="cannot be opened as a regular file"):
        read_untrusted(tmp_path / "out_0.pt", 100)


def test_an_output_larger_than_the_problem_can_need_is_refused(tmp_path):
    (tmp_path / "out_0.pt").write_bytes(b"x" * 101)
    with pytest.raises(UntrustedFile, match="101 bytes"):
        read_untrusted(tmp_path / "out_0.pt", 100)
