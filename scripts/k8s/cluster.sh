#!/usr/bin/env bash
# A real Kubernetes cluster in network namespaces on this machine, with
# podnet installed the way an operator installs it: `kubectl apply -f
# conf/k8s/podnet.yaml`, the DaemonSet's init containers putting the
# plugins and the conflist on each node, podnet-routed as its container.
#
#   scripts/k8s/cluster.sh up        MODE=vxlan|none NODES=2|3
#   scripts/k8s/cluster.sh check     pods on every node, ping + HTTP matrix,
#                                    ClusterIP and DNS from pods and nodes
#   scripts/k8s/cluster.sh down      stop everything, remove it (the scratch
#                                    dir too, but for e2e/ logs), and check
#                                    the machine is as before `up`
#   scripts/k8s/cluster.sh kubectl ARGS...   kubectl as the cluster admin
#   scripts/k8s/cluster.sh node N CMD...     run CMD on node N
#
# Control plane (netns $NSP-cp, which also holds the underlay bridge br0 at
# 172.31.77.1/24): etcd, kube-apiserver, kube-controller-manager with
# --allocate-node-cidrs (PodCIDRs the kubeadm way), kube-scheduler, and a
# route per node PodCIDR via that node, as a control-plane node running
# the pod network would have (the API server proxies to pods). Each node
# (netns $NSP-nN, eth0 172.31.77.1N): its own mount namespace (private
# /run, /etc, /opt, /var/lib; see node-init.sh), containerd 1.6 + runc,
# kubelet, kube-proxy in nftables mode. CoreDNS as a Deployment. All
# Kubernetes components v1.34.10, built from the Go module proxy and cached
# (scripts/ensure-kapi.sh, scripts/k8s/ensure-k8s.sh); images built here
# (scripts/k8s/images.sh).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

MODE=${MODE:-vxlan}
NODES=${NODES:-2}

usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
	exit 2
}

# ---- host state, to prove `down` leaves the machine as it found it

