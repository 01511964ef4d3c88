# Everything runs from .venv, which the first target that needs it creates.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export DAGSTER_HOME

# Owner-only files (docs/operations.md, File modes): the recipes that make DAGSTER_HOME or run the dagster CLI run
# under CDC_UMASK (077: folders 0700, files 0600; `inherit` keeps the shell's umask), as do the processes they
# start; the project's own commands set it themselves.
CDC_UMASK ?= 077
export CDC_UMASK
UMASK := $(if $(filter inherit,$(strip $(CDC_UMASK))),true,umask $(CDC_UMASK))

# The UI listens on loopback only unless you ask otherwise, e.g. `make ui UI_HOST=0.0.0.0`.
UI_HOST ?= 127.0.0.1
UI_PORT ?= 3000

# The demo: the seed's scenario (10,000 + 10,000 rows, 5 keys, 10 non-keys, 20% deleted, 40% updated, 40% unchanged).
DEMO_FIRST := 2019-06-18
DEMO_LAST := 2019-06-19

# The project's Spark Connect server on 127.0.0.1: `make ui` starts it (or reuses one `make spark-server`
# left running) and sends every run through it; `make demo` and the dagster CLI use it whenever it runs.
# CDC_SPARK=local opts out; SPARK_REMOTE points at any other server (resources/session/spark_target.py).
SPARK_CONNECT_PORT ?= 15002
CDC_SPARK_SERVER_DIR ?= $(CURDIR)/.spark-server
SPARK_SERVER_DIR := $(CDC_SPARK_SERVER_DIR)
export SPARK_CONNECT_PORT CDC_SPARK_SERVER_DIR

# A Spark standalone cluster on 127.0.0.1 (`make cluster-up`): a master and two workers of 1 core and 2g;
# runs use it with CDC_SPARK_MASTER=spark://127.0.0.1:7077. Other sizes and ports: CLUSTER_ARGS='--worker-memory 4g'.
SPARK_CLUSTER_DIR := $(CURDIR)/.spark-cluster
# SPARK_REMOTE reaches the commands only when it is non-empty: pyspark takes an empty one as a Connect URL.
ifeq ($(strip $(SPARK_REMOTE)),)
unexport SPARK_REMOTE
else
export SPARK_REMOTE
endif

.PHONY: install jars demo test test-fast lint browser ui validate benchmark benchmark-many benchmark-state spark-server spark-server-stop cluster-up cluster-down lake-up lake-down lake-env trino-install trino-up trino-down sql sql-server sql-server-stop clean

$(BIN)/dagster: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/dagster jars sql-server-jar

# The SQL server's read-only rule and password check (cdc_assets/cli/sql_server.py): Java 17 sources in
# java/sql-server/, compiled against the .venv's pyspark jars into .build/ (never committed). Rebuilt when
# a source changes; needs a JDK's javac and jar (Debian: openjdk-17-jdk-headless).
SQL_SERVER_SOURCES := $(shell find java/sql-server -name '*.java')
SQL_SERVER_JAR := .build/sql-server.jar
.PHONY: sql-server-jar
sql-server-jar: $(SQL_SERVER_JAR)
$(SQL_SERVER_JAR): $(SQL_SERVER_SOURCES) $(BIN)/dagster
	@command -v javac >/dev/null 2>&1 || { echo "sql-server-jar: javac is not installed (a JDK 17: apt-get install openjdk-17-jdk-headless)" >&2; exit 1; }
	@rm -rf .build/classes && mkdir -p .build/classes
	javac --release 17 -nowarn -d .build/classes -cp "$$($(BIN)/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars", "*"))')" $(SQL_SERVER_SOURCES)
	jar cf $@.partial -C .build/classes . && mv $@.partial $@

