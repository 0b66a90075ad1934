#!/usr/bin/env bash
# Packs a directory as a one-layer OCI image-layout tarball that
# `ctr -n k8s.io images import` accepts (no registry is reachable from the
# test machines). Byte-for-byte reproducible for the same directory.
#
#   scripts/oci-pack.sh ROOTFS_DIR OUT.tar CONFIG_JSON REF [REF...]
#
# CONFIG_JSON is the image config's "config" object, e.g.
# '{"Entrypoint":["/pause"]}'. Every REF names the same image: ctr imports
# one image per name.
set -euo pipefail
rootfs=${1:?usage: $0 ROOTFS_DIR OUT.tar CONFIG_JSON REF [REF...]}
out=${2:?usage}
cfg=${3:?usage}
shift 3
[ $# -gt 0 ] || { echo "$0: at least one image reference" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/oci/blobs/sha256"
tar --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -C "$rootfs" -cf "$work/layer.tar" .
diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
gzip -n -6 -c "$work/layer.tar" >"$work/layer.tar.gz"

# add_blob FILE: stores FILE as a blob, prints "<sha256> <size>".
add_blob() {
	local digest
	digest=$(sha256sum "$1" | cut -d' ' -f1)
	cp "$1" "$work/oci/blobs/sha256/$digest"
	echo "$digest $(stat -c %s "$1")"
}
read -r layer_digest layer_size < <(add_blob "$work/layer.tar.gz")
printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
	"$cfg" "$diff_id" >"$work/config.json"
read -r config_digest config_size < <(add_blob "$work/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%s},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%s}]}' \
	"$config_digest" "$config_size" "$layer_digest" "$layer_size" >"$work/manifest.json"
read -r manifest_digest manifest_size < <(add_blob "$work/manifest.json")
# io.containerd.image.name is the name ctr gives each imported image.
entries=()
for ref in "$@"; do
	entries+=("$(printf '{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%s,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}' \
		"$manifest_digest" "$manifest_size" "$ref" "${ref##*:}")")
done
(IFS=,; printf '{"schemaVersion":2,"manifests":[%s]}' "${entries[*]}") >"$work/oci/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' >"$work/oci/oci-layout"
tar --numeric-owner --owner=0 --group=0 --mtime=@0 --sort=name -C "$work/oci" -cf "$out" oci-layout index.json blobs
