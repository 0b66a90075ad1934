#!/usr/bin/env bash
# Builds the static pause binary (test/runtime/pause) and packs it into a
# one-layer OCI image-layout tarball (scripts/oci-pack.sh) that
# `ctr -n k8s.io images import` accepts: no registry is reachable from the
# test machines. The output is byte-for-byte reproducible for one pause
# binary.
# usage: scripts/runtime/pause-image.sh OUT.tar [IMAGE_REF...]
set -euo pipefail

out=${1:?usage: $0 OUT.tar [IMAGE_REF...]}
shift
[ $# -gt 0 ] || set -- localhost/podnet/pause:test
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$work/pause" ./test/runtime/pause)
chmod 0755 "$work/pause"
"$root/scripts/oci-pack.sh" "$work" "$out" '{"Entrypoint":["/pause"],"User":"65535:65535"}' "$@"