# The jars every Spark the project starts loads (cdc_assets/engines/iceberg_runtime.py puts each .jar of
# .jars/ on its classpath), copied from Maven Central by mvn, pinned by version and checked by sha256.
# Where Central cannot be reached: a Maven mirror in mvn's own settings (~/.m2/settings.xml, or
# MVN='mvn -s settings.xml'), or the two jars copied into .jars/ by hand (README, "Without Maven Central").
MVN ?= mvn
JARS_DIR := .jars
# The Iceberg Spark runtime for the project's Spark line, 4.0 built for Scala 2.13 (pyspark 4.0's): 1.11.0
# is the newest Iceberg release with a 4.0 runtime (1.12.0 has 4.1's only). Shaded: it needs no other jar.
ICEBERG_RUNTIME := org.apache.iceberg:iceberg-spark-runtime-4.0_2.13:1.11.0
ICEBERG_RUNTIME_SHA256 := 63c3b812549dc232c1920865ff42436df8604a9bbacd693930985c06bd97e6dc
# The SQLite JDBC driver of the embedded catalog: Iceberg's JDBC catalog on the warehouse's SQLite file
# (resources/storage/lake.py), which pyiceberg opens with Python's own sqlite3. One self-contained jar.
SQLITE_JDBC := org.xerial:sqlite-jdbc:3.51.1.0
SQLITE_JDBC_SHA256 := 29eda0d1e5ab235b0f1baad05c531106c59c4a72c92a51a4b9c1a4e4c84abffe
# S3 (docs/object-storage.md), three jars and no more. Iceberg's AWS bundle: the AWS SDK v2 (2.44.4) for
# Iceberg's S3FileIO and the REST catalog's SigV4 signing, unshaded, so S3A uses it too. Hadoop's S3A file
# system for pyspark 4.0's Hadoop client, 3.4.1 (extracts, the erase ledger's key hashes), with the one SDK
# module it needs that the bundle lacks, the transfer manager, at the bundle's SDK version.
ICEBERG_AWS_BUNDLE := org.apache.iceberg:iceberg-aws-bundle:1.11.0
ICEBERG_AWS_BUNDLE_SHA256 := 38f01da7e96850cdd05e6616d758b77b43314b712a8808e3f9a824d56976162f
HADOOP_AWS := org.apache.hadoop:hadoop-aws:3.4.1
HADOOP_AWS_SHA256 := 01334a07e179cae2b7e251f24857f11e3759108c9d6a79dcbe362a4295227da2
S3_TRANSFER_MANAGER := software.amazon.awssdk:s3-transfer-manager:2.44.4
S3_TRANSFER_MANAGER_SHA256 := dbcad736b19f6eb8471f9edf027d9fffe994228f25f415894efd01fd80cb6c02
JAR_PINS := $(ICEBERG_RUNTIME)=$(ICEBERG_RUNTIME_SHA256) $(SQLITE_JDBC)=$(SQLITE_JDBC_SHA256) \
	$(ICEBERG_AWS_BUNDLE)=$(ICEBERG_AWS_BUNDLE_SHA256) $(HADOOP_AWS)=$(HADOOP_AWS_SHA256) \
	$(S3_TRANSFER_MANAGER)=$(S3_TRANSFER_MANAGER_SHA256)

