-- SCD type 2 view of a table's history_partition: one row per version of a key.
--
-- A template: cdc_assets.core.scd2.scd2_sql fills in its placeholders (a dollar sign and a name in
-- braces), for Spark SQL or for DuckDB. The two renderings differ only in how identifiers are quoted:
-- backticks for Spark, double quotes for DuckDB.
--   history         the history_partition rows: the configured columns, key_hash, operation,
--                   business_date (DuckDB: iceberg_scan('<metadata file of lake.<table>.history_partition>'))
--   columns         the configured columns, quoted: keys, non-keys, untracked
--   output_columns  the columns the view returns: the configured columns, valid_from, valid_to,
--                   is_current, and is_deleted with hard_deletes new_record
--   as_of           the view's date, YYYY-MM-DD: history after it is not seen
--   open_end        valid_to of an open version: CAST(NULL AS DATE), or a DATE literal such as DATE '9999-12-31'
--   deletion_rows   TRUE with hard_deletes new_record (a D row starts a deletion row), else FALSE
--
-- History holds a key's net changes only (I, U, D), at most one row per key and business date; keys
-- that were unchanged (N) or not supplied (X) that day are not in it, so they close nothing. Each
-- I or U row starts a version of its key on its business date; each D row starts a deletion row
-- carrying the deleted version's payload. Whatever the key's next history row is (a U, a D, or the I
-- of its return) closes it on that row's business date. The query is one scan of the history and
-- one window sorted by key. A version's columns are those of the row that started it: untracked
-- columns are as of the version's start (a change to them alone is an N, not in history).
SELECT ${output_columns}
FROM (
    SELECT
        ${columns},
        business_date AS valid_from,
        COALESCE(closed_on, ${open_end}) AS valid_to,
        closed_on IS NULL AS is_current,
        operation = 'D' AS is_deleted
    FROM (
        SELECT
            ${columns},
            operation,
            business_date,
            LEAD(business_date) OVER (PARTITION BY key_hash ORDER BY business_date) AS closed_on
        FROM (
            SELECT ${columns}, key_hash, operation, CAST(business_date AS DATE) AS business_date
            FROM ${history}
        ) AS history
        -- WHERE is applied before the window: a change after the as-of date closes nothing.
        WHERE business_date <= DATE '${as_of}'
    ) AS chained
    WHERE operation IN ('I', 'U') OR (operation = 'D' AND ${deletion_rows})
) AS versions
