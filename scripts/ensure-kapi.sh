#!/usr/bin/env bash
# Builds a real kube-apiserver and etcd from the Go module proxy, once per
# version, into ~/.cache/podnet/kapi-<k8s>-etcd-<etcd>/, and prints that
# directory. Each is built in a throwaway module outside the project's
# go.mod. Cold: 6-16 min on 2 cores; cached: instant.
set -euo pipefail

K8S_VERSION=v1.34.10   # neighbours are refused by the module proxy here
ETCD_VERSION=v3.6.8
out=${PODNET_KAPI_DIR:-$HOME/.cache/podnet/kapi-$K8S_VERSION-etcd-$ETCD_VERSION}

if [ -x "$out/kube-apiserver" ] && [ -x "$out/etcd" ]; then
	echo "$out"
	exit 0
fi
source "$(dirname "$0")/k8s-module.sh"
k8s_build_start "$out"

if [ ! -x "$out/kube-apiserver" ]; then
	echo "building kube-apiserver $K8S_VERSION (first time only: 6-16 min)..." >&2
	mkdir -p "$work/kas"
	k8s_gomod podnet.local/kube-apiserver "$K8S_VERSION" >"$work/kas/go.mod"
	printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' >"$work/kas/tools.go"
	(
		cd "$work/kas"
		go mod tidy >&2
		go build -trimpath -o "$out/kube-apiserver.tmp" -ldflags "$(k8s_ldflags "$K8S_VERSION")" \
			k8s.io/kubernetes/cmd/kube-apiserver
	)
	mv "$out/kube-apiserver.tmp" "$out/kube-apiserver"
fi

if [ ! -x "$out/etcd" ]; then
	echo "building etcd $ETCD_VERSION..." >&2
	mkdir -p "$work/etcd"
	printf 'module podnet.local/etcd\n\ngo 1.24.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" >"$work/etcd/go.mod"
	printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' >"$work/etcd/tools.go"
	(cd "$work/etcd" && go mod tidy >&2 && go build -trimpath -ldflags "-s -w" -o "$out/etcd.tmp" go.etcd.io/etcd/server/v3)
	mv "$out/etcd.tmp" "$out/etcd"
fi
echo "$out"