# Runs every time: a jar already there is only checked (a quarter of a second), a missing one is copied,
# and a pin changed here replaces its old jar.
jars:
	@mkdir -p $(JARS_DIR)
	@set -e; for pin in $(JAR_PINS); do \
		coordinate=$${pin%%=*}; sha256=$${pin#*=}; \
		artifact=$$(echo "$$coordinate" | cut -d: -f2); version=$$(echo "$$coordinate" | cut -d: -f3); \
		jar=$(JARS_DIR)/$$artifact-$$version.jar; \
		for old in $(JARS_DIR)/$$artifact-*.jar; do \
			if [ -f "$$old" ] && [ "$$old" != "$$jar" ]; then echo "jars: removing $$old (pinned now: $$version)"; rm -f "$$old"; fi; \
		done; \
		if [ ! -f "$$jar" ]; then \
			if ! command -v $(firstword $(MVN)) >/dev/null 2>&1; then \
				echo "jars: $$jar is missing and Maven ($(firstword $(MVN))) is not installed: install Maven (Debian: apt-get install maven), or copy $$artifact-$$version.jar ($$coordinate) into $(JARS_DIR)/ by hand (README: Without Maven Central)" >&2; \
				exit 1; \
			fi; \
			echo "jars: $$coordinate"; \
			rm -rf $(JARS_DIR)/.partial; \
			if ! output=$$($(MVN) --batch-mode -q dependency:copy -Dartifact=$$coordinate -DoutputDirectory=$(JARS_DIR)/.partial 2>&1); then \
				printf '%s\n' "$$output" >&2; \
				echo "jars: mvn could not copy $$coordinate: where Maven Central cannot be reached, see README (Without Maven Central)" >&2; exit 1; \
			fi; \
			mv $(JARS_DIR)/.partial/$$artifact-$$version.jar "$$jar"; \
			rm -rf $(JARS_DIR)/.partial; \
		fi; \
		if ! echo "$$sha256  $$jar" | sha256sum --check --status; then \
			echo "jars: $$jar is not the pinned $$coordinate (its sha256 differs): delete it and run make install again" >&2; exit 1; \
		fi; \
	done

$(DAGSTER_HOME)/dagster.yaml: instance/dagster.yaml
	$(UMASK) && mkdir -p $(DAGSTER_HOME) && cp instance/dagster.yaml $@

demo: install $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/cdc-generate 10000 10000 5 10 0.2 0.4 0.4 data/synthetic/2019-06-18 data/synthetic/2019-06-19 --seed 42
	# One run of the range, oldest date first: a second `make demo` re-runs both dates, which a run of the first
	# date alone may not do once the second is stored (docs/operations.md, re-running a date).
	$(UMASK) && $(BIN)/dagster asset materialize -m cdc_assets.defs.definitions --select 'group:synthetic' --partition-range $(DEMO_FIRST)...$(DEMO_LAST)
	$(BIN)/python -m cdc_assets.cli.report synthetic

# Two pytest sessions at once, each in its own process with its own Spark and temp folder: the slow tests
# that start servers and whole processes (the dagster CLI, Connect, the SQL server, make ui), and the rest
# with the lake's tests (SeaweedFS) and the slow in-process ones (marker in_process), which balance the
# two. Much of a slow test is a JVM starting or a server coming up, which the other session overlaps on
# the 2-core machines the suite is sized for (docs/testing.md). The second session's output follows the
# first's. PYTEST_ARGS go to both.
SUITE_FIRST := not slow or lake or in_process
SUITE_SECOND := slow and not lake and not in_process
test: install browser lint trino-install
	@second_log=$$(mktemp); second_tmp=$$(mktemp -d); \
	$(BIN)/python -m pytest -m "$(SUITE_SECOND)" -p no:cacheprovider --basetemp="$$second_tmp/basetemp" $(PYTEST_ARGS) > "$$second_log" 2>&1 & second=$$!; \
	trap 'kill $$second 2>/dev/null' INT TERM; \
	echo "make test: the tests '$(SUITE_SECOND)' run beside these (pid $$second); their output follows"; \
	$(BIN)/python -m pytest -m "$(SUITE_FIRST)" $(PYTEST_ARGS); first_rc=$$?; \
	wait $$second; second_rc=$$?; \
	echo "================ the tests '$(SUITE_SECOND)', run beside the others ================"; \
	cat "$$second_log"; rm -rf "$$second_log" "$$second_tmp"; \
	echo "make test: '$(SUITE_FIRST)' exited $$first_rc, '$(SUITE_SECOND)' exited $$second_rc"; \
	test $$first_rc = 0 && test $$second_rc = 0

# Ruff's rules and mypy's settings are pyproject.toml's [tool.ruff] and [tool.mypy]; `make test` runs this first.
lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

test-fast: install
	$(BIN)/python -m pytest -m "not slow and not lake" $(PYTEST_ARGS)

# Chromium for the browser test (tests/test_ui_browser.py), from Debian's package: Playwright's own browser
# download cannot be reached from here. Installs only when no Chromium is found and apt-get can run as root;
# otherwise it says so and the browser test skips with the same message.
CHROMIUM ?= $(firstword $(wildcard /usr/bin/chromium) $(shell command -v chromium chromium-browser 2>/dev/null))
browser:
	@if [ -n "$(CHROMIUM)" ]; then \
		echo "browser: $(CHROMIUM)"; \
	elif command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
		if apt-get install -y -q chromium >/dev/null 2>&1 || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null 2>&1; }; then \
			echo "browser: installed $$(/usr/bin/chromium --version 2>/dev/null)"; \
		else \
			echo "browser: apt-get install chromium failed; the browser test will skip"; \
		fi; \
	else \
		echo "browser: no Chromium and no root apt-get; the browser test will skip (install Debian's chromium, or set CDC_CHROMIUM)"; \
	fi

