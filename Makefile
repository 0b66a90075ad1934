# podnet build and test entry points. `make` builds every binary statically
# into bin/; `make test` is the one test command (README and .ci/run use it).

GO       ?= go
GOFLAGS  ?=
LDFLAGS  := -s -w
export CGO_ENABLED := 0

# binary name -> main package
PKG_podnet := ./plugins/podnet
PKG_podnet-ipam := ./plugins/podnet-ipam
PKG_podnet-bridge := ./plugins/podnet-bridge
PKG_podnet-routed := ./routed/cmd/podnet-routed

BINS := podnet podnet-bridge podnet-ipam podnet-routed

.PHONY: all build test unit integration lint deps cni-tools kapi k8s clean FORCE bench bench-attach-ab bench-cni-ab image

all: build

build: $(addprefix bin/,$(BINS))

bin/%: FORCE
	@mkdir -p bin
	$(GO) build $(GOFLAGS) -trimpath -ldflags '$(LDFLAGS)' -o $@ $(PKG_$*)

# Installs what the tests need on a fresh machine: Debian packages (once) and
# the pinned reference CNI plugins + cnitool (cached under ~/.cache/podnet).
deps:
	scripts/install-deps.sh

cni-tools:
	@scripts/install-cni-tools.sh >/dev/null

# A real kube-apiserver + etcd for the routed tests, built once per version
# and cached under ~/.cache/podnet (6-16 min the first time).
kapi:
	@scripts/ensure-kapi.sh >/dev/null

# kubelet, kube-controller-manager, kube-scheduler, kube-proxy, kubectl,
# upstream's e2e.test + agnhost and CoreDNS for `make cluster` and `make
# conformance`, built once per version (about 6-10 min the first time).
k8s:
	@scripts/k8s/ensure-k8s.sh >/dev/null

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run ./test/treecheck .

# ---- tests: one target per suite (test/README.md lists them: what each
# proves, what it needs, how long it takes). Every Go package belongs to
# exactly one suite; test-suites-complete checks that, so the suites
# together are `go test ./...`.
TEST_ENV = PODNET_CNI_TOOLS=$$(scripts/install-cni-tools.sh) PODNET_KAPI_DIR=$$(scripts/ensure-kapi.sh)
# -p: packages of one suite run at once (make test runs two suites at a
# time with GOTEST_P=1, as many packages at once as `go test ./...` on 2
# cores would).
GOTEST_P ?= 2
GOTEST    = $(GO) test -count=1 -p $(GOTEST_P)

# Packages of each suite (patterns; unit: every package outside test/ but
# plugins/veth, whose rollback tests need root and netns).
SUITE_unit        = $$($(GO) list ./... | grep -v -e '/test/' -e '/plugins/veth$$' -e '/internal/podfilter$$')
SUITE_integration = ./plugins/veth/ ./internal/podfilter/ ./test/integration/... ./test/policynft/... ./test/policygen/... ./test/bench/... ./test/nettest/... ./test/fakeipam/... ./test/treecheck/
SUITE_routed      = ./test/routed/...
SUITE_e2e         = ./test/e2e/...
SUITE_policy      = ./test/policy/...
SUITE_cluster     = ./test/cluster/... ./test/kapi/...
SUITE_runtime     = ./test/runtime/...
SUITE_ipipvm      = ./test/ipipvm/...
SUITE_ship        = ./test/ship/... ./test/conformance/...
TIMEOUT_unit = 10m
TIMEOUT_integration = 20m
TIMEOUT_routed = 20m
TIMEOUT_e2e = 20m
TIMEOUT_policy = 10m
TIMEOUT_cluster = 15m
TIMEOUT_runtime = 15m
TIMEOUT_ipipvm = 20m
TIMEOUT_ship = 20m
SUITES := unit integration routed e2e policy cluster runtime ipipvm ship
# Every suite but unit gets the reference plugins and kube-apiserver dirs.
$(foreach s,$(filter-out unit,$(SUITES)),$(eval ENV_$(s) = $$(TEST_ENV)))

