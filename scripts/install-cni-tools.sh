#!/usr/bin/env bash
# Installs the reference CNI plugins and cnitool used by the tests and the
# README's examples, at pinned versions, into a cache directory reused across
# runs. Prints nothing when they are already there.
set -euo pipefail

PLUGINS_VERSION=v1.9.1
CNITOOL_VERSION=v1.3.1
dir=${PODNET_CNI_TOOLS:-$HOME/.cache/podnet/cni-tools-$PLUGINS_VERSION-$CNITOOL_VERSION}

want=(host-local ptp bridge loopback portmap cnitool)
missing=0
for b in "${want[@]}"; do [ -x "$dir/$b" ] || missing=1; done
if [ "$missing" = 1 ]; then
	mkdir -p "$dir"
	echo "installing reference CNI plugins $PLUGINS_VERSION and cnitool $CNITOOL_VERSION into $dir" >&2
	export GOBIN="$dir" CGO_ENABLED=0 GOFLAGS=-mod=mod
	go install \
		"github.com/containernetworking/plugins/plugins/main/ptp@$PLUGINS_VERSION" \
		"github.com/containernetworking/plugins/plugins/main/bridge@$PLUGINS_VERSION" \
		"github.com/containernetworking/plugins/plugins/main/loopback@$PLUGINS_VERSION" \
		"github.com/containernetworking/plugins/plugins/meta/portmap@$PLUGINS_VERSION" \
		"github.com/containernetworking/plugins/plugins/ipam/host-local@$PLUGINS_VERSION"
	go install "github.com/containernetworking/cni/cnitool@$CNITOOL_VERSION"
fi
echo "$dir"