# (Only this cluster's netns and processes: another cluster of another
# PODNET_CLUSTER_NETNS/PODNET_CLUSTER_DIR, or another test's netns, may
# come and go meanwhile.)
host_state() {
	echo "## netns"
	ip netns list | awk '{print $1}' | { grep "^$NSP-" || true; } | sort
	echo "## links (root netns)"
	ip -o link show | awk -F': ' '{print $2}' | sed 's/@.*//' | sort
	echo "## nft ruleset (root netns)"
	nft list ruleset 2>/dev/null || true
	echo "## mounts"
	# (/run/netns itself is iproute2's, mounted by the first `ip netns add`
	# on the machine and left in place by design)
	# (the netns mounts under it are the netns above)
	findmnt -rn -o TARGET | grep -v '^/run/netns\(/\|$\)' | sort
	echo "## cgroups"
	ls -d /sys/fs/cgroup/*/"$NSP"-* 2>/dev/null || true
	echo "## processes of the cluster"
	pgrep -a -f "$CLUSTER_DIR/" | awk '{print $2}' | sort | uniq -c || true
}

# ---- certificates and kubeconfigs

pki() {
	mkdir -p "$PKI"
	(
		cd "$PKI"
		openssl ecparam -name prime256v1 -genkey -noout -out ca.key
		openssl req -x509 -new -key ca.key -subj /CN=podnet-k8s-ca -days 7 -out ca.crt 2>/dev/null
		openssl genrsa -out sa.key 2048 2>/dev/null
		openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
		# cert NAME SUBJECT USAGE [SAN]
		cert() {
			openssl ecparam -name prime256v1 -genkey -noout -out "$1.key"
			openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
			printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=%s\n' "$3" >"$1.ext"
			[ -n "${4:-}" ] && echo "subjectAltName=$4" >>"$1.ext"
			openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 7 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
			rm -f "$1.csr" "$1.ext"
		}
		cert apiserver /CN=kube-apiserver serverAuth \
			"IP:$UNDERLAY_GW4,IP:$UNDERLAY_GW6,IP:127.0.0.1,IP:::1,IP:10.96.0.1,IP:fd00:10:96::1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
		cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" clientAuth
		cert admin "/O=system:masters/CN=kubernetes-admin" clientAuth
		cert controller-manager /CN=system:kube-controller-manager clientAuth
		cert scheduler /CN=system:kube-scheduler clientAuth
		cert kube-proxy /CN=system:kube-proxy clientAuth
		for i in $(seq 1 "$NODES"); do
			cert "node$i" "/O=system:nodes/CN=system:node:node$i" clientAuth
			# kubelet's serving certificate (kubectl exec/logs, the API server's proxy)
			cert "node$i-serving" "/O=system:nodes/CN=system:node:node$i" serverAuth "IP:$(node_ip4 "$i"),IP:$(node_ip6 "$i"),DNS:node$i"
		done
	)
	kubeconfig admin "$API"
	kubeconfig controller-manager https://127.0.0.1:6443
	kubeconfig scheduler https://127.0.0.1:6443
	kubeconfig kube-proxy "$API"
	for i in $(seq 1 "$NODES"); do kubeconfig "node$i" "$API"; done
}

# kubeconfig NAME SERVER: $PKI/NAME.kubeconfig with NAME's client certificate.
kubeconfig() {
	cat >"$PKI/$1.kubeconfig" <<K
apiVersion: v1
kind: Config
clusters:
- name: podnet
  cluster: {server: "$2", certificate-authority: "$PKI/ca.crt"}
users:
- name: $1
  user: {client-certificate: "$PKI/$1.crt", client-key: "$PKI/$1.key"}
contexts:
- name: podnet
  context: {cluster: podnet, user: $1}
current-context: podnet
K
}

# ---- control plane

control_plane_up() {
	ip netns add "$CP_NS"
	echo "$CP_NS" >>"$RUN/netns"
	ip -n "$CP_NS" link set lo up
	ip -n "$CP_NS" link add br0 type bridge
	has4 && ip -n "$CP_NS" addr add "$UNDERLAY_GW4/24" dev br0
	has6 && ip -n "$CP_NS" addr add "$UNDERLAY_GW6/64" dev br0 nodad
	ip -n "$CP_NS" link set br0 up
	# the control plane routes to pods through the nodes (see the header)
	ip netns exec "$CP_NS" sysctl -qw net.ipv4.ip_forward=1
	has6 && ip netns exec "$CP_NS" sysctl -qw net.ipv6.conf.all.forwarding=1
	local in="nsenter --net=/run/netns/$CP_NS" p=$PKI
	# PodCIDR sizes: a /24 per node of IPv4, a /64 of IPv6 (the
	# controller-manager takes the per-family flags only when dual-stack)
	local masks=(--node-cidr-mask-size=24)
	[ "$FAMILY" = ipv6 ] && masks=(--node-cidr-mask-size=64)
	[ "$FAMILY" = dual ] && masks=(--node-cidr-mask-size-ipv4=24 --node-cidr-mask-size-ipv6=64)
	mkdir -p "$CLUSTER_DIR/etcd"
	start_bg etcd $in "$KAPI/etcd" --name=podnet --data-dir="$CLUSTER_DIR/etcd" \
		--listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
		--listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
		--initial-cluster=podnet=http://127.0.0.1:2380 --unsafe-no-fsync --log-level=warn
	wait_for 30 etcd $in curl -sf http://127.0.0.1:2379/health
	start_bg kube-apiserver $in "$KAPI/kube-apiserver" --etcd-servers=http://127.0.0.1:2379 \
		--bind-address=:: --secure-port=6443 --advertise-address="$UNDERLAY_GW" \
		--tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" --client-ca-file="$p/ca.crt" \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
		--service-cluster-ip-range="$SVC_CIDR" --service-node-port-range=30000-32767 \
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
		--kubelet-client-certificate="$p/apiserver-kubelet-client.crt" --kubelet-client-key="$p/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority="$p/ca.crt" \
		--kubelet-preferred-address-types=InternalIP --allow-privileged=true --profiling=false --v=1
	wait_for 90 kube-apiserver $in curl -sf --cacert "$p/ca.crt" --cert "$p/admin.crt" --key "$p/admin.key" https://127.0.0.1:6443/readyz
	start_bg kube-controller-manager $in "$K8S/kube-controller-manager" --kubeconfig="$p/controller-manager.kubeconfig" \
		--authentication-kubeconfig="$p/controller-manager.kubeconfig" --authorization-kubeconfig="$p/controller-manager.kubeconfig" \
		--bind-address=127.0.0.1 --leader-elect=false --allocate-node-cidrs=true --cluster-cidr="$CLUSTER_CIDR" \
		"${masks[@]}" --service-cluster-ip-range="$SVC_CIDR" --root-ca-file="$p/ca.crt" \
		--service-account-private-key-file="$p/sa.key" --use-service-account-credentials=true \
		--cluster-signing-cert-file="$p/ca.crt" --cluster-signing-key-file="$p/ca.key" \
		--profiling=false --v=1
	start_bg kube-scheduler $in "$K8S/kube-scheduler" --kubeconfig="$p/scheduler.kubeconfig" \
		--authentication-kubeconfig="$p/scheduler.kubeconfig" --authorization-kubeconfig="$p/scheduler.kubeconfig" \
		--bind-address=127.0.0.1 --leader-elect=false --profiling=false --v=1
	wait_for 60 kube-controller-manager $in curl -sfk https://127.0.0.1:10257/healthz
	wait_for 60 kube-scheduler $in curl -sfk https://127.0.0.1:10259/healthz
	wait_for 60 "the default ServiceAccount" kc get serviceaccount default
}

# ---- nodes

node_up() {
	local n=$1 d ns ip h
	d=$(node_dir "$n")
	ns=$(node_ns "$n")
	ip=$(node_ip "$n")
	mkdir -p "$d"
	ip netns add "$ns"
	echo "$ns" >>"$RUN/netns"
	ip -n "$ns" link set lo up
	ip -n "$CP_NS" link add "vn$n" type veth peer name eth0 netns "$ns"
	ip -n "$CP_NS" link set "vn$n" master br0 up
	if has4; then ip -n "$ns" addr add "$(node_ip4 "$n")/24" dev eth0; fi
	if has6; then ip -n "$ns" addr add "$(node_ip6 "$n")/64" dev eth0 nodad; fi
	ip -n "$ns" link set eth0 up
	if has4; then ip -n "$ns" route add default via "$UNDERLAY_GW4"; fi
	if has6; then ip -n "$ns" -6 route add default via "$UNDERLAY_GW6"; fi
	# cgroupfs driver: one cgroup root per kubelet (kubelet wants it to exist)
	for h in /sys/fs/cgroup/*/; do
		[ "$(stat -f -c %T "$h")" = cgroupfs ] || continue
		mkdir -p "$h$ns"
		if [ -f "$h/cpuset.cpus" ]; then
			cat "$h/cpuset.cpus" >"$h$ns/cpuset.cpus"
			cat "$h/cpuset.mems" >"$h$ns/cpuset.mems"
		fi
	done
	echo "$ns" >>"$RUN/cgroups"
	sed -e "s|@DIR@|$d/containerd|g" -e "s|@BIN_DIR@|/opt/cni/bin|g" -e "s|@CONF_DIR@|/etc/cni/net.d|g" \
		-e "s|@SANDBOX_IMAGE@|localhost/podnet/pause:test|g" "$REPO/scripts/runtime/containerd.toml.in" >"$d/containerd.toml"
	cat >"$d/kubelet.yaml" <<K
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$d/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /$ns
failSwapOn: false
address: $ip
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
tlsCertFile: $PKI/node$n-serving.crt
tlsPrivateKeyFile: $PKI/node$n-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
clusterDomain: cluster.local
clusterDNS: [$DNS_IP]
resolvConf: /etc/resolv.conf
serializeImagePulls: false
rotateCertificates: false
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
K
	cat >"$d/kube-proxy.yaml" <<K
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection: {kubeconfig: $PKI/kube-proxy.kubeconfig}
hostnameOverride: node$n
clusterCIDR: "$CLUSTER_CIDR"
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 1h0m0s}
K
	start_bg "node$n" \
		nsenter --net="/run/netns/$ns" unshare --mount --uts --propagation slave bash "$K8S_SCRIPTS/node-init.sh" "$n"
}

