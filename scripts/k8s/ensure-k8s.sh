#!/usr/bin/env bash
# Builds the Kubernetes node and control-plane components that `make
# cluster` and `make conformance` run, once per version, from the Go module
# proxy, and prints the cache directory:
#
#   ~/.cache/podnet/k8s-v1.34.10/  kubelet kube-controller-manager
#       kube-scheduler kube-proxy kubectl   (k8s.io/kubernetes/cmd/...)
#       e2e.test    upstream's e2e entry point + framework + the
#                   sig-network suites (see the note in e2e_test.go below)
#       agnhost     upstream's e2e test image binary
#       coredns     CoreDNS v1.12.1 (the cluster DNS image; also in agnhost)
#       regression-issue-74839   upstream's e2e image binary of the
#                   Conntrack "invalid conntrack state bug" spec
#
# Like scripts/ensure-kapi.sh (kube-apiserver + etcd), everything is built
# in a throwaway module outside podnet's go.mod: it requires
# k8s.io/kubernetes and maps every ./staging replace of its go.mod to the
# published k8s.io/* v0.X module. Cold: about 6-10 min on 2 cores after the
# kube-apiserver build (shared Go build cache); cached: instant.
set -euo pipefail

K8S_VERSION=v1.34.10      # the version ensure-kapi.sh builds; neighbours are refused by the proxy here
COREDNS_VERSION=v1.12.1
out=${PODNET_K8S_DIR:-$HOME/.cache/podnet/k8s-$K8S_VERSION}
k8s_bins=(kubelet kube-controller-manager kube-scheduler kube-proxy kubectl)

have_all() {
	local b
	for b in "${k8s_bins[@]}" e2e.test agnhost coredns regression-issue-74839; do
		[ -x "$out/$b" ] || return 1
	done
}
if have_all; then
	echo "$out"
	exit 0
fi
source "$(dirname "$0")/../k8s-module.sh"
k8s_build_start "$out"
ldflags=$(k8s_ldflags "$K8S_VERSION")

need_k8s=0
for b in "${k8s_bins[@]}" e2e.test agnhost; do [ -x "$out/$b" ] || need_k8s=1; done
if [ "$need_k8s" = 1 ]; then
	echo "building Kubernetes $K8S_VERSION components and e2e.test (first time only: minutes)..." >&2
	mod=$work/k8s
	mkdir -p "$mod"
	srcdir=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
	k8s_gomod podnet.local/k8s "$K8S_VERSION" >"$mod/go.mod"
	# tools.go: the commands, plus agnhost's imports (agnhost is a main
	# package: tidy must see what it needs).
	{
		printf '//go:build tools\n\npackage e2e\n\nimport (\n'
		for b in "${k8s_bins[@]}"; do printf '\t_ "k8s.io/kubernetes/cmd/%s"\n' "$b"; done
		sed -n '/^import (/,/^)/p' "$srcdir/test/images/agnhost/agnhost.go" |
			grep -v '^[[:space:]]*//' | grep -o '"[^"]*"' | grep '\.' | sort -u | sed 's/^/\t_ /'
		printf ')\n'
	} >"$mod/tools.go"
	# Upstream's test/e2e/e2e_test.go imports every suite, and one of them
	# (test/e2e/apimachinery) needs k8s.io/sample-apiserver, which the Go
	# module proxy refuses here. This test main is upstream's entry point
	# (e2e.RunE2ETests, the framework, test/e2e/common with "Networking
	# Granular Checks") with test/e2e/network only: every sig-network spec,
	# unchanged.
	cat >"$mod/e2e_test.go" <<'GO'
package e2e

import (
	"flag"
	"os"
	"testing"

	"k8s.io/kubernetes/test/e2e"
	"k8s.io/kubernetes/test/e2e/framework"
	"k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	_ "k8s.io/kubernetes/test/e2e/feature"
	_ "k8s.io/kubernetes/test/e2e/network"

	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"
	_ "k8s.io/kubernetes/test/e2e/framework/metrics/init"
	_ "k8s.io/kubernetes/test/e2e/framework/node/init"
	_ "k8s.io/kubernetes/test/utils/format"
)

func TestMain(m *testing.M) {
	config.CopyFlags(config.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestE2E(t *testing.T) { e2e.RunE2ETests(t) }
GO
	(
		cd "$mod"
		# -e: tidy also walks the tests of test/e2e (-> sample-apiserver);
		# the build below does not need them.
		go mod tidy -e >&2
		pkgs=()
		for b in "${k8s_bins[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
		go build -trimpath -ldflags "$ldflags" -o "$work/bin/" "${pkgs[@]}" k8s.io/kubernetes/test/images/agnhost
		go test -c -trimpath -ldflags "$ldflags" -o "$work/bin/e2e.test" .
	)
	for b in "${k8s_bins[@]}" agnhost e2e.test; do mv "$work/bin/$b" "$out/$b"; done
fi

# a small main package of k8s.io/kubernetes (k8s.io/utils only): its own
# module, so that a cache of the components above is not rebuilt for it
if [ ! -x "$out/regression-issue-74839" ]; then
	echo "building regression-issue-74839..." >&2
	mod=$work/regression
	mkdir -p "$mod"
	k8s_gomod podnet.local/regression "$K8S_VERSION" >"$mod/go.mod"
	printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/test/images/regression-issue-74839"\n' >"$mod/tools.go"
	(
		cd "$mod"
		go mod tidy -e >&2
		go build -trimpath -ldflags "-s -w" -o "$work/regression.bin" k8s.io/kubernetes/test/images/regression-issue-74839
	)
	mv "$work/regression.bin" "$out/regression-issue-74839"
fi

if [ ! -x "$out/coredns" ]; then
	echo "building CoreDNS $COREDNS_VERSION..." >&2
	mod=$work/coredns
	mkdir -p "$mod"
	printf 'module podnet.local/coredns\n\ngo 1.24.0\n' >"$mod/go.mod"
	printf '//go:build tools\n\npackage tools\n\nimport _ "github.com/coredns/coredns"\n' >"$mod/tools.go"
	(
		cd "$mod"
		go get "github.com/coredns/coredns@$COREDNS_VERSION" >&2
		go mod tidy -e >&2
		go build -trimpath -ldflags "-s -w" -o "$work/coredns.bin" github.com/coredns/coredns
	)
	mv "$work/coredns.bin" "$out/coredns"
fi
echo "$out"
