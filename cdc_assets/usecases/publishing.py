"""Publishing a run's staged dates (write, audit, publish; docs/publishing.md). No Dagster here.

A run that publishes writes every date-partitioned output to its own Iceberg branch, ``cdc_run_<run id>``
(``WarehouseStorage.stage``); its checks read that branch; the table's ``published`` step, which Dagster
runs only when every blocking check of the run passed, moves each output's ``main`` to the branch
(``current_table`` last) and drops the branch. What failed checks or killed runs left on their branches
stays readable for ``publish.keep_failed_days``, then the next publication drops it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from cdc_assets.model.config import Retention, TableConfig
from cdc_assets.model.names import CURRENT
from resources.storage import WarehouseStorage


@dataclass
class Publication:
    """What one publication did: the snapshot each output's ``main`` now reads, the dates it published
    (``current_table``'s after it), and the expired branches of other runs it dropped."""

    table: str
    branch: str
    snapshots: dict[str, int] = field(default_factory=dict)
    dates: list[str] = field(default_factory=list)
    dropped_branches: list[str] = field(default_factory=list)
    # retention.snapshot_days applied once published: versions expired, and files no version names removed, per output.
    expired: dict[str, int] = field(default_factory=dict)
    removed_files: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        if not self.snapshots:
            said = f"{self.table}: nothing staged on {self.branch} to publish"
        else:
            said = f"{self.table}: published {', '.join(sorted(self.snapshots))} from {self.branch}"
        if any(self.expired.values()):
            said += f"; retention.snapshot_days expired {sum(self.expired.values())} table version(s)"
        if any(self.removed_files.values()):
            said += f"; removed {sum(self.removed_files.values())} file(s) no table version names (left by killed writes)"
        if self.dropped_branches:
            said += f"; dropped {len(self.dropped_branches)} staging branch(es) past publish.keep_failed_days: {', '.join(self.dropped_branches)}"
        return said


def publish_run(storage: WarehouseStorage, config: TableConfig, days: list[str], now: datetime | None = None) -> Publication:
    """Publish what the run of ``storage`` staged of the table (every output at once, ``current_table`` last),
    then apply ``retention.snapshot_days`` to each output published and drop other runs' staging branches
    older than ``publish.keep_failed_days``. Every date of ``days``
    must then be in ``current_table``'s ``main``: a run that staged nothing of them (its CDC step was left
    out) publishes nothing and says so."""
    publication = Publication(config.name, storage.branch)
    # Each date published is tagged with its name, kept as long as retention.snapshot_days keeps versions.
    snapshot_days = (config.retention or Retention()).snapshot_days
    publication.snapshots = storage.publish(config.name, last=CURRENT, tag_days=snapshot_days)
    # retention.snapshot_days, which the staged writes left for now: the versions the run replaced are no
    # longer what readers see. Files killed writes left are swept when versions age out, not at every run.
    for asset in publication.snapshots:
        publication.expired[asset] = storage.expire_snapshots(config.name, asset, snapshot_days)
        publication.removed_files[asset] = len(storage.remove_unreferenced_files(config.name, asset)) if publication.expired[asset] else 0
    stored = set(storage.stored_dates(config.name, CURRENT))
    publication.dates = [day for day in days if day in stored]
    cutoff = (now or datetime.now(timezone.utc)) - timedelta(days=config.publish.keep_failed_days)
    publication.dropped_branches = storage.drop_staging_branches(config.name, older_than=cutoff)
    return publication