node_ready() {
	[ "$(kc get node "node$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

# control-plane routes to each node's PodCIDRs, one per family (once the
# controller-manager has allocated them)
cp_pod_routes() {
	local n cidr cidrs want
	want=$(echo "$CLUSTER_CIDR" | tr ',' ' ' | wc -w)
	for n in $(seq 1 "$NODES"); do
		cidrs=$(kc get node "node$n" -o jsonpath='{.spec.podCIDRs[*]}')
		[ "$(echo "$cidrs" | wc -w)" = "$want" ] || die "node$n has PodCIDRs '$cidrs', want one per family of $CLUSTER_CIDR"
		for cidr in $cidrs; do
			case $cidr in
			*:*) ip -n "$CP_NS" -6 route replace "$cidr" via "$(node_ip6 "$n")" ;;
			*) ip -n "$CP_NS" route replace "$cidr" via "$(node_ip4 "$n")" ;;
			esac
		done
	done
}

# coredns_manifest: manifests/coredns.yaml with the kube-dns Service's
# address for FAMILY (dual: both families, the v4 address first).
coredns_manifest() {
	local policy=SingleStack
	[ "$FAMILY" = dual ] && policy=RequireDualStack
	sed -e "s|clusterIP: 10.96.0.10|clusterIP: $DNS_IP\n  ipFamilyPolicy: $policy|" "$K8S_SCRIPTS/manifests/coredns.yaml"
}

