#!/usr/bin/env bash
# Makes the IPIP test VM's kernel available and prints its cache directory,
# ~/.cache/podnet/ipipvm/<kernel-version>/, which holds:
#   vmlinux            uncompressed kernel (PVH entry: QEMU boots it directly)
#   lib/modules/<ver>/ the package's modules, with modules.dep (busybox depmod)
#   package            "<package> <version>" of the Debian kernel package
#
# The host kernel has no IPIP module, so the IPIP test boots Debian's stock
# kernel under QEMU (TCG). The package is downloaded with `apt-get download`
# and unpacked, never installed. Missing Debian tools (qemu-system-x86,
# busybox-static, cpio, xz-utils) are installed first. Idempotent; the
# second run only resolves the package name. Safe to run concurrently.
set -euo pipefail

cache=${PODNET_IPIPVM_CACHE:-$HOME/.cache/podnet/ipipvm}
mkdir -p "$cache"

log() { echo "ensure-kernel: $*" >&2; }

install_tools() {
	local pkgs=(qemu-system-x86 busybox-static cpio xz-utils) missing=() p
	for p in "${pkgs[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
	done
	[ "${#missing[@]}" -eq 0 ] && return 0
	if [ "$(id -u)" != 0 ]; then
		log "missing Debian packages ${missing[*]}: install them as root (apt-get install --no-install-recommends ${missing[*]})"
		exit 1
	fi
	log "installing Debian packages: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq >&2
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# kernel_package prints the image package linux-image-amd64 depends on,
# e.g. linux-image-6.1.0-56-amd64 (empty when apt knows no lists).
kernel_package() {
	apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-/ {p = $2} END {print p}'
}

# newest_cached prints the most recent complete cache directory, if any.
newest_cached() {
	local d
	for d in $(ls -1dt "$cache"/*/ 2>/dev/null); do
		[ -s "$d/vmlinux" ] && [ -s "$d/package" ] && { echo "${d%/}"; return 0; }
	done
	return 0
}

# download PKG into the current directory. As root, apt would drop to its
# _apt user, who cannot write under root's home (it warns and goes on).
download() {
	if [ "$(id -u)" = 0 ]; then
		apt-get download -o APT::Sandbox::User=root "$1" >&2
	else
		apt-get download "$1" >&2
	fi
}

install_tools

exec 9>"$cache/.lock"
flock 9

pkg=$(kernel_package)
if [ -z "$pkg" ]; then
	apt-get update -qq >&2 || true
	pkg=$(kernel_package)
fi
if [ -z "$pkg" ]; then
	dir=$(newest_cached)
	[ -n "$dir" ] || { log "cannot resolve linux-image-amd64 with apt-cache and nothing is cached"; exit 1; }
	log "apt-cache cannot resolve linux-image-amd64; using cached $dir"
	echo "$dir"
	exit 0
fi
kver=${pkg#linux-image-}
dir=$cache/$kver
if [ -s "$dir/vmlinux" ] && [ -s "$dir/package" ] && [ -s "$dir/lib/modules/$kver/modules.dep" ]; then
	echo "$dir"
	exit 0
fi

work=$(mktemp -d "$cache/.work.XXXXXX")
trap 'rm -rf "$work"' EXIT
log "fetching $pkg"
if ! (cd "$work" && download "$pkg"); then
	# Stale package lists name a kernel the mirror no longer has.
	log "download failed; refreshing the package lists"
	apt-get update -qq >&2 || true
	pkg=$(kernel_package)
	kver=${pkg#linux-image-}
	dir=$cache/$kver
	if [ -n "$pkg" ] && [ -s "$dir/vmlinux" ] && [ -s "$dir/package" ]; then
		echo "$dir"
		exit 0
	fi
	[ -n "$pkg" ] && (cd "$work" && download "$pkg") || {
		dir=$(newest_cached)
		[ -n "$dir" ] || { log "cannot download the kernel package"; exit 1; }
		log "using cached $dir"
		echo "$dir"
		exit 0
	}
fi
deb=$(ls "$work"/*.deb)
dpkg-deb -x "$deb" "$work/pkg"
[ -d "$work/pkg/lib/modules/$kver" ] || { log "$deb has no lib/modules/$kver"; exit 1; }
bz=$work/pkg/boot/vmlinuz-$kver

# vmlinuz is a bzImage whose payload is xz (CONFIG_KERNEL_XZ): cut at the xz
# magic and decompress one stream to get the ELF vmlinux, which QEMU boots
# through its PVH note, skipping firmware and the real-mode decompressor.
off=$( (grep -abo $'\xfd7zXZ\x00' "$bz" || true) | head -1 | cut -d: -f1)
[ -n "$off" ] || { log "no xz payload in $bz"; exit 1; }
{ tail -c +$((off + 1)) "$bz" || true; } | xz -dc --single-stream >"$work/vmlinux" 2>/dev/null || true
[ "$(head -c4 "$work/vmlinux" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ] || { log "vmlinux extraction from $bz failed"; exit 1; }

# modules.dep/alias for the whole tree, so the initramfs builder can resolve
# each module's dependencies. (Debian's package ships none: its postinst runs depmod.)
busybox depmod -b "$work/pkg" "$kver"

rm -rf "$dir"
mkdir -p "$dir/lib/modules"
mv "$work/vmlinux" "$dir/vmlinux"
mv "$work/pkg/lib/modules/$kver" "$dir/lib/modules/$kver"
echo "$pkg $(dpkg-deb -f "$deb" Version)" >"$dir/package"
log "cached $(cat "$dir/package") in $dir ($(du -sh "$dir" | cut -f1))"
echo "$dir"
