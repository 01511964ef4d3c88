"""Synthetic two-day CDC data for the hash-based change-data-capture demo.

Day 1 is a full snapshot: UUID key columns ``key_1..key_N`` and random double
columns ``nonkey_1..nonkey_M``.  Day 2 is the next full snapshot of the same
table with a known mix of changes: an exact number of day-1 rows deleted,
updated (same keys, every non-key value different) and left unchanged, plus
freshly keyed inserts.  Because the counts are exact, the CDC pipeline's
insert/update/delete/unchanged output can be checked against them.

Only numpy and pyarrow are used so that a few million rows take seconds
rather than a Spark session's start-up plus a slow row-by-row Python UDF.
Every random draw comes from one seeded ``numpy.random.Generator`` and day 2
is derived from the day-1 arrays already in memory, so a given seed always
yields byte-identical files.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
from cdc_assets.model.file_modes import apply_umask

PART_FILE = "part-00000.csv"

# Two hex characters per byte value, so one table lookup formats a whole byte.
_HEX_PAIRS = np.frombuffer(b"".join(b"%02x" % b for b in range(256)), dtype=np.uint16)
# Canonical 8-4-4-4-12 layout: (text slice, hex-digit slice) for each group.
_UUID_GROUPS = (((0, 8), (0, 8)), ((9, 13), (8, 12)), ((14, 18), (12, 16)), ((19, 23), (16, 20)), ((24, 36), (20, 32)))
_SUM_TOLERANCE = 1e-9


@dataclass(frozen=True)
class GenerationSummary:
    seed: int
    initial_rows: int
    incremental_rows: int
    deleted: int
    updated: int
    unchanged: int
    inserted: int


def _uuid_text(rng: np.random.Generator, n: int) -> np.ndarray:
    """Return ``n`` random version-4 UUIDs as an (n, 36) array of ASCII bytes.

    Built from seeded random bytes rather than ``uuid.uuid4`` (which reads
    os.urandom) so runs are reproducible, and vectorised because a 1M-row
    day with 5 keys needs 5M of them.
    """
    raw = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)
    raw[:, 6] = (raw[:, 6] & 0x0F) | 0x40  # version 4
    raw[:, 8] = (raw[:, 8] & 0x3F) | 0x80  # RFC 4122 variant
    digits = _HEX_PAIRS[raw].view(np.uint8)  # (n, 32) ASCII hex digits
    text = np.full((n, 36), ord("-"), dtype=np.uint8)
    for (t0, t1), (d0, d1) in _UUID_GROUPS:
        text[:, t0:t1] = digits[:, d0:d1]
    return text


def _to_string_array(text: np.ndarray) -> pa.Array:
    """Wrap fixed-width ASCII rows as an Arrow string array without a Python loop."""
    n, width = text.shape
    # 64-bit offsets: 32-bit ones would overflow past ~59M UUIDs in one column.
    offsets = np.arange(0, n * width + 1, width, dtype=np.int64)
    data = np.ascontiguousarray(text)
    return pa.Array.from_buffers(pa.large_string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _random_values(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    # Six decimals keep the CSV readable while still being non-trivial doubles.
    return np.round(rng.random(shape) * 1000.0, 6)


def _build_table(keys: list[np.ndarray], values: np.ndarray) -> pa.Table:
    columns = {f"key_{i}": _to_string_array(k) for i, k in enumerate(keys, start=1)}
    columns.update({f"nonkey_{j}": pa.array(v) for j, v in enumerate(values, start=1)})
    return pa.table(columns)


def write_part(table: pa.Table, folder: str | Path) -> Path:
    """Write ``table`` as the folder's only CSV file and return its path.

    Stale ``*.csv`` files are removed because downstream readers load the
    whole folder, and a leftover part from an earlier run would add rows.
    pyarrow formats doubles with the shortest text that parses back to the
    same value, so no precision is lost.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob("*.csv"):
        stale.unlink()
    path = folder / PART_FILE
    pa_csv.write_csv(table, path)
    return path