validate: install $(DAGSTER_HOME)/dagster.yaml
	$(UMASK) && $(BIN)/dagster definitions validate -w workspace.yaml

# Ctrl-C, or SIGTERM to make, stops the webserver, the daemon and the code servers, even when a script
# started `make ui &` (cdc_assets/cli/dev_ui.py says why that needs a step before dagster dev).
ui: install $(DAGSTER_HOME)/dagster.yaml
	$(UMASK) && exec $(BIN)/python -m cdc_assets.cli.dev_ui -w workspace.yaml -h $(UI_HOST) -p $(UI_PORT)

# The benchmarks (benchmarks/README.md): one harness, `python -m benchmarks SCENARIO`, each run a fresh process
# group; JSON results in benchmarks/results/. Compared with ../shared/bench/plain_cdc.py when a clone has it.
# Every target of issues 10, 11 and 23, then issue 25's schema-change date at 1M rows, then issue 26's erase of
# 100 keys from 30 dates x 100,000 rows (about 45-55 min idle at the defaults); small: make benchmark
# BENCH_ARGS='--rows 20000 --range-days 3 --range-rows 2000' SCHEMA_ARGS='--rows 100000' ERASE_ARGS='--rows 10000 --dates 5'
benchmark: install
	$(BIN)/python -m benchmarks targets $(BENCH_ARGS)
	$(BIN)/python -m benchmarks schema $(SCHEMA_ARGS)
	$(BIN)/python -m benchmarks erase $(ERASE_ARGS)

# Issue 13's scale target: day 2 at 1M and 10M rows (about 35 min and 40 GB of disk idle); small: SCALE_ARGS='--rows 20000,100000'
.PHONY: benchmark-scale
benchmark-scale: install
	$(BIN)/python -m benchmarks scale $(SCALE_ARGS)

# Issue 22's many-tables targets: day 2 of 20 tables of 100,000 rows through the run queue, warm (one
# Connect server) against cold (a JVM per run), and the server's peak RSS (about 45-60 min idle);
# seed 003's 65 tables: make benchmark-many BENCH_ARGS='--tables 65 --rows 20000 --skip-cold'
benchmark-many: install
	$(BIN)/python -m benchmarks many $(BENCH_ARGS)

# Issue 23's incremental-state targets: a 10M-row delta table's day 2 in snapshot, incremental and
# compaction modes (the state scenario, about 45 min and 40 GB of disk idle), then 1M-row full loads and
# change sets in both modes (targets, about 15 min). Small: BIG_ARGS='--rows 200000' STATE_ARGS='--rows 20000'
benchmark-state: install
	$(BIN)/python -m benchmarks state $(BIG_ARGS)
	$(BIN)/python -m benchmarks targets --only b,b-incremental,changeset,changeset-incremental $(STATE_ARGS)