up() {
	[ "$(id -u)" = 0 ] || die "the cluster creates network namespaces: run it as root"
	case $MODE in vxlan | none) ;; ipip) die "MODE=ipip needs the ipip module, which this kernel lacks: IPIP is tested in a VM (make ipipvm)" ;; *) die "MODE=$MODE: want vxlan or none" ;; esac
	case $NODES in 2 | 3) ;; *) die "NODES=$NODES: want 2 or 3" ;; esac
	case $FAMILY in ipv4 | dual | ipv6) ;; *) die "FAMILY=$FAMILY: want ipv4, dual or ipv6" ;; esac
	clear_leftovers
	[ ! -e "/run/netns/$CP_NS" ] || die "a cluster is already up (netns $CP_NS): make cluster-down first"
	local t0=$SECONDS t=$SECONDS
	phase() { log "$1: $((SECONDS - t))s"; t=$SECONDS; }
	bins
	rm -rf "$CLUSTER_DIR/run" "$CLUSTER_DIR/nodes" "$CLUSTER_DIR/etcd" "$PKI"
	mkdir -p "$RUN"
	"$K8S_SCRIPTS/images.sh" 2>/dev/null
	host_state >"$CLUSTER_DIR/host-before.txt"
	echo "$MODE $NODES $FAMILY" >"$RUN/config"
	phase "binaries and images (built once, then cached)"
	pki
	control_plane_up
	phase "control plane (etcd, kube-apiserver, controller-manager, scheduler)"
	# podnet, exactly as an operator installs it; the knobs are set in its
	# ConfigMap before the nodes join.
	# The ClusterNetworkPolicy CRD first, only when the cluster lacks it
	# (README: an existing one, maybe newer, is left as it is).
	kc get crd clusternetworkpolicies.policy.networking.k8s.io >/dev/null 2>&1 ||
		kc create -f "$REPO/conf/k8s/cnp-crds.yaml" >/dev/null
	kc apply -f "$REPO/conf/k8s/podnet.yaml" >/dev/null
	kc -n kube-system patch configmap podnet-config --type merge \
		-p "{\"data\":{\"encap\":\"$MODE\",\"portmap\":\"true\",\"clusterCIDR\":\"$CLUSTER_CIDR\"}}" >/dev/null
	coredns_manifest | kc apply -f - >/dev/null
	for n in $(seq 1 "$NODES"); do node_up "$n"; done
	for n in $(seq 1 "$NODES"); do wait_for 180 "node$n Ready" node_ready "$n"; done
	phase "$NODES nodes Ready (podnet-node DaemonSet installed the CNI config)"
	kc -n kube-system rollout status daemonset/podnet-node --timeout=180s >/dev/null
	cp_pod_routes
	kc -n kube-system rollout status deployment/coredns --timeout=180s >/dev/null
	phase "podnet-node DaemonSet and CoreDNS ready"
	log "cluster up in $((SECONDS - t0))s (MODE=$MODE, FAMILY=$FAMILY, $NODES nodes)"
	status
}

status() {
	bins >/dev/null
	kc get nodes -o wide
	echo
	kc get pods -A -o wide
}

# ---- check: what `make cluster` promises

