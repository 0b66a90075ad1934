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
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false
staging=v0.${K8S_VERSION#v1.}
minor=$(echo "$K8S_VERSION" | cut -d. -f2)

if [ ! -x "$out/kube-apiserver" ]; then
	echo "building kube-apiserver $K8S_VERSION (first time only: 6-16 min)..." >&2
	mkdir -p "$work/kas"
	gomod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)",/\1/p')
	{
		printf 'module podnet.local/kube-apiserver\n\ngo 1.24.0\n\ngodebug default=go1.24\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$K8S_VERSION"
		# every ./staging replace of kubernetes' go.mod -> the published module
		sed -n '/^replace (/,/^)/p' "$gomod" | awk -v v="$staging" '/=> \.\/staging/ {print "\t" $1 " => " $1 " " v}'
		printf ')\n'
	} >"$work/kas/go.mod"
	printf '//go:build tools\n\npackage tools\n\nimport _ "k8s.io/kubernetes/cmd/kube-apiserver"\n' >"$work/kas/tools.go"
	(
		cd "$work/kas"
		go mod tidy >&2
		go build -trimpath -o "$out/kube-apiserver.tmp" -ldflags "-s -w \
			-X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
			-X k8s.io/component-base/version.gitMajor=1 \
			-X k8s.io/component-base/version.gitMinor=$minor \
			-X k8s.io/component-base/version.gitTreeState=clean \
			-X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z" \
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
