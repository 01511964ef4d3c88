"""``CDC_UMASK`` (cdc_assets/model/file_modes.py, issue 46 point 13): the umask every entry point sets, the one
Hadoop's writes take from the Spark conf, and the roots it tightens; and the setting that opts out.
tests/test_privacy.py walks what a real run writes under the default."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from cdc_assets.engines.spark_conf import HADOOP_UMASK, file_mode_conf
from cdc_assets.model.file_modes import configured_umask, tighten_files_in, tighten_root

REPO = Path(__file__).resolve().parent.parent
# A process that sets CDC_UMASK as the commands do (their first line), then makes a folder and a file.
_MAKES = (
    "import os, sys; from cdc_assets.model.file_modes import apply_umask; apply_umask(); "
    "os.mkdir(sys.argv[1] + '/folder'); open(sys.argv[1] + '/file', 'w').close()"
)


def _modes_made(tmp_path: Path, umask_setting: str | None) -> tuple[int, int]:
    env = {key: value for key, value in os.environ.items() if key != "CDC_UMASK"}
    if umask_setting is not None:
        env["CDC_UMASK"] = umask_setting
    subprocess.run([sys.executable, "-c", _MAKES, str(tmp_path)], env=env, cwd=REPO, check=True, preexec_fn=lambda: os.umask(0o022))
    return stat.S_IMODE((tmp_path / "folder").stat().st_mode), stat.S_IMODE((tmp_path / "file").stat().st_mode)


@pytest.mark.parametrize(("setting", "folder", "file"), [(None, 0o700, 0o600), ("027", 0o750, 0o640), ("inherit", 0o755, 0o644)])
def test_a_command_makes_owner_only_files_unless_cdc_umask_says_otherwise(tmp_path, setting, folder, file):
    assert _modes_made(tmp_path, setting) == (folder, file)


def test_a_bad_cdc_umask_is_an_error_that_names_the_variable(monkeypatch):
    for bad in ("rw-------", "0999", "1777"):
        monkeypatch.setenv("CDC_UMASK", bad)
        with pytest.raises(ValueError, match=f"CDC_UMASK='{bad}': an octal umask such as 077"):
            configured_umask()


def test_an_existing_root_loses_only_the_bits_the_umask_removes(tmp_path, monkeypatch):
    root = tmp_path / "warehouse"
    root.mkdir()
    (root / "old.parquet").write_bytes(b"x")
    for path, mode in ((root, 0o755), (root / "old.parquet", 0o644)):
        path.chmod(mode)

    monkeypatch.setenv("CDC_UMASK", "inherit")
    assert tighten_root(root) is None and stat.S_IMODE(root.stat().st_mode) == 0o755
    monkeypatch.setenv("CDC_UMASK", "027")
    assert tighten_root(root) == f"{root}: mode 0755 -> 0750 (CDC_UMASK=027)"
    monkeypatch.delenv("CDC_UMASK")
    assert tighten_root(root) == f"{root}: mode 0750 -> 0700 (CDC_UMASK=077)"
    assert tighten_root(root) is None  # already tight
    root.chmod(0o500)  # never adds a bit
    assert tighten_root(root) is None and stat.S_IMODE(root.stat().st_mode) == 0o500
    root.chmod(0o700)
    assert stat.S_IMODE((root / "old.parquet").stat().st_mode) == 0o644  # below the root: untouched (the root shuts it)
    assert tighten_files_in(root) == [f"{root / 'old.parquet'}: mode 0644 -> 0600"]  # the few files Dagster makes first
    assert tighten_root(tmp_path / "absent") is None and tighten_root("s3://bucket/warehouse") is None


def _written_modes(folder: Path) -> set[int]:
    return {stat.S_IMODE(path.stat().st_mode) for path in folder.iterdir()} | {stat.S_IMODE(folder.stat().st_mode)}


def test_spark_writes_through_hadoop_take_the_umask_from_the_conf(spark, tmp_path, monkeypatch):
    # Hadoop's local file system sets each file's mode from its own umask (022 unless told), whatever the
    # process's: the session the project built has CDC_UMASK's, so its files are 0600 while its JVM runs under 022.
    jvm = spark.sparkContext._gateway.proc.pid  # a test's seam: the session's JVM, which pytest started
    (umask_line,) = [line for line in Path(f"/proc/{jvm}/status").read_text().splitlines() if line.startswith("Umask:")]
    assert spark.sparkContext.getConf().get(HADOOP_UMASK) == "077"
    spark.range(2).coalesce(1).write.parquet(str(tmp_path / "default"))
    assert _written_modes(tmp_path / "default") == {0o600, 0o700}, umask_line

    # CDC_UMASK=027, as a JVM started under it gets it (a fresh file system: Hadoop caches one per conf it met first).
    monkeypatch.setenv("CDC_UMASK", "027")
    assert file_mode_conf() == {HADOOP_UMASK: "027"}
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    key, uncached = HADOOP_UMASK.removeprefix("spark.hadoop."), "fs.file.impl.disable.cache"
    before = (hadoop.get(key), hadoop.get(uncached))
    hadoop.set(key, file_mode_conf()[HADOOP_UMASK])
    hadoop.set(uncached, "true")
    try:
        spark.range(2).coalesce(1).write.parquet(str(tmp_path / "group"))
    finally:
        for name, value in zip((key, uncached), before):
            hadoop.unset(name) if value is None else hadoop.set(name, value)
    assert _written_modes(tmp_path / "group") == {0o640, 0o750}
    monkeypatch.setenv("CDC_UMASK", "inherit")
    assert file_mode_conf() == {}
