#!/usr/bin/env bash
# node-init.sh N: the init of cluster node N. cluster.sh starts it inside
# the node's network namespace and new mount and UTS namespaces; it lives
# as long as the node.
#
# Its hostname is node$N (the UTS namespace is the node's own): kubelet,
# containerd, and the hostNetwork pods that share the node's UTS
# namespace see node$N, as on a machine of that name, not this machine's.
#
# It gives the node what a kubeadm node has on its own disk, without
# touching the machine's: private /run and /var/log (tmpfs) and /etc,
# /opt, /var/lib as overlays on the machine's (writes go to the node dir).
# So /etc/cni/net.d, /opt/cni/bin, /run/podnet, /var/lib/cni are per node,
# and the DaemonSet's hostPath volumes land there. Then it starts
# containerd, imports the images, and starts kubelet and kube-proxy.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
N=$1
D=$(node_dir "$N")
hostname "node$N"
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /var/log
for d in etc opt var/lib; do
	u=$D/overlay/${d//\//_}
	mkdir -p "$u/upper" "$u/work"
	mount -t overlay overlay -o "lowerdir=/$d,upperdir=$u/upper,workdir=$u/work" "/$d"
done
# What a fresh node has before the pod network: an empty CNI config dir,
# and the plugins of the kubernetes-cni package (loopback for lo, portmap
# for hostPort) in /opt/cni/bin.
rm -rf /etc/cni/net.d /opt/cni/bin /var/lib/cni /var/lib/kubelet /var/lib/containerd
mkdir -p /etc/cni/net.d /opt/cni/bin "$D/pids"
cp "$CNI_TOOLS/loopback" "$CNI_TOOLS/portmap" /opt/cni/bin/
head -c16 /dev/urandom | od -An -tx1 | tr -d ' \n' >/etc/machine-id
echo "node$N" >/etc/hostname
# kubelet writes six machine-wide sysctls at start (vm.overcommit_memory,
# kernel.panic, ...): show it the values it wants in files bind-mounted
# over them, so the machine's stay as they are.
mkdir -p "$D/sysctl"
for kv in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 kernel/panic_on_oops=1 \
	kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
	k=${kv%%=*}
	f=$D/sysctl/${k//\//.}
	echo "${kv#*=}" >"$f"
	mount --bind "$f" "/proc/sys/$k"
done

# bg NAME CMD...: a node process, its pid in $D/pids/NAME, its log in $D/NAME.log.
bg() {
	local name=$1
	shift
	"$@" >>"$D/$name.log" 2>&1 </dev/null &
	echo $! >"$D/pids/$name"
}
bg containerd containerd --config "$D/containerd.toml" --log-level warn
SOCK=$D/containerd/containerd.sock
wait_for 30 "node$N containerd" ctr --address "$SOCK" version
for i in "$IMG"/*.tar; do
	ctr --address "$SOCK" -n k8s.io images import "$i" >/dev/null
done
bg kubelet "$K8S/kubelet" --config="$D/kubelet.yaml" --kubeconfig="$PKI/node$N.kubeconfig" \
	--hostname-override="node$N" --node-ip="$(node_ips "$N")" --root-dir=/var/lib/kubelet --v=1
bg kube-proxy "$K8S/kube-proxy" --config="$D/kube-proxy.yaml" --v=1
echo "node$N: $(cd "$D/pids" && for f in *; do printf '%s=%s ' "$f" "$(cat "$f")"; done)"
wait
