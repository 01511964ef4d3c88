"""Views: what readers see of stored dates (SCD type 2 versions, changes between dates, a date read as configured)."""
