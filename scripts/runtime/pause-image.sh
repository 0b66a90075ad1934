#!/usr/bin/env bash
# Builds the static pause binary (test/runtime/pause) and packs it into a
# one-layer OCI image-layout tarball that `ctr -n k8s.io images import`
# accepts: no registry is reachable from the test machines. The output is
# byte-for-byte reproducible for one pause binary.
# usage: scripts/runtime/pause-image.sh OUT.tar [IMAGE_REF]
set -euo pipefail

out=${1:?usage: $0 OUT.tar [IMAGE_REF]}
ref=${2:-localhost/podnet/pause:test}
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/rootfs" "$work/oci/blobs/sha256"
(cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$work/rootfs/pause" ./test/runtime/pause)
chmod 0755 "$work/rootfs/pause"
tar --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -C "$work/rootfs" -cf "$work/layer.tar" pause
diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
gzip -n -9 -c "$work/layer.tar" >"$work/layer.tar.gz"

# add_blob FILE: stores FILE as a blob, prints "<sha256> <size>".
add_blob() {
	local digest
	digest=$(sha256sum "$1" | cut -d' ' -f1)
	cp "$1" "$work/oci/blobs/sha256/$digest"
	echo "$digest $(stat -c %s "$1")"
}

read -r layer_digest layer_size < <(add_blob "$work/layer.tar.gz")
printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"],"User":"65535:65535"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
	"$diff_id" >"$work/config.json"
read -r config_digest config_size < <(add_blob "$work/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
	"$config_digest" "$config_size" "$layer_digest" "$layer_size" >"$work/manifest.json"
read -r manifest_digest manifest_size < <(add_blob "$work/manifest.json")
# io.containerd.image.name is the name ctr gives the imported image.
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
	"$manifest_digest" "$manifest_size" "$ref" "${ref##*:}" >"$work/oci/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$work/oci/oci-layout"
tar --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -C "$work/oci" -cf "$out" oci-layout index.json blobs
