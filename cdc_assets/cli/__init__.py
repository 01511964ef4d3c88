"""The commands (``cdc-current``, ``cdc-scd2``, ``cdc-changes``, ``cdc-catalog``, ``cdc-erase``, ``cdc-generate``) and the servers they start."""