# Prints the server's sc:// URL; the server keeps running (its pid and log are in .spark-server/).
spark-server: install
	$(BIN)/python -m cdc_assets.engines.connect_server start --port $(SPARK_CONNECT_PORT) --state-dir $(SPARK_SERVER_DIR)

spark-server-stop: install
	$(BIN)/python -m cdc_assets.engines.connect_server stop --state-dir $(SPARK_SERVER_DIR)

# Prints the master's spark:// URL once both workers have registered; pids, logs and executors' work dirs in .spark-cluster/.
cluster-up: install
	$(BIN)/python -m cdc_assets.engines.cluster start --state-dir $(SPARK_CLUSTER_DIR) $(CLUSTER_ARGS)

# Stops the master and the workers, and with them their executors.
cluster-down: install
	$(BIN)/python -m cdc_assets.engines.cluster stop --state-dir $(SPARK_CLUSTER_DIR)

# A local S3 lake on 127.0.0.1 (docs/object-storage.md): SeaweedFS serving S3 on $(LAKE_S3_PORT) and an Iceberg REST
# catalog on $(LAKE_CATALOG_PORT), its data and its key pair in .lake/. `eval "$$(make -s lake-env)"` points the
# project at it: make demo, make ui, the dagster CLI and every cdc-* command then use the lake.
LAKE_DIR := $(CURDIR)/.lake
LAKE_S3_PORT ?= 8333
LAKE_CATALOG_PORT ?= 8181
lake-up: install
	$(BIN)/python -m cdc_assets.engines.lake_server start --state-dir $(LAKE_DIR) --s3-port $(LAKE_S3_PORT) --catalog-port $(LAKE_CATALOG_PORT)

# Stops the lake; its data stays in .lake/ for the next lake-up.
lake-down: install
	$(BIN)/python -m cdc_assets.engines.lake_server stop --state-dir $(LAKE_DIR)

# The export lines for the running lake (keys of this local lake only): eval "$$(make -s lake-env)".
lake-env:
	@$(BIN)/python -m cdc_assets.engines.lake_server env --state-dir $(LAKE_DIR)

# Trino, read-only on 127.0.0.1, over the warehouse's catalog (docs/consumers.md; cdc_assets/cli/trino_server.py).
# The server tarball (820 MB, unpacked with the Iceberg plugin only) and the CLI come from Maven Central by mvn,
# pinned and checked by sha256, into .trino/ (ignored by git); the project's SQLite driver goes into the plugin's
# folder. Trino 476 runs on Java 24 or later, not 17: CDC_TRINO_JAVA_HOME, else the newest JDK in /usr/lib/jvm.
TRINO_DIR := .trino
TRINO_VERSION := 476
TRINO_SERVER := io.trino:trino-server:$(TRINO_VERSION):tar.gz
TRINO_SERVER_SHA256 := cfd5accde17e8ebd251eeeb78aed1f490e77bb3a164d95a0f454bf8a7c1cbd3f
TRINO_CLI := io.trino:trino-cli:$(TRINO_VERSION):jar:executable
TRINO_CLI_SHA256 := fe4e9c7fb569cd67673afa1622945f6308e1e59bdb825419352b80887661757b
TRINO_HOME := $(TRINO_DIR)/trino-server-$(TRINO_VERSION)
TRINO_CLI_JAR := $(TRINO_DIR)/trino-cli-$(TRINO_VERSION)-executable.jar
trino-install: install
	@mkdir -p $(TRINO_DIR)
	@set -e; if [ ! -f $(TRINO_CLI_JAR) ]; then \
		echo "trino: $(TRINO_CLI)"; rm -rf $(TRINO_DIR)/.partial; \
		$(MVN) --batch-mode -q dependency:copy -Dartifact=$(TRINO_CLI) -DoutputDirectory=$(TRINO_DIR)/.partial; \
		echo "$(TRINO_CLI_SHA256)  $(TRINO_DIR)/.partial/trino-cli-$(TRINO_VERSION)-executable.jar" | sha256sum --check --status \
			|| { echo "trino: the downloaded CLI is not the pinned $(TRINO_CLI) (its sha256 differs)" >&2; exit 1; }; \
		mv $(TRINO_DIR)/.partial/trino-cli-$(TRINO_VERSION)-executable.jar $(TRINO_CLI_JAR); rm -rf $(TRINO_DIR)/.partial; \
	fi
	@set -e; if [ ! -x $(TRINO_HOME)/bin/launcher ]; then \
		echo "trino: $(TRINO_SERVER)"; rm -rf $(TRINO_DIR)/.partial $(TRINO_HOME); \
		$(MVN) --batch-mode -q dependency:copy -Dartifact=$(TRINO_SERVER) -DoutputDirectory=$(TRINO_DIR)/.partial; \
		echo "$(TRINO_SERVER_SHA256)  $(TRINO_DIR)/.partial/trino-server-$(TRINO_VERSION).tar.gz" | sha256sum --check --status \
			|| { echo "trino: the downloaded server is not the pinned $(TRINO_SERVER) (its sha256 differs)" >&2; exit 1; }; \
		tar xzf $(TRINO_DIR)/.partial/trino-server-$(TRINO_VERSION).tar.gz -C $(TRINO_DIR)/.partial; \
		find $(TRINO_DIR)/.partial/trino-server-$(TRINO_VERSION)/plugin -mindepth 1 -maxdepth 1 ! -name iceberg -exec rm -rf {} +; \
		mv $(TRINO_DIR)/.partial/trino-server-$(TRINO_VERSION) $(TRINO_HOME); rm -rf $(TRINO_DIR)/.partial; \
	fi
	@rm -f $(TRINO_HOME)/plugin/iceberg/sqlite-jdbc-*.jar && cp $(JARS_DIR)/sqlite-jdbc-*.jar $(TRINO_HOME)/plugin/iceberg/

