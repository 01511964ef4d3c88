"""Column names shared by the core, the storage layer and the checks."""

# The business date a row belongs to. Also the warehouse's partition column (folders
# ``business_date=YYYY-MM-DD``), so a frame carrying it is written partitioned by it as it is.
# Inside the pipeline dates are ``datetime.date`` in frames and ISO strings only at the Dagster
# boundary (partition keys).
BUSINESS_DATE = "business_date"
