# Kube-Pathways — every install step lives here; caches live outside the repo.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export KPW_CACHE ?= $(HOME)/.cache/kube-pathways
PYTEST := $(PY) -m pytest -p no:cacheprovider

.PHONY: all demo test lint typecheck unit integration cluster controlplane proto bench bench-quick clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## make demo: pipeline-parallel training on the embedded local runtime
demo: $(STAMP)
	$(PY) examples/pipeline_demo.py

## make test: every tier — layers, types, unit, integration, cluster
test: $(STAMP) controlplane
	$(MAKE) lint
	$(MAKE) typecheck
	$(MAKE) unit
	$(MAKE) integration
	$(MAKE) cluster

lint: $(STAMP)
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict client/pathways operator/pathways_operator worker/pathways_worker

unit: $(STAMP)
	$(PYTEST) tests/unit -q

integration: $(STAMP)
	$(PYTEST) tests/integration -q

cluster: $(STAMP) controlplane
	$(PYTEST) tests/cluster -q

## The test control plane: etcd + kube-apiserver + controller-manager + scheduler,
## built from source through the Go module proxy into $(KPW_CACHE).
controlplane:
	bash tests/cluster/toolchain/build.sh

proto: $(STAMP)
	cd client && PATH=$(CURDIR)/$(VENV)/bin:$$PATH python -m grpc_tools.protoc -I. \
	  --python_out=. --grpc_python_out=. --mypy_out=. --mypy_grpc_out=. pathways/wire/pathways.proto

clean:
	rm -rf $(VENV) *.egg-info
