#!/usr/bin/env bash
# Builds the container images the cluster runs, as OCI tarballs under
# $CLUSTER_DIR/images (no registry is reachable here; each node's
# containerd imports them):
#   pause.tar     the sandbox image (localhost/podnet/pause:test) and the
#                 e2e framework's pause ($E2E_REGISTRY/pause:3.10.1)
#   busybox.tar   localhost/podnet/busybox:1, the small image `check` uses
#   agnhost.tar   upstream's agnhost binary (ensure-k8s.sh) with what
#                 upstream's image (alpine) has and the e2e specs exec:
#                 busybox applets, curl, OpenBSD nc, dig, getent, GNU
#                 wget (-T), ip, bash, and /coredns (the DNS specs with a
#                 custom server run it). It is also named
#                 jessie-dnsutils:1.7 and busybox:1.37.0-1 under
#                 $E2E_REGISTRY (the DNS specs run dig in both), and
#                 registry.k8s.io/e2e-test-images/agnhost:2.45, the exact
#                 name the ClusterNetworkPolicy suite's pods ask for (make cnp;
#                 it has no image repository config)
#   e2e-iptables.tar   $BUILD_REGISTRY/distroless-iptables:v0.8.14, the
#                 stand-in of registry.k8s.io/build-image's: the tools
#                 upstream's has (iptables, ip6tables and their -save/
#                 -restore in nft mode, ipset, nft, sh, cat, grep, sleep,
#                 ...) plus conntrack, ip and which. KubeProxy's CLOSE_WAIT
#                 spec runs it on the host network.
#   e2e-nginx.tar      $E2E_REGISTRY/nginx:1.14-4 (an HTTP server on :80;
#                 the EndpointSlice specs only need its pods)
#   e2e-regression.tar $E2E_REGISTRY/regression-issue-74839:1.2, upstream's
#                 binary (ensure-k8s.sh) on a root with its /etc files
#   coredns.tar   localhost/podnet/coredns:v1.12.1
#   podnet.tar    `make image`: what conf/k8s/podnet.yaml runs
# The tools are copied with their shared libraries from this machine's
# Debian packages (scripts/install-deps.sh installs them).
#
#   images.sh                       every image, into $IMG
#   images.sh tools-rootfs DIR      the agnhost image's tools only
#   images.sh agnhost-rootfs DIR    the agnhost image's root
#   images.sh iptables-rootfs DIR   the distroless-iptables stand-in's root
# (the last three for the images' tests, test/conformance)
set -euo pipefail
source "$(dirname "$0")/lib.sh"
pack=$REPO/scripts/oci-pack.sh
# the registry of registry.k8s.io/build-image's images, mapped like
# $E2E_REGISTRY (conformance.sh's repo list: buildImageRegistry)
BUILD_REGISTRY=$E2E_REGISTRY/build-image

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
# PORT"` (busybox nc has no -v), curl, dig, getent, wget -T. Debian's busybox sh
# runs its own applets before anything on PATH (FEATURE_SH_STANDALONE), so
# /bin/sh is Debian's dash: with busybox sh, `nc` in the specs is busybox's
# and every Service reachability check fails ("nc: invalid option -- 'v'").
e2e_tools_root() {
	local r=$1 lib
	busybox_root "$r"
	rm -f "$r/bin/nc" "$r/bin/sh"
	copy_with_libs "$r" /bin/dash
	ln -s dash "$r/bin/sh"
	copy_with_libs "$r" /usr/bin/curl /usr/bin/dig /usr/bin/getent /usr/sbin/ip /bin/bash
	# wget: the specs run `wget -q -O - -T 1 URL` (verifyServeHostnameServiceUp)
	# and `wget -T 5 -qO- URL`. Debian's busybox is built without
	# FEATURE_WGET_TIMEOUT, and its wget then stores -T's number through a
	# NULL pointer: any `wget -T N` dies of SIGSEGV before it connects
	# (alpine's busybox, upstream's, has -T). GNU wget has -T with the same
	# meaning; wgetrc makes it try once, as busybox does (GNU wget retries
	# a timed-out read 20 times).
	rm -f "$r/bin/wget"
	copy_with_libs "$r" /usr/bin/wget
	# busybox's applets that run a command (timeout, env, xargs) prefer
	# its own applets to PATH, as its sh does: `timeout 3 wget ...` would
	# run busybox's wget. Debian's run what PATH has.
	rm -f "$r/bin/timeout" "$r/bin/env" "$r/bin/xargs"
	copy_with_libs "$r" /usr/bin/timeout /usr/bin/env /usr/bin/xargs
	printf '# as busybox wget (upstream image): one try, no HSTS store\ntries = 1\nhsts = off\n' >"$r/etc/wgetrc"
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

# agnhost_root ROOT: the agnhost image's root: the tools, upstream's agnhost
# binary, and what upstream's Dockerfile adds: /coredns (the DNS specs with
# a custom server config run `/coredns -conf ...` in it), the porter
# certificates, /uploads.
agnhost_root() {
	local r=$1 src
	e2e_tools_root "$r"
	mkdir -p "$r/uploads" "$r/results"
	cp "$K8S/agnhost" "$r/agnhost"
	ln -s agnhost "$r/agnhost-2"
	cp "$K8S/coredns" "$r/coredns"
	src=$(cd / && go mod download -json k8s.io/kubernetes@v1.34.10 | sed -n 's/.*"Dir": "\(.*\)",/\1/p')
	cp "$src/test/images/agnhost/porter/localhost.crt" "$src/test/images/agnhost/porter/localhost.key" "$r/"
	chmod 0644 "$r/localhost.crt" "$r/localhost.key"
}

# iptables_root ROOT: the stand-in of registry.k8s.io/build-image/
# distroless-iptables: what upstream's image stages (iptables in nft mode
# with its extensions, ipset, nft, dash as /bin/sh, cat, chmod, grep, ln,
# rm, sleep, wc) plus conntrack, ip and which (KubeProxy's CLOSE_WAIT spec
# reads /proc/net/nf_conntrack, else runs `which conntrack` and conntrack).
# No busybox: a shell command that needs another tool fails, as upstream.
iptables_root() {
	local r=$1 f
	mkdir -p "$r/tmp" "$r/run" "$r/etc" "$r/var/run"
	chmod 1777 "$r/tmp"
	copy_with_libs "$r" /bin/dash /bin/cat /bin/chmod /bin/grep /bin/ln /bin/rm /bin/sleep /usr/bin/wc \
		/usr/sbin/xtables-nft-multi /usr/sbin/ipset /usr/sbin/nft /usr/sbin/conntrack /usr/sbin/ip
	ln -s dash "$r/bin/sh"
	cp -L "$(readlink -f /usr/bin/which)" "$r/usr/bin/which"
	for f in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore \
		iptables-nft iptables-nft-save iptables-nft-restore ip6tables-nft ip6tables-nft-save ip6tables-nft-restore; do
		ln -s xtables-nft-multi "$r/usr/sbin/$f"
	done
	# the match and target extensions iptables loads at run time
	for f in /usr/lib/x86_64-linux-gnu/xtables/*.so; do copy_with_libs "$r" "$f"; done
	mkdir -p "$r/lib64"
	cp -L /lib64/ld-linux-x86-64.so.2 "$r/lib64/"
	printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
	printf 'root:x:0:\n' >"$r/etc/group"
	cp /etc/protocols /etc/services "$r/etc/" 2>/dev/null || true
}

case ${1:-} in
tools-rootfs)
	e2e_tools_root "${2:?usage: $0 tools-rootfs DIR}"
	exit 0
	;;
agnhost-rootfs)
	K8S=$("$REPO/scripts/k8s/ensure-k8s.sh")
	agnhost_root "${2:?usage: $0 agnhost-rootfs DIR}"
	exit 0
	;;
iptables-rootfs)
	iptables_root "${2:?usage: $0 iptables-rootfs DIR}"
	exit 0
	;;
esac
bins
mkdir -p "$IMG"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$REPO/scripts/runtime/pause-image.sh" "$IMG/pause.tar" localhost/podnet/pause:test "$E2E_REGISTRY/pause:3.10.1"

r=$work/busybox
busybox_root "$r"
mkdir -p "$r/www"
"$pack" "$r" "$IMG/busybox.tar" '{"Cmd":["/bin/sh"],"Env":["PATH=/bin"]}' localhost/podnet/busybox:1

PATHS='"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"'
r=$work/agnhost
agnhost_root "$r"
"$pack" "$r" "$IMG/agnhost.tar" \
	'{"Entrypoint":["/agnhost"],"Cmd":["pause"],"Env":['"$PATHS"']}' \
	"$E2E_REGISTRY/agnhost:2.56" "$E2E_REGISTRY/jessie-dnsutils:1.7" \
	"registry.k8s.io/e2e-test-images/agnhost:2.45"
# The e2e busybox image runs `sh -c ...` with its default PATH; agnhost's
# rootfs with busybox's usual entrypoint.
"$pack" "$r" "$IMG/e2e-busybox.tar" '{"Cmd":["sh"],"Env":['"$PATHS"']}' "$E2E_REGISTRY/busybox:1.37.0-1"

r=$work/iptables
iptables_root "$r"
"$pack" "$r" "$IMG/e2e-iptables.tar" '{"Env":['"$PATHS"']}' "$BUILD_REGISTRY/distroless-iptables:v0.8.14"

# nginx:1.14-4 (upstream: nginx on alpine, port 80): the specs only need
# a server on :80; busybox httpd with nginx's welcome page.
r=$work/nginx
busybox_root "$r"
mkdir -p "$r/usr/share/nginx/html"
printf '<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head><body><h1>Welcome to nginx!</h1></body></html>\n' >"$r/usr/share/nginx/html/index.html"
"$pack" "$r" "$IMG/e2e-nginx.tar" \
	'{"Entrypoint":["/bin/httpd","-f","-p","80","-h","/usr/share/nginx/html"],"Env":["PATH=/bin"],"ExposedPorts":{"80/tcp":{}}}' \
	"$E2E_REGISTRY/nginx:1.14-4"

# regression-issue-74839:1.2: upstream's binary (debian-base upstream)
r=$work/regression
mkdir -p "$r/etc" "$r/tmp"
cp "$K8S/regression-issue-74839" "$r/regression-issue-74839"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$r/etc/passwd"
"$pack" "$r" "$IMG/e2e-regression.tar" '{"Entrypoint":["/regression-issue-74839"]}' \
	"$E2E_REGISTRY/regression-issue-74839:1.2"

r=$work/coredns
mkdir -p "$r/etc/coredns" "$r/tmp"
cp "$K8S/coredns" "$r/coredns"
"$pack" "$r" "$IMG/coredns.tar" '{"Entrypoint":["/coredns"]}' localhost/podnet/coredns:v1.12.1

make -s -C "$REPO" image IMAGE_TAR="$IMG/podnet.tar" >/dev/null
ls -la "$IMG" >&2