.PHONY: $(addprefix test-,$(SUITES)) test-conformance test-suites-complete go-suites $(addprefix go-suite-,$(SUITES)) ipipvm

# go-suite-X runs suite X's Go tests, nothing else.
define go-suite
go-suite-$(1):
	$$(ENV_$(1)) $$(GOTEST) -timeout $$(TIMEOUT_$(1)) $$(SUITE_$(1))
	$$(EXTRA_$(1))
endef
# The modules of their own with tests that no other target runs (test/cnp
# runs in test-conformance): the report generator of make bench.
EXTRA_unit = $(GO) vet -C bench/report ./... && $(GO) test -C bench/report -count=1 ./...
$(foreach s,$(SUITES),$(eval $(call go-suite,$(s))))

# Unit tests: no root, no network namespace, no built binary.
test-unit: go-suite-unit
unit: test-unit
# The plugins through libcni in throwaway netns, the bench tools' own
# tests (root, bin/, the reference CNI plugins).
test-integration: build cni-tools go-suite-integration
integration: test-integration
# podnet-routed's control plane against a real kube-apiserver (root, kapi).
test-routed: build kapi go-suite-routed
# Whole clusters and real traffic (root, kapi, the reference plugins).
test-e2e: build cni-tools kapi go-suite-e2e
# NetworkPolicy end to end: a two-node cluster with podnet-routed
# --network-policy=true, real TCP and UDP flows judged by the policies
# (root, kapi, the reference plugins).
test-policy: build cni-tools kapi go-suite-policy
# The harness libraries' own tests and `make demo` (root, kapi).
test-cluster: build cni-tools kapi go-suite-cluster
# Pod sandboxes through containerd's CRI (root; installs containerd + runc
# when missing, ~1 min), and podnet-routed's leak reconcile asking that
# containerd (kapi: podnet-routed needs an API server for its Node).
test-runtime: build cni-tools kapi
	scripts/runtime/install-deps.sh
	$(MAKE) --no-print-directory go-suite-runtime
# IPIP in a QEMU VM: this kernel has no ipip module, so it boots Debian's
# kernel with the binaries and runs podnet-routed --encap=ipip in three
# node netns against a real kube-apiserver on the host. The kernel and
# QEMU are fetched on first use (scripts/ipipvm/ensure-kernel.sh, cached
# under ~/.cache/podnet/ipipvm).
test-ipipvm: build kapi go-suite-ipipvm
ipipvm: test-ipipvm
# Shipping: installer, manifest, image, README walk-through, and the
# conformance run's own parts (e2e image, report).
test-ship: build cni-tools go-suite-ship
# The real-cluster run: a Kubernetes cluster with podnet installed by its
# DaemonSet (NetworkPolicy engine on), the check matrix and upstream's
# sig-network conformance specs in 3 Ginkgo processes (report in
# bin/conformance-REPORT.md; `make conformance` writes the committed
# test/conformance/REPORT*.md), then on the same cluster the Netpol specs of
# test/conformance/netpol-subset.txt (report in
# bin/conformance-REPORT-netpol.md; `make netpol` runs the whole suite),
# and the ClusterNetworkPolicy tests of test/conformance/cnp-subset.txt
# (report in bin/conformance-REPORT-cnp.md; `make cnp` runs the whole
# suite), after test/cnp's own checks (its skips and subset against the
# suite's source).
test-conformance: build k8s
	$(GO) test -C test/cnp -count=1 .
	FAMILY=dual PROCS=3 NETPOL=subset NETPOL_PROCS=3 CNP=subset REPORT=$(CURDIR)/bin/conformance-REPORT.md scripts/k8s/conformance.sh

