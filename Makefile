# Everything runs from .venv, which the first target that needs it creates.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export DAGSTER_HOME

# The UI listens on loopback only unless you ask otherwise, e.g. `make ui UI_HOST=0.0.0.0`.
UI_HOST ?= 127.0.0.1
UI_PORT ?= 3000

# The demo: the seed's scenario (10,000 + 10,000 rows, 5 keys, 10 non-keys, 20% deleted, 40% updated, 40% unchanged).
DEMO_DATES := 2019-06-18 2019-06-19

.PHONY: install demo test test-fast ui validate benchmark clean

$(BIN)/dagster: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/dagster

$(DAGSTER_HOME)/dagster.yaml: instance/dagster.yaml
	mkdir -p $(DAGSTER_HOME)
	cp instance/dagster.yaml $@

demo: install $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/cdc-generate 10000 10000 5 10 0.2 0.4 0.4 data/synthetic/2019-06-18 data/synthetic/2019-06-19 --seed 42
	for date in $(DEMO_DATES); do \
		$(BIN)/dagster asset materialize -m cdc_assets.definitions --select 'group:synthetic' --partition $$date || exit 1; \
	done
	$(BIN)/python -m cdc_assets.report synthetic

test: install
	$(BIN)/python -m pytest

test-fast: install
	$(BIN)/python -m pytest -m "not slow"

validate: install $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/dagster definitions validate -w workspace.yaml

ui: install $(DAGSTER_HOME)/dagster.yaml
	$(BIN)/dagster dev -w workspace.yaml -h $(UI_HOST) -p $(UI_PORT)

benchmark: install
	$(BIN)/python benchmarks/bench_pipeline.py

clean:
	rm -rf data warehouse spark-warehouse metastore_db .dagster_home
