#!/usr/bin/env bash
# Installs the Debian packages the tests and the demo use, when missing.
set -euo pipefail

# The Kubernetes cluster (scripts/k8s) also needs: nftables (kube-proxy's
# nftables mode runs nft), conntrack (kube-proxy clears UDP entries),
# util-linux (nsenter, unshare), curl, and for the e2e test image the tools
# its specs exec: bind9-dnsutils (dig), netcat-openbsd (nc -v), dash, wget
# (GNU: Debian's busybox wget has no -T), and for the distroless-iptables
# stand-in iptables and ipset.
pkgs=(iproute2 iputils-ping make git ca-certificates openssl qemu-system-x86 busybox-static cpio xz-utils containerd runc iperf3
	nftables conntrack util-linux curl bind9-dnsutils netcat-openbsd dash wget iptables ipset)
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
