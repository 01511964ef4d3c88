"""What the Dagster UI says each asset of a table is: its description, written for the user who opens it."""

from cdc_assets.model.names import (
    PUBLISHED,
    APPLIED_SEQUENCES,
    CLASSIFICATION,
    CURRENT,
    DELETES,
    HASHED_INCOMING,
    HISTORY,
    INSERTS,
    LATE_CHANGES,
    REJECTS,
    UPDATES,
)

ASSET_DESCRIPTIONS = {
    HASHED_INCOMING: (
        "The day's extract as read from the source, cast to the configured types, with `key_hash` and "
        "`non_key_hash` (MD5 of the canonical encoding, see docs/design.md) computed once and stored. Rows that "
        "fail validation are in `rejects`, never here. A change set keeps every accepted record of the day, "
        "with its `change_flag` (I/U/D, T for a truncate) and `change_sequence`."
    ),
    REJECTS: (
        "Quarantined input rows of the day: the raw record, why it was rejected (malformed, a value that "
        "does not cast, a NULL or empty key, a duplicated key, bytes not valid in the source's encoding) and "
        "the source file. "
        "Rows read = rows in hashed_incoming + rows here."
    ),
    CLASSIFICATION: (
        "One row per key the day touched: the day's incoming hashes FULL OUTER JOIN the previous day's "
        "current_table hashes ON key_hash, classified I (insert), U (update), N (no change) and, for full "
        "loads, D (deleted). Only hash columns take part in the join. For a change set the incoming side is "
        "each key's winning record (greatest sequence), and a delete record makes D. A key a delta or change "
        "set did not supply (X) is counted in the metadata (`not_supplied`), not stored."
    ),
    INSERTS: "Rows whose key is new today (I), with their full payload from the day's input.",
    DELETES: (
        "Keys deleted today (D), with their last payload from the previous current_table: keys missing from "
        "a full load, and keys a change set deleted. A delta deletes nothing; the keys it did not supply (X) "
        "are counted in hash_join_classification's metadata, not stored."
    ),
    UPDATES: (
        "Rows whose non-key values changed today (U), with their full payload from the day's input and "
        "`changed_columns`: the sorted non-key columns whose values differ from the previous version."
    ),
    CURRENT: (
        "The table's state as of the business date: I + U + N (payload from the day's input) + X "
        "(payload kept from the previous state). Deleted keys leave. `eff_start_date` is the date the "
        "row's current version started, and `process_id`/`processed_at` the run that started it. With "
        "`storage: {current: snapshot}` (the default) each partition stores the full state; with "
        "`incremental` a date stores its changes and now and then a full copy (`stored_as` in the metadata). "
        "Read a date's state with `cdc-current` or `cdc_assets.usecases.readers.current_state` in either mode. "
        "A re-run of a date that later stored dates were computed from is refused before anything is written, "
        "naming the range to launch (that date through the newest stored one, one run or a backfill); inside "
        "such a backfill it drops the later dates of every CDC output in the commit that writes its own, and "
        "the backfill writes them again (docs/operations.md)."
    ),
    HISTORY: (
        "The date's net changes: I + U + D, each with eff_start_date = the business date (D rows carry "
        "their last payload), `changed_columns` on U rows, and `process_id`/`processed_at` of the run "
        "that wrote the date. Read the asset folder as one dataset for the whole history; "
        "`cdc_assets.usecases.readers.scd2_view` and `cdc-scd2` turn it into SCD type 2 versions."
    ),
    LATE_CHANGES: (
        "Change records of the date that were not applied: `reason` late (their sequence is not greater "
        "than the one already applied to their key on an earlier date, a deleted key's included), or tied "
        "(with duplicate_keys: quarantine, every record of a key whose greatest sequence of the day is shared "
        "by two different records). Each row is the record as it came in, with `reason` and the "
        "`applied_sequence` of its key."
    ),
    APPLIED_SEQUENCES: (
        "The CDC step's own state: for every key in current_table, and every key deleted within "
        "tombstone_retention_days, the last sequence applied to it (`deleted` for a tombstone), and the "
        "table's floor (the greatest truncate's sequence, in the row whose `key_hash` is NULL; kept for good). "
        "The next date tells late records by it."
    ),
    PUBLISHED: (
        "The date is published: every output of the run (hashed_incoming and rejects included) was written to "
        "the run's own Iceberg branch, cdc_run_<run id>, where readers of the tables do not see it; every "
        "blocking check passed on what was staged there; then each output's main branch was moved to it, "
        "current_table last, and the branch dropped. Not materialized for a date: the date is staged only "
        "(a check failed, or the run stopped before publishing; its outputs' metadata names the branch, "
        "readable for publish.keep_failed_days) or was never run. docs/publishing.md."
    ),
}
