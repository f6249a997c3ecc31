# salesagg: the targets mirror CI (.ci/run).
.DEFAULT_GOAL := help
GO        ?= go
BIN       ?= bin/salesagg
export KAFKA_DIR ?= $(CURDIR)/.kafka

.PHONY: help build test test-browser test-e2e test-torture test-torture-short test-docker test-k8s test-k8s-rehearsal test-k8s-cluster k8s-binaries run bench bench-compare bench-growth bench-growth-salesagg bench-failover bench-latency lint kafka-up kafka-down clean

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-19s %s\n", $$1, $$2}'

build: ## build bin/salesagg (static; cgo when a C compiler is there: scripts/build.sh)
	./scripts/build.sh $(BIN)

test: ## unit and component tests (in-process dev broker, real Pebble), with -race
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 30m ./...
	$(GO) test -count=1 -run StoreCachesInHeap ./internal/config
	CGO_ENABLED=0 $(GO) test -count=1 -run StoreCachesInHeap ./internal/config
	$(MAKE) test-k8s

test-browser: ## the status page in headless Chromium (Debian's chromium at /usr/bin/chromium, or CHROMIUM=path)
	$(GO) test -tags browser -count=1 -timeout 5m -run Browser -v ./internal/httpapi/

test-e2e: ## end-to-end tests on a real Apache Kafka broker (Java 17 + Maven; or KAFKA_BOOTSTRAP_SERVERS)
	$(GO) test -tags e2e -count=1 -timeout 40m ./test/e2e/

# The fault torture: three Kafka brokers, four instances, faults drawn from
# SEED (printed; SEED=N replays the schedule) for DURATION, one guarantee per
# run alternating with the seed (GUARANTEE=exactly_once_v2,at_least_once for
# both). The table and a JSON report end the output.
DURATION ?= 30m
test-torture: ## the 30-minute fault torture on a three-broker Apache Kafka cluster (SEED=N, DURATION=30m, GUARANTEE=...)
	SEED=$(SEED) TORTURE_DURATION=$(DURATION) TORTURE_GUARANTEES=$(GUARANTEE) E2E_LOG_DIR=$${E2E_LOG_DIR:-/tmp/salesagg-torture} \
	  $(GO) test -tags torture -count=1 -timeout 3h -run TestTorture -v ./test/torture/

test-torture-short: ## the torture's short version run in CI: 2.5 minutes of faults per guarantee, both, and exactly-once in a streams group
	SEED=$(SEED) TORTURE_DURATION=150s TORTURE_GUARANTEES=exactly_once_v2,at_least_once,exactly_once_v2/streams \
	  $(GO) test -tags torture -count=1 -timeout 40m -run TestTorture -v ./test/torture/

test-docker: ## the image and the compose walkthrough on a dockerd of its own (root; installs docker.io, see test/docker)
	$(GO) test -tags docker -count=1 -timeout 40m -v ./test/docker/

test-k8s: ## Kubernetes manifests (deploy/k8s): render both overlays, decode strictly, check the wiring (module test/k8s)
	cd test/k8s && $(GO) vet ./... && $(GO) test -count=1 ./...

test-k8s-rehearsal: ## the prod StatefulSet as 3 local processes on Apache Kafka, rolled while events flow (Java 17 + Maven)
	cd test/k8s && $(GO) test -tags e2e -count=1 -timeout 25m -run TestStatefulSetRehearsal -v ./...

test-k8s-cluster: k8s-binaries ## the manifests on a real two-node cluster built from source: etcd, API server, controllers, kubelets on containerd (root; module test/cluster)
	cd test/cluster && $(GO) vet ./... && $(GO) vet -tags cluster ./...
	cd test/cluster && $(GO) test -tags cluster -count=1 -timeout 45m -v -run TestCluster ./...

k8s-binaries: ## build (or find cached) the cluster test's Kubernetes binaries and etcd (~/.cache/salesagg/k8s)
	cd test/cluster && $(GO) run ./cmd/binaries

run: ## run the service on the embedded dev broker, state under ./data (ARGS=... to salesagg run; BROKER=host:port: a broker already running)
	./scripts/dev.sh $(ARGS)

bench: ## micro-benchmarks (go test -bench)
	$(GO) test -run '^$$' -bench . -benchmem ./internal/...

bench-compare: ## side-by-side benchmark against Kafka Streams on a real broker (not in CI)
	$(GO) run ./bench/compare

bench-growth: ## the comparison's growth run: salesagg on 100k, 1M and 10M products, the tuned reference on 1M and 10M (not in CI)
	$(GO) run ./bench/compare --products 100000,1000000,10000000 --systems salesagg,reference --reference-products 1000000,10000000 \
		--reference-threads 2 --reference-cache 67108864 --reference-rocksdb tuned --reference-time-limit 15m

bench-growth-salesagg: ## the growth run of salesagg alone: 100k, 1M and 10M products (not in CI)
	$(GO) run ./bench/compare --products 100000,1000000,10000000 --systems salesagg

bench-failover: ## failover benchmark, salesagg vs the Kafka Streams reference: kill -9, rolling restart, scale-out on Apache Kafka (not in CI)
	$(GO) run ./bench/failover

bench-latency: ## latency from produce to total (HTTP, changelog), salesagg vs the Kafka Streams reference (not in CI)
	$(GO) run ./bench/latency

lint: ## gofmt and go vet
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/e2e/
	$(GO) vet -tags browser ./internal/httpapi/
	$(GO) vet -tags docker ./test/docker/
	$(GO) vet -tags torture ./test/torture/
	cd test/k8s && $(GO) vet ./... && $(GO) vet -tags e2e ./...
	cd test/cluster && $(GO) vet ./... && $(GO) vet -tags cluster ./...

kafka-up: ## start a real Apache Kafka broker from Maven Central on loopback (NODES=3: a 3-node cluster)
	$(if $(NODES),KAFKA_NODES=$(NODES) )./test/kafka/kafka.sh up

kafka-down: ## stop it (or the cluster) and delete its data
	$(if $(NODES),KAFKA_NODES=$(NODES) )./test/kafka/kafka.sh down

# The data dirs `make run` wrote: ./data, DATA when given, and every DATA
# scripts/dev.sh recorded in .dev-data-dirs. Only those inside the checkout
# are removed, and none that holds a file git tracks.
DATA_DIRS = $(sort $(abspath data $(DATA) $(shell cat .dev-data-dirs 2>/dev/null)))

clean: ## remove build output and local data: ./data, DATA=dir, and each DATA dir make run used
	rm -rf bin .dev-data-dirs
	@for d in $(filter-out $(CURDIR)/%,$(DATA_DIRS)); do echo "make clean: not removing $$d: outside the checkout"; done
	for d in $(filter $(CURDIR)/%,$(DATA_DIRS)); do \
	  if git ls-files --error-unmatch "$$d" >/dev/null 2>&1; then echo "make clean: not removing $$d: git tracks files in it"; \
	  else rm -rf "$$d"; fi; \
	done
