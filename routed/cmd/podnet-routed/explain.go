package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"

	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/podnet/podnet/routed/policy"
)

// flow is what --explain-policy asks about: SRC DST PORT[/PROTO].
type flow struct {
	src, dst netip.Addr
	proto    uint8
	port     uint16
}

// parseFlow reads "SRC DST PORT[/tcp|udp|sctp]" (the protocol defaults to
// TCP, as in a NetworkPolicy).
func parseFlow(args []string) (flow, error) {
	const usage = "want SRC DST PORT[/tcp|udp|sctp], e.g. 10.244.1.5 10.244.2.7 8080/tcp"
	if len(args) != 3 {
		return flow{}, fmt.Errorf("%d arguments: %s", len(args), usage)
	}
	var f flow
	var err error
	if f.src, err = netip.ParseAddr(args[0]); err != nil {
		return flow{}, fmt.Errorf("source %q: %s", args[0], usage)
	}
	if f.dst, err = netip.ParseAddr(args[1]); err != nil {
		return flow{}, fmt.Errorf("destination %q: %s", args[1], usage)
	}
	f.src, f.dst = f.src.Unmap(), f.dst.Unmap()
	if f.src.Is4() != f.dst.Is4() {
		return flow{}, fmt.Errorf("%s and %s are of different families", f.src, f.dst)
	}
	port, proto, _ := strings.Cut(args[2], "/")
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return flow{}, fmt.Errorf("port %q: %s", port, usage)
	}
	f.port = uint16(n)
	switch strings.ToLower(proto) {
	case "", "tcp":
		f.proto = policy.ProtoTCP
	case "udp":
		f.proto = policy.ProtoUDP
	case "sctp":
		f.proto = policy.ProtoSCTP
	default:
		return flow{}, fmt.Errorf("protocol %q: %s", proto, usage)
	}
	return f, nil
}

// nodeCheck is what explain needs to hold this node's kernel table
// against the API objects: the node, its PodCIDRs and the comparison
// (nft.Check with the daemon's --policy-log-drops).
type nodeCheck struct {
	name     string
	podCIDRs []netip.Prefix
	check    func(policy.Ruleset) (string, error)
	// local gives the State what only the node knows (engine.LocalView);
	// nil: nothing
	local func(*policy.State) error
}

// explain lists Pods, Namespaces and NetworkPolicies once and prints
// which policies allow or refuse the flow, and why. With node, it then
// says whether this node's table inet podnet-policy is what those objects
// compile to for it: the answer above is then what the kernel does.
func explain(w io.Writer, pods, namespaces, policies cache.ListerWatcher, f flow, node *nodeCheck, cl *clusterLists) error {
	st := policy.NewState()
	list := func(what string, lw cache.ListerWatcher, each func(any)) error {
		obj, err := lw.List(metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("list %s: %w", what, err)
		}
		items, err := meta.ExtractList(obj)
		if err != nil {
			return fmt.Errorf("list %s: %w", what, err)
		}
		for _, it := range items {
			each(it)
		}
		return nil
	}
	if err := list("namespaces", namespaces, func(o any) {
		if ns, ok := o.(*corev1.Namespace); ok {
			st.SetNamespace(policy.FromNamespace(ns))
		}
	}); err != nil {
		return err
	}
	if err := list("pods", pods, func(o any) {
		if p, ok := o.(*corev1.Pod); ok {
			st.SetPod(policy.FromPod(p))
		}
	}); err != nil {
		return err
	}
	if err := list("networkpolicies", policies, func(o any) {
		if np, ok := o.(*networkingv1.NetworkPolicy); ok {
			if err := st.SetPolicy(np); err != nil {
				fmt.Fprintf(w, "note: NetworkPolicy %s/%s is refused (%v): it isolates the pods it selects and allows nothing\n", np.Namespace, np.Name, err)
			}
		}
	}); err != nil {
		return err
	}
	if err := cl.list(w, st, list); err != nil {
		return err
	}
	fmt.Fprintln(w, st.Explain(f.src, f.dst, f.proto, f.port).String())
	if node == nil {
		return nil
	}
	var err error
	if node.local != nil {
		err = node.local(st)
	}
	diff := ""
	if err == nil {
		diff, err = node.check(st.Compile(node.name, node.podCIDRs))
	}
	switch {
	case err != nil:
		fmt.Fprintf(w, "node %s: cannot compare its table inet podnet-policy with the API objects: %v\n", node.name, err)
	case diff == "table missing":
		fmt.Fprintf(w, "node %s: no table inet podnet-policy here: this node enforces no NetworkPolicy (is podnet-routed running on it with --network-policy=true?)\n", node.name)
	case diff != "":
		fmt.Fprintf(w, "node %s: its table inet podnet-policy differs from what the API objects compile to (%s): the engine may be in the middle of a change (run again), or failing to write (podnet_policy_errors_total); a pod whose Pod object does not show its addresses yet differs too\n", node.name, diff)
	default:
		fmt.Fprintf(w, "node %s: its table inet podnet-policy is what the API objects compile to: the kernel does as said above\n", node.name)
	}
	return nil
}

// clusterLists are the sources of ClusterNetworkPolicies (when the API
// server serves them) and Nodes (their nodes peers).
type clusterLists struct {
	policies, nodes cache.ListerWatcher
	served          func(context.Context) (bool, error)
}

// list puts the ClusterNetworkPolicies and Nodes in st, when served; a
// nil cl lists nothing.
func (cl *clusterLists) list(w io.Writer, st *policy.State, list func(string, cache.ListerWatcher, func(any)) error) error {
	if cl == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	served, err := cl.served(ctx)
	if err != nil {
		return err
	}
	if !served {
		fmt.Fprintln(w, "note: the API server serves no ClusterNetworkPolicies (their CRD is not installed): NetworkPolicies only")
		return nil
	}
	if err := list("nodes", cl.nodes, func(o any) {
		if n, ok := o.(*corev1.Node); ok {
			st.SetNode(policy.FromNode(n))
		}
	}); err != nil {
		return err
	}
	return list("clusternetworkpolicies", cl.policies, func(o any) {
		if c, ok := o.(*cnpv1.ClusterNetworkPolicy); ok {
			if err := st.SetClusterPolicy(c); err != nil {
				fmt.Fprintf(w, "note: %v\n", err)
			}
		}
	})
}

// nodePodCIDRs reads Node name's PodCIDRs from the API server.
func nodePodCIDRs(core rest.Interface, name string) ([]netip.Prefix, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n corev1.Node
	if err := core.Get().Resource("nodes").Name(name).Do(ctx).Into(&n); err != nil {
		return nil, fmt.Errorf("get Node %s: %w", name, err)
	}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	var out []netip.Prefix
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("Node %s: PodCIDR %q: %w", name, c, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}
