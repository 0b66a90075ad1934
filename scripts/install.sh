#!/usr/bin/env bash
# Installs podnet on a host without Kubernetes: the CNI plugins (podnet,
# podnet-ipam, podnet-bridge) into /opt/cni/bin and a conflist into
# /etc/cni/net.d, with the same installer the podnet-node DaemonSet runs
# (bin/podnet-install: atomic copies, conflist last, refuses to overwrite or
# hide behind a foreign conflist). Build first with `make`.
#
#   scripts/install.sh [--subnet CIDR] [options]   install (or update)
#   scripts/install.sh --uninstall [options]       remove conflist and plugins
#
# Options (each also as --opt=value):
#   --bin-dir DIR      plugin dir            (env CNI_BIN_DIR, default /opt/cni/bin)
#   --conf-dir DIR     config dir            (env CNI_CONF_DIR, default /etc/cni/net.d)
#   --src-dir DIR      where the built binaries are (default: bin/ of this repo)
#   --subnet CIDR      this host's pod subnet; without it the IPAM takes the
#                      node's PodCIDR from podnet-routed (usePodCidr)
#   --state-dir DIR    node.json and the IPAM store (default /run/podnet)
#   --plugin NAME      podnet (default) or podnet-bridge
#   --cni-version V    conflist cniVersion (default 1.0.0; 1.1.0 adds GC/STATUS)
#   --mtu N            pod MTU (default: automatic)
#   --conf-name NAME   conflist file name (default 10-podnet.conflist)
#   --portmap          chain the reference portmap plugin (not shipped)
#   --force            overwrite a foreign conflist / install behind one
set -euo pipefail

src=${PODNET_SRC_DIR:-$(cd "$(dirname "$0")/.." && pwd)/bin}
args=()
while [ $# -gt 0 ]; do
	case "$1" in
	-h | --help)
		sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	--src-dir) src=$2; shift 2 ;;
	--src-dir=*) src=${1#*=}; shift ;;
	--portmap | --force | --uninstall) args+=("$1"); shift ;;
	--*=*) args+=("$1"); shift ;;
	--bin-dir | --conf-dir | --subnet | --state-dir | --plugin | --cni-version | --mtu | --conf-name)
		[ $# -ge 2 ] || { echo "install.sh: $1 needs a value" >&2; exit 2; }
		args+=("$1=$2"); shift 2 ;;
	*) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
	esac
done

installer=$src/podnet-install
if [ ! -x "$installer" ]; then
	echo "install.sh: $installer not found: run \`make\` first (or pass --src-dir)" >&2
	exit 1
fi
exec "$installer" --src-dir="$src" "${args[@]}"
