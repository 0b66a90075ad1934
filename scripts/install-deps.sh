#!/usr/bin/env bash
# Installs the Debian packages the tests and the demo use, when missing.
set -euo pipefail

pkgs=(iproute2 iputils-ping make git ca-certificates openssl qemu-system-x86 busybox-static cpio xz-utils containerd runc iperf3)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
	echo "installing Debian packages: ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