def _validate(no_init_recs, no_incr_recs, no_keys, no_nonkeys, pcts, seed) -> None:
    if no_init_recs < 0 or no_incr_recs < 0:
        raise ValueError(f"record counts must be >= 0, got {no_init_recs} and {no_incr_recs}")
    if no_keys < 1:
        raise ValueError(f"no_keys must be >= 1, got {no_keys}")
    if no_nonkeys < 0:
        raise ValueError(f"no_nonkeys must be >= 0, got {no_nonkeys}")
    if seed is not None and seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    total = sum(pcts)
    names = ("pct_del", "pct_upd", "pct_unchanged")
    for name, pct in zip(names, pcts):
        if not 0.0 <= pct <= 1.0:  # also rejects NaN
            raise ValueError(f"{name} must be within [0, 1], got {pct} (pct sum {total:.12g})")
    if abs(total - 1.0) > _SUM_TOLERANCE:
        raise ValueError(
            f"pct_del + pct_upd + pct_unchanged must equal 1.0, got "
            f"{pcts[0]} + {pcts[1]} + {pcts[2]} = {total:.12g}"
        )


def generate(
    no_init_recs: int,
    no_incr_recs: int,
    no_keys: int,
    no_nonkeys: int,
    pct_del: float,
    pct_upd: float,
    pct_unchanged: float,
    initial_output: str | Path,
    incremental_output: str | Path,
    seed: int | None = None,
) -> GenerationSummary:
    """Write day-1 and day-2 CSVs and return the exact change counts.

    ``pct_unchanged`` is validated but the unchanged count is whatever is
    left after rounding deletes and updates, so the three always add up to
    ``no_init_recs``.  Raises ``ValueError`` for invalid arguments.
    """
    _validate(no_init_recs, no_incr_recs, no_keys, no_nonkeys, (pct_del, pct_upd, pct_unchanged), seed)
    n = no_init_recs
    deleted = round(pct_del * n)
    updated = min(round(pct_upd * n), n - deleted)
    unchanged = n - deleted - updated
    inserted = no_incr_recs - updated - unchanged
    if inserted < 0:
        raise ValueError(
            f"no_incr_recs={no_incr_recs} is smaller than the {updated + unchanged} day-1 rows kept "
            f"({updated} updated + {unchanged} unchanged); pct sum "
            f"{pct_del + pct_upd + pct_unchanged:.12g}"
        )
    if seed is None:
        seed = secrets.randbits(63)
    rng = np.random.default_rng(seed)

    keys1 = [_uuid_text(rng, n) for _ in range(no_keys)]
    values1 = _random_values(rng, (no_nonkeys, n))  # one contiguous row per column

    # A random permutation picks disjoint deleted/updated/unchanged sets in one draw.
    perm = rng.permutation(n)
    upd_idx = perm[deleted : deleted + updated]
    same_idx = perm[deleted + updated :]

    old = values1[:, upd_idx]
    new = _random_values(rng, old.shape)
    clash = new == old  # ~1e-9 chance per value, but "updated" must mean every value changed
    new[clash] = np.round((old[clash] + 500.0) % 1000.0, 6)

    order = rng.permutation(no_incr_recs)
    keys2 = [np.concatenate([k[same_idx], k[upd_idx], _uuid_text(rng, inserted)])[order] for k in keys1]
    values2 = np.concatenate([values1[:, same_idx], new, _random_values(rng, (no_nonkeys, inserted))], axis=1)
    values2 = values2[:, order]

    write_part(_build_table(keys1, values1), initial_output)
    write_part(_build_table(keys2, values2), incremental_output)
    return GenerationSummary(seed, n, no_incr_recs, deleted, updated, unchanged, inserted)


def main(argv: list[str] | None = None) -> int:
    apply_umask()  # first: what it writes and every process it starts is its owner's only (CDC_UMASK)
    parser = argparse.ArgumentParser(prog="cdc-generate", description=__doc__.splitlines()[0])
    for name in ("no_init_recs", "no_incr_recs", "no_keys", "no_nonkeys"):
        parser.add_argument(name, type=int)
    for name in ("pct_del", "pct_upd", "pct_unchanged"):
        parser.add_argument(name, type=float)
    parser.add_argument("initial_output", type=Path)
    parser.add_argument("incremental_output", type=Path)
    parser.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    args = parser.parse_args(argv)
    try:
        s = generate(**vars(args))
    except ValueError as exc:
        parser.error(str(exc))  # exits with status 2
    print(
        f"seed={s.seed} day1_rows={s.initial_rows} day2_rows={s.incremental_rows} "
        f"deleted={s.deleted} updated={s.updated} unchanged={s.unchanged} inserted={s.inserted}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
