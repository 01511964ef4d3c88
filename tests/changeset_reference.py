"""A plain-Python oracle for ``load_type: changeset``: one business date applied to the previous state.

Independent of the pipeline (no Spark, no project imports), written to be read and checked by eye.
The table it models is the tests' changeset table: key ``id``, tracked non-key ``value``, untracked
``cdc_timestamp``, which is also the sequence. A record is a dict ``{flag, id, value, cdc_timestamp}``
with ``flag`` already normalized to I, U, D, or T for a truncate (which names no key: ``id`` None).

Semantics (seed 003, Table 1 and its ``RANK() OVER (PARTITION BY ID ORDER BY CDC_TIMESTAMP DESC)``):

1. Exact repeats of a record (same key, sequence, flag and values) count once.
2. A record whose sequence is not greater than the sequence last applied to its key on an earlier
   date is late: it is set aside (``late``) and not applied. A delete's tombstone is remembered for
   ``retention_days`` days after the date it was applied; an expired tombstone is forgotten. A
   truncate at sequence T on an earlier date is a floor for every key, kept for good: a record
   below T is late too (one at T is taken to come after the truncate).
2a. On the truncate's own date, a record below the day's greatest truncate T is superseded by it;
   a key current holds whose applied sequence is below T is deleted (D) unless a record of the day
   at or after T touches it.
3. Per key, the remaining record with the greatest sequence wins. Two different records sharing the
   greatest sequence are a tie (late records were set aside first, so they never tie):
   ``duplicate_keys="fail"`` raises :class:`Tie`, ``"quarantine"`` sets all of that key's remaining
   records of the date aside (reason ``tied``) and leaves the key as it was.
4. The winner against the previous current state:
   - D, key in current      -> D: leaves current; history carries its last payload from current.
   - D, key not in current  -> nothing, but its sequence is remembered (a tombstone).
   - I/U, key not in current -> I (eff_start_date = day).
   - I/U, other value       -> U (eff_start_date = day).
   - I/U, same value        -> N (eff_start_date kept, payload = the winner's; not in history).
   - a key in current the date does not touch -> X (kept as it was).
5. current = I + U + N + X rows; history = I + U + D rows.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date
from typing import Any

UPSERT_FLAGS = ("I", "U")
DELETE_FLAG = "D"
TRUNCATE_FLAG = "T"
FLOOR = "floor"  # the key under which ``applied`` keeps the greatest truncate's sequence


@dataclass(frozen=True)
class Row:
    """One key's row of current_table or history_partition (the key is the dict key or ``id``)."""

    value: Any
    cdc_timestamp: Any
    operation: str
    eff_start_date: date


@dataclass(frozen=True)
class Applied:
    """The last sequence applied to a key, whether that change was a delete, and on which date."""

    seq: Any
    deleted: bool
    applied_on: date


class Tie(Exception):
    """Two different records of one key share the key's greatest sequence of the date."""

    def __init__(self, key, seq):
        super().__init__(f"key id={key}: two different records share the greatest sequence {seq}")
        self.key, self.seq = key, seq


def record_identity(record: dict) -> tuple:
    return (record["id"], record["cdc_timestamp"], record["flag"], record["value"])


