#!/usr/bin/env bash
# Builds the container images the cluster runs, as OCI tarballs under
# $CLUSTER_DIR/images (no registry is reachable here; each node's
# containerd imports them):
#   pause.tar     the sandbox image (localhost/podnet/pause:test) and the
#                 e2e framework's pause ($E2E_REGISTRY/pause:3.10.1)
#   busybox.tar   localhost/podnet/busybox:1, the small image `check` uses
#   agnhost.tar   upstream's agnhost binary (ensure-k8s.sh) with the tools
#                 upstream's image has and the e2e specs exec: busybox
#                 applets, curl, OpenBSD nc, dig, getent. It is also named
#                 jessie-dnsutils:1.7 and busybox:1.37.0-1 under
#                 $E2E_REGISTRY (the DNS specs run dig in both).
#   coredns.tar   localhost/podnet/coredns:v1.12.1
#   podnet.tar    `make image`: what conf/k8s/podnet.yaml runs
# The tools are copied with their shared libraries from this machine's
# Debian packages (scripts/install-deps.sh installs them).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
pack=$REPO/scripts/oci-pack.sh

# copy_with_libs ROOT FILE...: FILE and every library it links, at the same paths.
copy_with_libs() {
	local root=$1 f lib
	shift
	for f in "$@"; do
		mkdir -p "$root$(dirname "$f")"
		cp -L "$f" "$root$f"
		for lib in $(ldd "$f" 2>/dev/null | grep -o '/[^ ]*'); do
			mkdir -p "$root$(dirname "$lib")"
			cp -L "$lib" "$root$lib"
		done
	done
}

# busybox_root ROOT: busybox and a link per applet under ROOT/bin.
busybox_root() {
	local r=$1 a
	mkdir -p "$r/bin" "$r/tmp" "$r/etc"
	chmod 1777 "$r/tmp"
	cp /bin/busybox "$r/bin/busybox"
	for a in $(/bin/busybox --list); do [ -e "$r/bin/$a" ] || ln -s busybox "$r/bin/$a"; done
	printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
	printf 'root:x:0:\n' >"$r/etc/group"
	echo 'hosts: files dns' >"$r/etc/nsswitch.conf"
}

# e2e_tools_root ROOT: the tools upstream's agnhost image has and the e2e
# specs exec, under ROOT. Upstream's image is alpine + bind-tools + curl +
# netcat-openbsd: the specs run `sh -c "echo hostName | nc -v -t -w 2 HOST
# PORT"` (busybox nc has no -v), curl, dig, getent. Debian's busybox sh
# runs its own applets before anything on PATH (FEATURE_SH_STANDALONE), so
# /bin/sh is Debian's dash: with busybox sh, `nc` in the specs is busybox's
# and every Service reachability check fails ("nc: invalid option -- 'v'").
e2e_tools_root() {
	local r=$1 lib
	busybox_root "$r"
	rm -f "$r/bin/nc" "$r/bin/sh"
	copy_with_libs "$r" /bin/dash
	ln -s dash "$r/bin/sh"
	copy_with_libs "$r" /usr/bin/curl /usr/bin/dig /usr/bin/getent
	cp -L /bin/nc.openbsd "$r/usr/bin/nc"
	copy_with_libs "$r" /bin/nc.openbsd
	rm -f "$r/bin/nc.openbsd"
	for lib in /lib/x86_64-linux-gnu/libnss_dns.so.2 /lib/x86_64-linux-gnu/libnss_files.so.2 /lib/x86_64-linux-gnu/libresolv.so.2; do
		[ -e "$lib" ] && copy_with_libs "$r" "$lib"
	done
	mkdir -p "$r/lib64"
	cp -L /lib64/ld-linux-x86-64.so.2 "$r/lib64/"
	mkdir -p "$r/etc/ssl/certs"
	cp /etc/ssl/certs/ca-certificates.crt "$r/etc/ssl/certs/" 2>/dev/null || true
	printf 'root:x:0:0:root:/root:/bin/sh\nuser-defined-in-image:x:1000:1000::/home/user:/bin/sh\n' >"$r/etc/passwd"
	printf 'root:x:0:\nuser-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n' >"$r/etc/group"
}

# `images.sh tools-rootfs DIR` builds only that (the image's tests use it).
if [ "${1:-}" = tools-rootfs ]; then
	e2e_tools_root "${2:?usage: $0 tools-rootfs DIR}"
	exit 0
fi
bins
mkdir -p "$IMG"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$REPO/scripts/runtime/pause-image.sh" "$IMG/pause.tar" localhost/podnet/pause:test "$E2E_REGISTRY/pause:3.10.1"

r=$work/busybox
busybox_root "$r"
mkdir -p "$r/www"
"$pack" "$r" "$IMG/busybox.tar" '{"Cmd":["/bin/sh"],"Env":["PATH=/bin"]}' localhost/podnet/busybox:1

r=$work/agnhost
e2e_tools_root "$r"
mkdir -p "$r/uploads" "$r/results"
cp "$K8S/agnhost" "$r/agnhost"
ln -s agnhost "$r/agnhost-2"
K8S_SRC=$(cd "$work" && go mod download -json k8s.io/kubernetes@v1.34.10 | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
cp "$K8S_SRC/test/images/agnhost/porter/localhost.crt" "$K8S_SRC/test/images/agnhost/porter/localhost.key" "$r/"
chmod 0644 "$r/localhost.crt" "$r/localhost.key"
"$pack" "$r" "$IMG/agnhost.tar" \
	'{"Entrypoint":["/agnhost"],"Cmd":["pause"],"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}' \
	"$E2E_REGISTRY/agnhost:2.56" "$E2E_REGISTRY/jessie-dnsutils:1.7"
# The e2e busybox image runs `sh -c ...` with its default PATH; agnhost's
# rootfs with busybox's usual entrypoint.
"$pack" "$r" "$IMG/e2e-busybox.tar" \
	'{"Cmd":["sh"],"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]}' \
	"$E2E_REGISTRY/busybox:1.37.0-1"

r=$work/coredns
mkdir -p "$r/etc/coredns" "$r/tmp"
cp "$K8S/coredns" "$r/coredns"
"$pack" "$r" "$IMG/coredns.tar" '{"Entrypoint":["/coredns"]}' localhost/podnet/coredns:v1.12.1

make -s -C "$REPO" image IMAGE_TAR="$IMG/podnet.tar" >/dev/null
ls -la "$IMG" >&2