trino-up: trino-install
	$(BIN)/python -m cdc_assets.cli.trino_server start

trino-down: install
	$(BIN)/python -m cdc_assets.cli.trino_server stop

# spark-sql on the SQL catalog (database cdc: <table>_current, _history, _latest, _scd2, runs_log), e.g.
# make sql SQL_ARGS='-e "SELECT * FROM cdc.orders_latest"'. Goes through the SQL server when it runs.
sql: install
	$(BIN)/cdc-catalog sql $(SQL_ARGS)

# The Spark Thrift server on 127.0.0.1:$(SQL_PORT) over the same catalog, for JDBC and beeline clients;
# it registers every table before the port opens.
SQL_PORT ?= 10000
sql-server: install
	$(BIN)/cdc-catalog server start --port $(SQL_PORT)

sql-server-stop: install
	$(BIN)/cdc-catalog server stop

# Stops no server: .spark-server/ (pid file, logs) goes only when its server is not running, .spark-cluster/ likewise.
clean:
	@# The SQL server keeps its metastore in warehouse/_catalog: stop it before that goes.
	@if [ -x $(BIN)/cdc-catalog ]; then $(BIN)/cdc-catalog server stop; fi
	rm -rf data warehouse spark-warehouse metastore_db .dagster_home
	@if [ -f $(SPARK_SERVER_DIR)/server.pid ] && kill -0 "$$(cat $(SPARK_SERVER_DIR)/server.pid)" 2>/dev/null; then \
		echo "kept .spark-server/: its Spark Connect server is running (make spark-server-stop)"; \
	else \
		rm -rf $(SPARK_SERVER_DIR); \
	fi
	@if [ -n "$$(for pid in $(SPARK_CLUSTER_DIR)/*.pid; do [ -f "$$pid" ] && kill -0 "$$(cat "$$pid")" 2>/dev/null && echo alive; done)" ]; then \
		echo "kept .spark-cluster/: a daemon of its Spark cluster is running (make cluster-down)"; \
	else \
		rm -rf $(SPARK_CLUSTER_DIR); \
	fi
