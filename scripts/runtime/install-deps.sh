#!/usr/bin/env bash
# Installs what the container-runtime tests (test/runtime) need, when missing:
# Debian's containerd (1.6, with ctr and containerd-shim-runc-v2), runc, and
# nsenter (util-linux) to start containerd inside a test node's netns.
# Idempotent: prints nothing and touches nothing when all are there.
set -euo pipefail

pkgs=(containerd runc util-linux iproute2)
missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
	echo "installing Debian packages: ${missing[*]}" >&2
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	# --no-install-recommends: no extra CNI plugins or configs land in /etc/cni.
	apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The package enables a system containerd under systemd. The tests never use
# it (they start their own, on scratch paths), and on a machine without
# systemd nothing is started.