check() {
	bins
	local nodes n a b fail=0 t=$SECONDS
	nodes=$(kc get nodes -o jsonpath='{.items[*].metadata.name}')
	# the web pods and Service of a check just before are deleted without
	# waiting: let them go before recreating them under the same names
	kc delete pod -l app=web --ignore-not-found --wait=true --timeout=60s >/dev/null
	kc delete service web --ignore-not-found --wait=true --timeout=60s >/dev/null
	kc apply -f - >/dev/null <<Y
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  ipFamilyPolicy: $([ "$FAMILY" = dual ] && echo RequireDualStack || echo SingleStack)
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
Y
	for n in $nodes; do
		kc apply -f - >/dev/null <<Y
apiVersion: v1
kind: Pod
metadata: {name: web-$n, labels: {app: web}}
spec:
  nodeName: $n
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: localhost/podnet/busybox:1
    imagePullPolicy: Never
    command: ["sh", "-c", "hostname > /www/index.html; exec httpd -f -p 8080 -h /www"]
    ports: [{containerPort: 8080}]
    readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}
Y
	done
	kc wait --for=condition=Ready pod -l app=web --timeout=120s >/dev/null || {
		kc get pods -o wide
		return 1
	}
	log "one web pod per node Ready in $((SECONDS - t))s"
	# every pod address and every ClusterIP: one per family
	declare -A ip
	for n in $nodes; do ip[$n]=$(kc get pod "web-$n" -o jsonpath='{.status.podIPs[*].ip}'); done
	local svc svcs want
	want=$(echo "$CLUSTER_CIDR" | tr ',' ' ' | wc -w)
	svcs=$(kc get service web -o jsonpath='{.spec.clusterIPs[*]}')
	svc=${svcs// /,}
	for n in $nodes; do
		[ "$(echo "${ip[$n]}" | wc -w)" = "$want" ] || {
			log "pod web-$n has addresses '${ip[$n]}', want one per family of $CLUSTER_CIDR"
			fail=1
		}
	done
	kc get pods -l app=web -o wide
	echo
	local nnodes
	nnodes=$(echo "$nodes" | wc -w)
	# cell WIDTH TEXT: TEXT padded to WIDTH characters
	cell() { printf '%s%*s' "$2" $(($1 - ${#2})) ''; }
	# mark WIDTH OK|FAIL [TEXT]: ✓ or ✗ and TEXT (and remember the failure)
	mark() {
		if [ "$2" = OK ]; then cell "$1" "✓ ${3:-}"; else
			cell "$1" "✗ ${3:-}"
			fail=1
		fi
	}
	cell 14 "from \\ to"
	for b in $nodes; do cell 12 "web-$b"; done
	cell 34 "ClusterIP $svc"
	echo "web.default (DNS)"
	for a in $nodes; do
		cell 14 "web-$a"
		for b in $nodes; do
			local ok=OK x
			for x in ${ip[$b]}; do
				kc exec "web-$a" -- sh -c "ping -c1 -W2 $x >/dev/null && [ \"\$(timeout 3 wget -qO- http://$(urlhost "$x"):8080/)\" = web-$b ]" >/dev/null 2>&1 || ok=FAIL
			done
			mark 12 $ok
		done
		# the Service until every node's pod has answered (the pod's own
		# too: hairpin), at most 30 requests 0.2 s apart; kube-proxy may
		# take a second or more to program a just-Ready endpoint (30
		# requests back to back took 0.3 s and once missed one)
		local got s all=""
		for s in $svcs; do
			got=$(kc exec "web-$a" -- sh -c "seen=''; for i in \$(seq 30); do r=\$(timeout 2 wget -qO- http://$(urlhost "$s")/) && case \" \$seen \" in *\" \$r \"*) ;; *) seen=\"\$seen \$r\" ;; esac; [ \$(echo \$seen | wc -w) = $nnodes ] && break; sleep 0.2; done; echo \$seen" 2>/dev/null | tr ' ' '\n' | sort | tr '\n' ' ')
			got=${got# }
			[ "$(echo "$got" | wc -w)" = "$nnodes" ] || all=FAIL
		done
		if [ -z "$all" ]; then mark 34 OK "$got"; else mark 34 FAIL "${got:-nothing}"; fi
		# by name: CoreDNS caches answers for 30 s, so a check run right
		# after another (the Service recreated with a new ClusterIP) may
		# see the old address for up to that long
		got=$(kc exec "web-$a" -- sh -c "for i in \$(seq 20); do timeout 3 wget -qO- http://web.default.svc.cluster.local/ && break; sleep 2; done" 2>/dev/null || true)
		if [ -n "$got" ]; then mark 1 OK "$got"; else mark 1 FAIL; fi
		echo
	done
	local i=0
	for a in $nodes; do
		i=$((i + 1))
		cell 14 "$a (host)"
		for b in $nodes; do
			local ok=OK x
			for x in ${ip[$b]}; do on_node "$i" curl -sf -m 3 "http://$(urlhost "$x"):8080/" >/dev/null 2>&1 || ok=FAIL; done
			mark 12 $ok
		done
		local ok=OK x
		for x in $svcs; do on_node "$i" curl -sf -m 3 "http://$(urlhost "$x")/" >/dev/null 2>&1 || ok=FAIL; done
		mark 34 $ok
		echo
	done
	kc delete pod -l app=web --wait=false >/dev/null
	kc delete service web --wait=false >/dev/null
	echo
	if [ "$fail" = 0 ]; then log "check: all ✓"; else log "check: FAILED (✗ above)"; fi
	return "$fail"
}

# ---- down

down() {
	[ -d "$RUN" ] || { log "no cluster under $CLUSTER_DIR"; return 0; }
	# best effort: a process already gone or a netns already removed must
	# not stop the rest of the teardown; the host-state diff below judges.
	set +e
	local pidf n d ns h cg p
	for pidf in "$RUN"/node*.pid; do
		[ -f "$pidf" ] || continue
		n=$(basename "$pidf" .pid)
		n=${n#node}
		d=$(node_dir "$n")
		ns=$(node_ns "$n")
		for p in kubelet kube-proxy; do [ -f "$d/pids/$p" ] && killpid "$(cat "$d/pids/$p")"; done
		# the containers: every process in the node's cgroups
		for h in /sys/fs/cgroup/*/; do
			[ -d "$h$ns" ] || continue
			find "$h$ns" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | while read -r p; do kill -KILL "$p" 2>/dev/null; done
		done
		for p in $(pgrep -f "containerd-shim-runc-v2 .*-address $d/containerd/containerd.sock( |$)"); do kill -KILL "$p" 2>/dev/null; done
		[ -f "$d/pids/containerd" ] && killpid "$(cat "$d/pids/containerd")"
		killpid "$(cat "$pidf")"
		rm -f "$pidf"
	done
	for p in kube-scheduler kube-controller-manager kube-apiserver etcd; do
		[ -f "$RUN/$p.pid" ] && killpid "$(cat "$RUN/$p.pid")"
		rm -f "$RUN/$p.pid"
	done
	sleep 0.5
	if [ -f "$RUN/cgroups" ]; then
		for cg in $(sort -u "$RUN/cgroups"); do
			for h in /sys/fs/cgroup/*/; do
				[ -d "$h$cg" ] && find "$h$cg" -depth -type d -exec rmdir {} \; 2>/dev/null
			done
		done
	fi
	if [ -f "$RUN/netns" ]; then
		for ns in $(tac "$RUN/netns"); do ip netns del "$ns" 2>/dev/null || true; done
	fi
	# runc state and overlay upper dirs hold root-owned files: remove them
	# only now that nothing uses them.
	rm -rf "$CLUSTER_DIR/nodes" "$CLUSTER_DIR/etcd"
	local before=$CLUSTER_DIR/host-before.txt
	if [ -f "$before" ]; then
		host_state >"$CLUSTER_DIR/host-after.txt"
		if ! diff -u "$before" "$CLUSTER_DIR/host-after.txt" >"$CLUSTER_DIR/host-diff.txt"; then
			log "down: the machine differs from before the cluster:"
			cat "$CLUSTER_DIR/host-diff.txt" >&2
			return 1
		fi
		log "down: netns, links, nft ruleset, mounts, cgroups and processes as before"
	fi
	# the scratch directory goes too, but for the last conformance run's
	# logs and reports (e2e/)
	find "$CLUSTER_DIR" -mindepth 1 -maxdepth 1 ! -name e2e -exec rm -rf {} +
}

case ${1:-} in
up) up ;;
down) down ;;
check) check ;;
status) status ;;
kubectl)
	shift
	bins >/dev/null
	kc "$@"
	;;
node)
	shift
	n=${1:?node number}
	shift
	on_node "$n" "$@"
	;;
*) usage ;;
esac
