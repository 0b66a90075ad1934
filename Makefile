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

.PHONY: all build test unit integration lint deps cni-tools kapi k8s clean FORCE bench image

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

# The whole suite: lint, unit tests, the integration tests that exec the
# built binaries through libcni inside throwaway network namespaces (root),
# then the real-cluster run: a Kubernetes cluster with podnet installed by
# its DaemonSet, the check matrix and upstream's sig-network conformance
# specs (report in bin/conformance-REPORT.md; `make conformance` writes the
# committed test/conformance/REPORT.md).
test: build cni-tools kapi k8s lint
	PODNET_CNI_TOOLS=$$(scripts/install-cni-tools.sh) PODNET_KAPI_DIR=$$(scripts/ensure-kapi.sh) \
	  $(GO) test -count=1 -timeout 30m ./...
	REPORT=$(CURDIR)/bin/conformance-REPORT.md scripts/k8s/conformance.sh

clean:
	rm -rf bin

# podnet against the reference plugins (issue 8), all in one invocation,
# interleaved: the plugin stacks through libcni (200 pods sequential and 8
# concurrent, 1,000 pods on one node, floors, leak checks), podnet-ipam vs
# host-local (scripts/bench-ipam.sh), podnet-routed at 100/1,000/5,000 Nodes
# of a real kube-apiserver, iperf3 pod<->pod vs node<->node. Writes
# bench/REPORT.md, bench/plots/*.png and the raw bench/results/; asserts
# nothing (not part of `make test`). About 10 minutes on 2 cores;
# BENCH_QUICK=1 is a one-minute smoke run of the same pipeline.
bench: build cni-tools kapi
	scripts/bench.sh

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

# The IPIP VM test alone (test/ipipvm, also part of `make test`): this kernel
# has no ipip module, so it boots Debian's kernel in QEMU with the binaries
# and runs podnet-routed --encap=ipip in three node netns against a real
# kube-apiserver on the host. The kernel and QEMU are fetched on first use
# (scripts/ipipvm/ensure-kernel.sh, cached under ~/.cache/podnet/ipipvm).
.PHONY: ipipvm
ipipvm: build kapi
	PODNET_KAPI_DIR=$$(scripts/ensure-kapi.sh) $(GO) test -count=1 -v ./test/ipipvm/

# The container-runtime end-to-end test alone (it also runs in `make test`):
# installs Debian's containerd + runc when missing, then drives pod sandboxes
# through containerd 1.6's CRI with the shipped conflists (root, ~1 min).
.PHONY: test-runtime
test-runtime: build cni-tools
	scripts/runtime/install-deps.sh
	PODNET_CNI_TOOLS=$$(scripts/install-cni-tools.sh) $(GO) test -count=1 -v -timeout 10m ./test/runtime/

# ---- cluster in a box (issue 6): test/cluster, scripts/demo.sh.
# `make demo` builds everything, brings up a podnet cluster in network
# namespaces (real kube-apiserver + etcd, 3 nodes running podnet-routed,
# pods attached through libcni with conf/10-podnet.conflist, an outside
# host), prints nodes, pods, routes and a ✓/✗ connectivity matrix, then
# removes it all and checks that `ip netns`, `ip link` and the nft ruleset
# are as before. MODE=none|vxlan (default: vxlan here, this kernel has no
# IPIP); MODE=ipip runs test/ipipvm in QEMU; KEEP=1 leaves the cluster up
# until `make demo-down`.
.PHONY: demo demo-down
demo: build
	@MODE="$(MODE)" KEEP="$(KEEP)" GO="$(GO)" scripts/demo.sh

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
.PHONY: cluster cluster-down cluster-check conformance
cluster: build
	@MODE="$(MODE)" NODES="$(NODES)" scripts/k8s/cluster.sh up
	@scripts/k8s/cluster.sh check

cluster-check:
	@scripts/k8s/cluster.sh check

cluster-down:
	@scripts/k8s/cluster.sh down

conformance: build
	@MODE="$(MODE)" NODES="$(NODES)" scripts/k8s/conformance.sh
