"""Tests for the synthetic CDC generator: counts are checked from the written files."""

from __future__ import annotations

import csv
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
import pytest

from cdc_assets.cli.generate import PART_FILE, GenerationSummary, generate, write_part


def _read(folder: Path, no_keys: int, no_nonkeys: int) -> tuple[list[str], list[tuple], list[tuple]]:
    """Return (header, key tuples, non-key value tuples) in file order."""
    files = sorted(p.name for p in folder.glob("*.csv"))
    assert files == [PART_FILE]
    key_names = [f"key_{i}" for i in range(1, no_keys + 1)]
    value_names = [f"nonkey_{j}" for j in range(1, no_nonkeys + 1)]
    types = {**{k: pa.string() for k in key_names}, **{v: pa.float64() for v in value_names}}
    table = pa_csv.read_csv(folder / PART_FILE, convert_options=pa_csv.ConvertOptions(column_types=types))
    cols = table.to_pydict()
    keys = list(zip(*(cols[k] for k in key_names)))
    values = list(zip(*(cols[v] for v in value_names))) if value_names else [()] * table.num_rows
    return table.column_names, keys, values


def _classify(day1: dict, day2: dict) -> dict[str, int]:
    common = day1.keys() & day2.keys()
    updated = [k for k in common if all(a != b for a, b in zip(day1[k], day2[k]))]
    unchanged = [k for k in common if day1[k] == day2[k]]
    # A row with only some values changed would be neither "updated" nor "unchanged".
    assert len(updated) + len(unchanged) == len(common)
    return {
        "deleted": len(day1.keys() - day2.keys()),
        "updated": len(updated),
        "unchanged": len(unchanged),
        "inserted": len(day2.keys() - day1.keys()),
    }


def _check_mix(tmp_path, init, incr, no_keys, no_nonkeys, pcts, expected, seed):
    d1, d2 = tmp_path / "day1", tmp_path / "day2"
    summary = generate(init, incr, no_keys, no_nonkeys, *pcts, d1, d2, seed=seed)

    header1, keys1, values1 = _read(d1, no_keys, no_nonkeys)
    header2, keys2, values2 = _read(d2, no_keys, no_nonkeys)
    expected_header = [f"key_{i}" for i in range(1, no_keys + 1)] + [f"nonkey_{j}" for j in range(1, no_nonkeys + 1)]
    assert header1 == header2 == expected_header
    assert len(keys1) == init and len(set(keys1)) == init
    assert len(keys2) == incr and len(set(keys2)) == incr
    for key in keys1[:50] + keys2[:50]:
        for part in key:
            assert str(uuid.UUID(part)) == part and uuid.UUID(part).version == 4

    counts = _classify(dict(zip(keys1, values1)), dict(zip(keys2, values2)))
    assert counts == expected
    assert summary == GenerationSummary(seed=seed, initial_rows=init, incremental_rows=incr, **expected)

    # The changed rows are a random sample and day 2 is shuffled, not day 1's order.
    day2_keys = set(keys2)
    deleted_positions = [i for i, k in enumerate(keys1) if k not in day2_keys]
    assert max(deleted_positions) > expected["deleted"]
    kept_in_day1_order = [k for k in keys1 if k in day2_keys]
    kept = set(kept_in_day1_order)
    assert [k for k in keys2 if k in kept] != kept_in_day1_order


def test_main_mix_counts_from_data(tmp_path):
    expected = {"deleted": 2_000, "updated": 4_000, "unchanged": 4_000, "inserted": 2_000}
    _check_mix(tmp_path, 10_000, 10_000, 5, 10, (0.2, 0.4, 0.4), expected, seed=7)


def test_growing_table_mix_counts_from_data(tmp_path):
    expected = {"deleted": 100, "updated": 300, "unchanged": 600, "inserted": 600}
    _check_mix(tmp_path, 1_000, 1_500, 2, 3, (0.1, 0.3, 0.6), expected, seed=11)


def test_same_seed_is_byte_identical_and_different_seed_differs(tmp_path):
    def run(name: str, seed: int) -> tuple[bytes, bytes]:
        generate(500, 600, 3, 4, 0.2, 0.4, 0.4, tmp_path / name / "d1", tmp_path / name / "d2", seed=seed)
        return tuple((tmp_path / name / d / PART_FILE).read_bytes() for d in ("d1", "d2"))

    first, again, other = run("a", 123), run("b", 123), run("c", 124)
    assert first == again
    assert first[0] != other[0] and first[1] != other[1]


def test_unseeded_run_reports_a_seed_that_reproduces_it(tmp_path):
    summary = generate(200, 200, 1, 2, 0.1, 0.1, 0.8, tmp_path / "a1", tmp_path / "a2")
    generate(200, 200, 1, 2, 0.1, 0.1, 0.8, tmp_path / "b1", tmp_path / "b2", seed=summary.seed)
    for a, b in (("a1", "b1"), ("a2", "b2")):
        assert (tmp_path / a / PART_FILE).read_bytes() == (tmp_path / b / PART_FILE).read_bytes()