# Every package with Go files is in exactly one suite.
test-suites-complete:
	@all=$$($(GO) list ./... | sort); \
	  in=$$( $(foreach s,$(SUITES),$(GO) list $(SUITE_$(s));) ); \
	  twice=$$(echo "$$in" | sort | uniq -d); \
	  missing=$$(for p in $$all; do echo "$$in" | grep -qxF "$$p" || echo "$$p"; done); \
	  if [ -n "$$twice$$missing" ]; then \
	    echo "packages in two suites: $$twice"; echo "packages in no suite: $$missing"; exit 1; fi

# The whole suite, the one test command (README, .ci/run): lint, every Go
# package (the suites above, two at a time, one package each: what `go
# test ./...` ran), then the real-cluster run.
test: build cni-tools kapi k8s lint test-suites-complete
	$(MAKE) --no-print-directory -j2 --output-sync=target GOTEST_P=1 go-suites
	$(MAKE) --no-print-directory test-conformance

go-suites: $(addprefix go-suite-,$(SUITES))

clean:
	rm -rf bin

# podnet against the reference plugins (issue 8), all in one invocation,
# interleaved: the plugin stacks through libcni (200 pods sequential and 8
# concurrent, 1,000 pods on one node, floors, leak checks; podnet's stack
# also with podnet-routed's leak reconcile passing during it, and one
# reconcile pass over 250 reservations: issue 22), podnet-ipam vs
# host-local (scripts/bench-ipam.sh), podnet-routed at 100/1,000/5,000 Nodes
# of a real kube-apiserver, iperf3 pod<->pod vs node<->node. Writes
# bench/REPORT.md, bench/plots/*.png and the raw bench/results/; asserts
# nothing (not part of `make test`). About 10 minutes on 2 cores;
# BENCH_QUICK=1 is a one-minute smoke run of the same pipeline;
# STAGES=policy (or any comma-separated list of bench.sh's stages) runs
# only those, NetworkPolicy's stage (issues 24, 33, 34) in about 25 minutes.
bench: build cni-tools kapi
	BENCH_STAGES="$${BENCH_STAGES:-$(STAGES)}" scripts/bench.sh

# The policy stage's attach step of commit REV beside the working tree,
# taking turns on this machine (scripts/bench-attach-ab.sh): writes
# bench/results/attach-ab.md, which the report shows. ROUNDS=2 runs of each.
bench-attach-ab: cni-tools kapi
	@[ -n "$(REV)" ] || { echo "usage: make bench-attach-ab REV=<commit> [ROUNDS=2]" >&2; exit 2; }
	scripts/bench-attach-ab.sh $(REV) $(or $(ROUNDS),2)
	go run -C bench/report . -in ../results -out ../REPORT.md -plots ../plots

# The cni stage's plugin comparison with the binaries of commit REV beside
# the working tree's, taking turns on this machine (scripts/bench-cni-ab.sh):
# writes bench/results/cni-ab.md, which the report shows. ROUNDS=3 runs of
# each.
bench-cni-ab: cni-tools
	@[ -n "$(REV)" ] || { echo "usage: make bench-cni-ab REV=<commit> [ROUNDS=3]" >&2; exit 2; }
	scripts/bench-cni-ab.sh $(REV) $(or $(ROUNDS),3)
	go run -C bench/report . -in ../results -out ../REPORT.md -plots ../plots

# ---- shipping: installer, image (conf/k8s/podnet.yaml, scripts/install.sh,
# README "Operating podnet on a cluster").

# podnet-install: the DaemonSet's init containers and scripts/install.sh.
PKG_podnet-install := ./routed/cmd/podnet-install
build: bin/podnet-install

# The image conf/k8s/podnet.yaml runs (keep IMAGE_VERSION equal to its tag).
IMAGE_REPO    ?= docker.io/podnet/podnet
IMAGE_VERSION ?= 0.1.0
IMAGE_TAR     ?= bin/podnet-image.tar

