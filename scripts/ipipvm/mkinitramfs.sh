#!/usr/bin/env bash
# mkinitramfs.sh KERNEL_DIR OUT [SRC:DEST ...]
#
# Builds the IPIP test VM's initramfs OUT (gzip'd cpio "newc") for the kernel
# in KERNEL_DIR (from ensure-kernel.sh) as two concatenated archives, which
# the kernel unpacks in order:
#   base     static busybox, /init (init.sh beside this script), the kernel
#            modules named in IPIPVM_MODULES with every dependency, at their
#            in-tree paths with busybox depmod's index, /sbin/modprobe, so the
#            kernel can autoload (e.g. "rtnl-link-ipip" when tunl0 is
#            created). Cached in KERNEL_DIR/initramfs/, keyed by its inputs.
#   overlay  each SRC file copied to /DEST (mode kept): the test's binaries
#            and configuration. Rebuilt every time (a second or so).
# IPIPVM_LOAD names the modules /init loads at boot (the NIC driver: there
# is no udev); everything else loads on demand.
set -euo pipefail

[ $# -ge 2 ] || { echo "usage: $0 KERNEL_DIR OUT [SRC:DEST ...]" >&2; exit 2; }
kdir=$(realpath "$1") out=$(realpath -m "$2")
shift 2
here=$(cd "$(dirname "$0")" && pwd)
kver=$(ls "$kdir/lib/modules")
mods=$kdir/lib/modules/$kver
# crc32c_generic: libcrc32c (nf_tables, nf_conntrack) needs a crc32c
# implementation, a soft dependency modules.dep does not list. nft_objref:
# the plugins' pod filter and podnet-routed's tunnel filter count their
# drops in named counters; nft_fib_inet: the tunnel filter's fib daddr
# type local.
modules=${IPIPVM_MODULES:-"ipip veth bridge e1000 nft_chain_nat nft_masq nft_objref nft_fib_inet crc32c_generic"}
load=${IPIPVM_LOAD:-"e1000"}
busybox=$(command -v busybox || true)
[ -n "$busybox" ] || { echo "busybox missing: apt-get install busybox-static" >&2; exit 1; }
if ldd "$busybox" >/dev/null 2>&1; then
	echo "$busybox is dynamically linked: install busybox-static" >&2
	exit 1
fi
command -v cpio >/dev/null || { echo "cpio missing: apt-get install cpio" >&2; exit 1; }

# closure prints the .ko paths (relative to $mods) of the named modules and
# of everything they depend on, from modules.dep.
closure() {
	local m line
	for m in "$@"; do
		line=$(grep -E "(^|/)${m//_/[_-]}\.ko(\.[a-z]+)?:" "$mods/modules.dep" || true)
		[ -n "$line" ] || { echo "module $m not found in $mods/modules.dep" >&2; return 1; }
		echo "$line" | tr -d ':' | tr ' ' '\n'
	done | sed '/^$/d' | sort -u
}

mkdir -p "$kdir/initramfs"
key=$(
	{
		echo "$kver|$modules|$load"
		sha256sum "$busybox" "$here/init.sh" "$0" | cut -d' ' -f1
	} | sha256sum | cut -c1-16
)
base=$kdir/initramfs/base-$key.cpio.gz
exec 9>"$kdir/initramfs/.lock"
flock 9
if [ ! -s "$base" ]; then
	rm -f "$kdir"/initramfs/base-*.cpio.gz # built from older inputs
	root=$(mktemp -d)
	trap 'rm -rf "$root"' EXIT
	mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,proc,sys,dev,run,tmp,var,etc/ipipvm,ipipvm,lib/modules/$kver}
	cp "$busybox" "$root/bin/busybox"
	ln -s busybox "$root/bin/sh"
	ln -s ../bin/busybox "$root/sbin/modprobe"
	if [ "$(id -u)" = 0 ]; then
		mknod "$root/dev/console" c 5 1
		mknod "$root/dev/null" c 1 3
	fi
	for ko in $(closure $modules); do
		mkdir -p "$root/lib/modules/$kver/$(dirname "$ko")"
		case $ko in
		*.ko) cp "$mods/$ko" "$root/lib/modules/$kver/$ko" ;;
		*.ko.xz) xz -dc "$mods/$ko" >"$root/lib/modules/$kver/${ko%.xz}" ;;
		*.ko.zst) zstd -qdc "$mods/$ko" >"$root/lib/modules/$kver/${ko%.zst}" ;;
		*) echo "unsupported module file $ko" >&2; exit 1 ;;
		esac
	done
	cp "$mods/modules.builtin" "$mods/modules.order" "$root/lib/modules/$kver/"
	"$busybox" depmod -b "$root" "$kver"
	echo "$load" | tr ' ' '\n' >"$root/etc/ipipvm/modules"
	install -m 0755 "$here/init.sh" "$root/init"
	(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --owner=0:0 --quiet | gzip -1) >"$base.tmp"
	mv "$base.tmp" "$base"
	rm -rf "$root"
	trap - EXIT
fi
flock -u 9

overlay=$(mktemp -d)
trap 'rm -rf "$overlay"' EXIT
for spec in "$@"; do
	src=${spec%%:*} dest=${spec#*:}
	[ -f "$src" ] || { echo "mkinitramfs: $src is not a file" >&2; exit 1; }
	mkdir -p "$overlay/$(dirname "$dest")"
	cp -p "$src" "$overlay/$dest"
done
mkdir -p "$(dirname "$out")"
{
	cat "$base"
	(cd "$overlay" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --owner=0:0 --quiet | gzip -1)
} >"$out.tmp"
mv "$out.tmp" "$out"
echo "$out"