def test_rerun_replaces_stale_csv_files(tmp_path):
    d1, d2 = tmp_path / "day1", tmp_path / "day2"
    d1.mkdir()
    (d1 / "part-00001-old.csv").write_text("stale\n")
    (d1 / PART_FILE).write_text("stale\n")
    generate(100, 100, 1, 1, 0.0, 0.5, 0.5, d1, d2, seed=1)
    assert sorted(p.name for p in d1.glob("*.csv")) == [PART_FILE]
    assert len(_read(d1, 1, 1)[1]) == 100


def test_no_nonkey_columns(tmp_path):
    summary = generate(100, 90, 1, 0, 0.1, 0.2, 0.7, tmp_path / "d1", tmp_path / "d2", seed=3)
    header, keys2, _ = _read(tmp_path / "d2", 1, 0)
    assert header == ["key_1"] and len(set(keys2)) == 90
    assert (summary.deleted, summary.updated, summary.unchanged, summary.inserted) == (10, 20, 70, 0)


def test_generated_doubles_round_trip(tmp_path):
    generate(200, 200, 1, 5, 0.2, 0.4, 0.4, tmp_path / "d1", tmp_path / "d2", seed=5)
    with open(tmp_path / "d1" / PART_FILE, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))[1:21]
    parsed = pa_csv.read_csv(tmp_path / "d1" / PART_FILE).slice(0, 20).to_pydict()
    for i, row in enumerate(rows):
        for j, text in enumerate(row[1:], start=1):
            value = float(text)
            assert float(repr(value)) == value
            assert parsed[f"nonkey_{j}"][i] == value
            # Shortest round-trip formatting: a value rounded to 6 decimals needs no more.
            assert len(text.partition(".")[2]) <= 6


def test_writer_round_trips_awkward_doubles(tmp_path):
    awkward = [0.1 + 0.2, 1 / 3, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 2.0**53 + 2, -0.0, 1e-7]
    path = write_part(pa.table({"x": awkward}), tmp_path / "out")
    with open(path, newline="", encoding="utf-8") as fh:
        texts = [row[0] for row in list(csv.reader(fh))[1:]]
    assert [float(t) for t in texts] == awkward


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ((1_000, 1_000, 2, 2, 0.2, 0.3, 0.4), "= 0.9"),
        ((1_000, 1_000, 2, 2, 0.2, 0.5, 0.4), "= 1.1"),
        ((1_000, 1_000, 2, 2, -0.1, 0.6, 0.5), "pct sum 1"),
        ((1_000, 500, 2, 2, 0.2, 0.4, 0.4), "pct sum 1"),
    ],
    ids=["sum-0.9", "sum-1.1", "negative-pct", "too-few-incr-rows"],
)
def test_invalid_mix_raises_with_sum(tmp_path, args, fragment):
    with pytest.raises(ValueError, match=fragment.replace(".", r"\.")):
        generate(*args, tmp_path / "d1", tmp_path / "d2", seed=1)
    assert not (tmp_path / "d1").exists()


@pytest.mark.parametrize(
    "args",
    [(-1, 10, 1, 1), (10, -1, 1, 1), (10, 10, 0, 1), (10, 10, 1, -1)],
    ids=["neg-init", "neg-incr", "zero-keys", "neg-nonkeys"],
)
def test_invalid_shapes_raise(tmp_path, args):
    with pytest.raises(ValueError):
        generate(*args, 0.2, 0.4, 0.4, tmp_path / "d1", tmp_path / "d2", seed=1)


def _cli(*args: str, program: list[str] | None = None) -> subprocess.CompletedProcess:
    program = program or [sys.executable, "-m", "cdc_assets.cli.generate"]
    return subprocess.run([*program, *args], capture_output=True, text=True, timeout=120)


def test_cli_rejects_bad_mix(tmp_path):
    result = _cli("100", "100", "1", "1", "0.2", "0.3", "0.4", str(tmp_path / "d1"), str(tmp_path / "d2"))
    assert result.returncode == 2
    assert "must equal 1.0" in result.stderr and "= 0.9" in result.stderr
    assert not (tmp_path / "d1").exists()


def test_cli_writes_files(tmp_path):
    result = _cli("100", "120", "2", "3", "0.2", "0.4", "0.4", str(tmp_path / "d1"), str(tmp_path / "d2"), "--seed", "9")
    assert result.returncode == 0, result.stderr
    assert "seed=9" in result.stdout and "inserted=40" in result.stdout
    assert len(_read(tmp_path / "d1", 2, 3)[1]) == 100
    assert len(_read(tmp_path / "d2", 2, 3)[1]) == 120


def test_installed_console_script(tmp_path):
    script = Path(sys.executable).parent / "cdc-generate"
    if not script.exists():
        script = Path(shutil.which("cdc-generate") or "cdc-generate")
    assert script.exists(), "cdc-generate console script is not installed"
    result = _cli("50", "50", "1", "1", "0", "0", "1", str(tmp_path / "d1"), str(tmp_path / "d2"), program=[str(script)])
    assert result.returncode == 0, result.stderr
    assert "unchanged=50" in result.stdout
    # All rows unchanged: day 2 is day 1 shuffled, line for line.
    day1, day2 = ((tmp_path / d / PART_FILE).read_text().splitlines() for d in ("d1", "d2"))
    assert day1[0] == day2[0] and sorted(day1[1:]) == sorted(day2[1:])