# OCI image tarball without a container engine (scripts/mkimage, its own Go
# module using go-containerregistry): the static binaries under /bin plus
# Debian's CA bundle, entrypoint /bin/podnet-routed, reproducible (same
# binaries -> same digest). Prints "<tar> <ref> <manifest digest>".
image: build
	@$(GO) build -C scripts/mkimage -trimpath -o $(CURDIR)/bin/.mkimage .
	@bin/.mkimage -o $(IMAGE_TAR) -bin-dir bin -ref $(IMAGE_REPO):$(IMAGE_VERSION) -arch $$($(GO) env GOARCH)

# ---- cluster in a box (issue 6): test/cluster, scripts/demo.sh.
# `make demo` builds everything, brings up a podnet cluster in network
# namespaces (real kube-apiserver + etcd, 3 nodes running podnet-routed,
# pods attached through libcni with conf/10-podnet.conflist, an outside
# host), prints nodes, pods, routes and a ✓/✗ connectivity matrix, then
# removes it all and checks that `ip netns`, `ip link` and the nft ruleset
# are as before. MODE=none|vxlan (default: vxlan here, this kernel has no
# IPIP); MODE=ipip runs test/ipipvm in QEMU; KEEP=1 leaves the cluster up
# until `make demo-down`. FAMILY=ipv4|dual|ipv6 (default ipv4): dual gives
# every node and pod both families and checks each; ipv6 is IPv6 only,
# underlay and API server included.
.PHONY: demo demo-down
demo: build
	@MODE="$(MODE)" FAMILY="$(FAMILY)" KEEP="$(KEEP)" GO="$(GO)" scripts/demo.sh

demo-down:
	@GO="$(GO)" scripts/demo.sh down

# ---- a real Kubernetes cluster (issue 12): scripts/k8s/.
# `make cluster` brings up kube-apiserver + etcd + controller-manager
# (--allocate-node-cidrs) + scheduler and NODES nodes (containerd, kubelet,
# kube-proxy nftables) in network namespaces, installs podnet with
# `kubectl apply -f conf/k8s/podnet.yaml` (image from `make image`),
# CoreDNS, then prints nodes, pods and a check matrix. It stays up until
# `make cluster-down`, which also checks the machine is as before.
# MODE=vxlan|none, NODES=2|3. Kubernetes v1.34.10 is built once and cached
# under ~/.cache/podnet (about 10 min the first time).
# `make conformance` runs upstream's sig-network [Conformance] specs against
# such a cluster and writes test/conformance/REPORT.md.
.PHONY: cluster cluster-down cluster-check conformance netpol
cluster: build
	@MODE="$(MODE)" NODES="$(NODES)" FAMILY="$(FAMILY)" scripts/k8s/cluster.sh up
	@scripts/k8s/cluster.sh check

cluster-check:
	@scripts/k8s/cluster.sh check

cluster-down:
	@scripts/k8s/cluster.sh down

conformance: build
	@MODE="$(MODE)" NODES="$(NODES)" FAMILY="$(FAMILY)" scripts/k8s/conformance.sh

# `make netpol` runs upstream's NetworkPolicy suite (every `[sig-network]
# Netpol` spec labelled Feature:NetworkPolicy; SCTP skipped, see
# test/conformance/netpol-skips.txt) on such a cluster and writes
# test/conformance/REPORT-netpol.md. PROCS=N: N Ginkgo processes.
netpol: build
	@SUITE=netpol MODE="$(MODE)" NODES="$(NODES)" FAMILY="$(FAMILY)" PROCS="$(PROCS)" scripts/k8s/conformance.sh

# `make cnp` runs upstream's ClusterNetworkPolicy conformance suite
# (sigs.k8s.io/network-policy-api/conformance v0.3.0, profile
# ClusterNetworkPolicy, every experimental feature; test/cnp, its own Go
# module) on such a cluster and writes test/conformance/REPORT-cnp.md. The
# SCTP probes are skipped with their reason
# (test/conformance/cnp-skips.txt). FOCUS=regexp: the tests (ShortNames)
# matching it.
.PHONY: cnp
cnp: build
	@SUITE=cnp MODE="$(MODE)" NODES="$(NODES)" FAMILY="$(FAMILY)" scripts/k8s/conformance.sh
