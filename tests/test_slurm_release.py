"""The Slurm release dsportal finds, and what `dsportal check` says of it (portal/slurm/slurmparse.py,
docs/reference/compatibility.md). No cluster needed: the demo's own release is tried in test_check.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from portal.slurm.slurmparse import TESTED_RELEASES, describe_releases, parse_release

pytestmark = pytest.mark.quick

TABLE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "compatibility.md"


@pytest.mark.parametrize("said, version", [
    ("slurm 22.05.8\n", "22.05.8"),  # sinfo --version
    ("slurm 24.11.5", "24.11.5"),
    ("slurm-wlm 26.05.5-1", "26.05.5"),
    ("22.05.8", "22.05.8"),  # scontrol show config's SLURM_VERSION
    ("", None), ("slurm", None), ("version 2", None),
])
def test_the_release_is_read_from_what_slurm_says(said, version):
    assert parse_release(said) == version


def test_a_release_the_suite_passed_on_is_named_without_a_warning():
    words, warning = describe_releases("22.05.8", "22.05.8")
    assert not warning
    assert words == ("slurmctld 22.05.8, this host's commands 22.05.8: dsportal's cluster suite passed on Slurm 22.05 "
                     f"({TESTED_RELEASES['22.05']}, docs/reference/compatibility.md)")


def test_a_release_no_run_has_used_is_said_plainly():
    words, warning = describe_releases("26.05.5", "26.05.5")
    assert warning and "no run of dsportal's tests has used Slurm 26.05 yet (only 22.05)" in words


def test_commands_of_another_release_than_slurmctld_are_a_warning():
    words, warning = describe_releases("24.11.5", "22.05.8")
    assert warning and "this host's commands are of another release than slurmctld" in words
    words, warning = describe_releases(None, "22.05.8")
    assert warning and "did not say its version" in words


def test_the_table_has_a_passed_row_for_each_release_the_code_calls_tested():
    rows = [line for line in TABLE.read_text().splitlines() if re.match(r"\| \d{2}\.\d{2}\.\d+ \|", line)]
    passed = {row.split("|")[1].strip().rsplit(".", 1)[0]: row for row in rows if "passed" in row.split("|")[-2]}
    assert set(passed) == set(TESTED_RELEASES), rows
    for line, date in TESTED_RELEASES.items():
        assert f"| {date} |" in passed[line]
