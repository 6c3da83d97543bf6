# Kube-Pathways — every install step lives here; caches live outside the repo.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export KPW_CACHE ?= $(HOME)/.cache/kube-pathways
PYTEST := $(PY) -m pytest -p no:cacheprovider

.PHONY: all venv demo test lint typecheck unit integration cluster controlplane helm proto sync-crds \
        bench bench-quick soak fault-loop dev-cluster dev-cluster-down kind-up kind-load helm-install \
        kind-demo clean

HELM_VERSION := v3.22.0
HELM         := $(KPW_CACHE)/helm-$(HELM_VERSION)/bin/helm
KIND_CLUSTER ?= kube-pathways
KUBE_CONTEXT := kind-$(KIND_CLUSTER)
IMAGE        ?= kube-pathways:0.1.0

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
test: $(STAMP) controlplane helm
	$(MAKE) lint
	$(MAKE) typecheck
	$(MAKE) unit
	$(MAKE) integration
	$(MAKE) cluster

lint: $(STAMP)
	$(VENV)/bin/lint-imports

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict client/pathways client/pathways_wire client/pathways_devcluster operator/pathways_operator worker/pathways_worker examples bench tests

unit: $(STAMP)
	$(PYTEST) tests/unit -q

integration: $(STAMP)
	$(PYTEST) tests/integration -q

cluster: $(STAMP) controlplane helm
	$(PYTEST) tests/cluster -q

## make soak: 100 programs (mixed sizes, some sharing a slice) through the operator;
## nothing left behind, operator RSS growth bounded (make test runs the same test with 10)
soak: $(STAMP) controlplane helm
	PATHWAYS_SOAK_PROGRAMS=100 $(PYTEST) tests/cluster/test_soak.py -q -s

## make fault-loop: 20 host kills on the embedded runtime, recovery time median/max
## (make test runs the same test with 3)
fault-loop: $(STAMP)
	PATHWAYS_FAULT_LOOPS=20 $(PYTEST) tests/integration/test_fault_loop.py -q -s

## The test control plane: etcd + kube-apiserver + controller-manager + scheduler,
## built from source through the Go module proxy into $(KPW_CACHE).
controlplane:
	bash tests/cluster/toolchain/build.sh

## helm, built through the Go module proxy into $(KPW_CACHE)
helm:
	bash tests/cluster/toolchain/build_helm.sh

## make dev-cluster: the control plane, a node agent (not a kubelet) of two islands and the
## operator installed with helm, in the background; prints `export KUBECONFIG=...`.
## State and logs in $(KPW_CACHE)/dev-cluster; make dev-cluster-down stops it and removes them.
dev-cluster: $(STAMP) controlplane helm
	@$(PY) -m pathways_devcluster up

dev-cluster-down: $(STAMP)
	@$(PY) -m pathways_devcluster down

## keep the chart's CRDs identical to crds/
sync-crds:
	rm -f helm/kube-pathways/crds/*.yaml
	cp crds/*.yaml helm/kube-pathways/crds/

## kind workflow (needs Docker and kind; not available on CI machines)
kind-up:
	kind create cluster --name $(KIND_CLUSTER) --config helm/kind-config.yaml
	bash helm/label-nodes.sh --context $(KUBE_CONTEXT)

kind-load:
	docker build -t $(IMAGE) .
	kind load docker-image $(IMAGE) --name $(KIND_CLUSTER)

helm-install: helm
	$(HELM) upgrade --install kube-pathways helm/kube-pathways --kube-context $(KUBE_CONTEXT) \
	  --namespace pathways-system --create-namespace \
	  --set image.repository=$(word 1,$(subst :, ,$(IMAGE))) --set image.tag=$(word 2,$(subst :, ,$(IMAGE))) \
	  --wait --timeout 5m

kind-demo: $(STAMP)
	kubectl --context $(KUBE_CONTEXT) apply -f examples/manifests/paper-example.yaml \
	  -f examples/manifests/train-regression.yaml
	$(VENV)/bin/pathways --context $(KUBE_CONTEXT) status -w --until-done --timeout 10m

## benchmarks: ratios against baselines measured in the same run (not part of make test)
bench: $(STAMP)
	$(PY) -m pip install -q -e '.[dev,bench]' && $(PY) -m bench.run

bench-quick: $(STAMP)
	$(PY) -m pip install -q -e '.[dev,bench]' && $(PY) -m bench.run --quick

proto: $(STAMP)
	cd client && PATH=$(CURDIR)/$(VENV)/bin:$$PATH python -m grpc_tools.protoc -I. \
	  --python_out=. --grpc_python_out=. --mypy_out=. --mypy_grpc_out=. pathways_wire/pathways.proto

clean:
	rm -rf $(VENV) *.egg-info