def apply_day(
    current: dict[Any, Row],
    applied: dict[Any, Applied],
    records: list[dict],
    day: date,
    retention_days: int = 30,
    duplicate_keys: str = "fail",
):
    """Apply one date's change records.

    Returns ``(new_current, new_applied, history, late, counts)``:
    - ``new_current``: key -> Row, the current_table of ``day``;
    - ``new_applied``: key -> Applied, the state the next date starts from;
    - ``history``: key -> Row, the history_partition of ``day`` (I, U and D rows);
    - ``late``: list of ``(record, applied_seq)``, the late_changes of ``day``;
    - ``counts``: operation and event counts (I, U, D, N, X, late, duplicate_events,
      deletes_of_unknown_keys, quarantined_keys, quarantined_records).
    """
    counts = dict.fromkeys(
        ("I", "U", "D", "N", "X", "late", "duplicate_events", "deletes_of_unknown_keys",
         "quarantined_keys", "quarantined_records", "truncates"),
        0,
    )

    # Tombstones older than the retention are forgotten; live keys keep their last sequence.
    applied = {
        key: state
        for key, state in applied.items()
        if key == FLOOR or not (state.deleted and (day - state.applied_on).days > retention_days)
    }
    floor = applied.get(FLOOR)

    # 1. Exact repeats count once (first occurrence kept).
    unique: list[dict] = []
    seen: set[tuple] = set()
    for record in records:
        identity = record_identity(record)
        if identity in seen:
            counts["duplicate_events"] += 1
            continue
        seen.add(identity)
        unique.append(record)

    # 2. Late records: sequence not greater than what an earlier date applied to the key.
    late: list[tuple[dict, Any]] = []
    by_key: dict[Any, list[dict]] = {}
    truncates = [record["cdc_timestamp"] for record in unique if record["flag"] == TRUNCATE_FLAG]
    counts["truncates"] = len(truncates)
    truncated_at = max(truncates, default=None)
    for record in unique:
        if record["flag"] == TRUNCATE_FLAG:
            continue
        state = applied.get(record["id"])
        if state is not None and state.applied_on < day and not record["cdc_timestamp"] > state.seq:
            late.append((record, state.seq))
            continue
        if floor is not None and record["cdc_timestamp"] < floor.seq:
            late.append((record, floor.seq))
            continue
        if truncated_at is not None and record["cdc_timestamp"] < truncated_at:
            continue  # 2a: superseded by the day's truncate
        by_key.setdefault(record["id"], []).append(record)
    counts["late"] = len(late)

    # 3. The winner per key: RANK() OVER (PARTITION BY id ORDER BY seq DESC) = 1.
    winners: dict[Any, dict] = {}
    for key, key_records in by_key.items():
        top = max(record["cdc_timestamp"] for record in key_records)
        ranked_first = [record for record in key_records if record["cdc_timestamp"] == top]
        if len(ranked_first) > 1:
            if duplicate_keys == "fail":
                raise Tie(key, top)
            counts["quarantined_keys"] += 1
            counts["quarantined_records"] += len(key_records)
            continue
        winners[key] = ranked_first[0]

    # 4. Each winner against the previous current state.
    new_current: dict[Any, Row] = {}
    new_applied = dict(applied)
    history: dict[Any, Row] = {}
    for key, winner in winners.items():
        before = current.get(key)
        if winner["flag"] == DELETE_FLAG:
            new_applied[key] = Applied(winner["cdc_timestamp"], True, day)
            if before is None:
                counts["deletes_of_unknown_keys"] += 1
            else:
                history[key] = Row(before.value, before.cdc_timestamp, "D", day)
                counts["D"] += 1
            continue
        assert winner["flag"] in UPSERT_FLAGS, winner
        new_applied[key] = Applied(winner["cdc_timestamp"], False, day)
        if before is None:
            row = Row(winner["value"], winner["cdc_timestamp"], "I", day)
        elif before.value != winner["value"]:
            row = Row(winner["value"], winner["cdc_timestamp"], "U", day)
        else:
            row = Row(winner["value"], winner["cdc_timestamp"], "N", before.eff_start_date)
        new_current[key] = row
        counts[row.operation] += 1
        if row.operation in ("I", "U"):
            history[key] = row

    # Keys in current that the date did not change (untouched, or every record late or quarantined),
    # unless the day's truncate deleted them.
    for key, before in current.items():
        if key in winners:
            continue
        if truncated_at is not None and applied[key].seq < truncated_at:
            history[key] = Row(before.value, before.cdc_timestamp, "D", day)
            counts["D"] += 1
            continue
        new_current[key] = replace(before, operation="X")
        counts["X"] += 1

    # The floor rises to the day's truncate; what is below it is subsumed by it.
    if truncated_at is not None and (floor is None or truncated_at > floor.seq):
        new_applied = {key: state for key, state in new_applied.items() if key != FLOOR and state.seq >= truncated_at}
        new_applied[FLOOR] = Applied(truncated_at, True, day)

    return new_current, new_applied, history, late, counts


def apply_days(days: list[tuple[date, list[dict]]], retention_days: int = 30, duplicate_keys: str = "fail"):
    """Apply dates in order from an empty state; returns one ``(current, history, late, counts)`` per date."""
    current: dict[Any, Row] = {}
    applied: dict[Any, Applied] = {}
    outputs = []
    for day, records in days:
        current, applied, history, late, counts = apply_day(current, applied, records, day, retention_days, duplicate_keys)
        outputs.append((current, history, late, counts))
    return outputs
