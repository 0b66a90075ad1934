// Package policygen makes the NetworkPolicies the policy benchmarks
// measure: test/bench/policybench puts them in a cluster, and
// test/policynft's BenchmarkWaitPath compiles and writes them without
// one. One generator, so that both measure the same policies.
package policygen

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

const (
	// NSBench is the namespace of the measured pods (srv, cli and the
	// attached ones).
	NSBench = "bench"
	// NSCount namespaces bns-0..9 hold the fake pods and the varied
	// policies.
	NSCount = 10
	// Apps: the fake pods are app=a<i%200>, 5 each, all in one namespace.
	Apps = 200
	// SrvPort is srv's named port http; IperfPort iperf3's.
	SrvPort   = 80
	IperfPort = 5201
)

// FakePodLabels are fake pod i's labels (app, tier, version).
func FakePodLabels(i int) map[string]string {
	return map[string]string{"app": fmt.Sprintf("a%d", i%Apps), "tier": Tiers[i%3], "version": fmt.Sprintf("v%d", (i/NSCount)%2+1)}
}

// FakePodPorts are every fake pod's named ports.
func FakePodPorts() []corev1.ContainerPort {
	return []corev1.ContainerPort{
		{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP},
		{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
	}
}

// FakeNamespace is fake pod i's namespace.
func FakeNamespace(i int) string { return fmt.Sprintf("bns-%d", i%NSCount) }

// NamespaceLabels are the labels of namespace bns-<i>.
func NamespaceLabels(i int) map[string]string {
	return map[string]string{"team": fmt.Sprintf("t%d", i%3)}
}

// TCPPort is a TCP port of a rule (a number or a named port).
func TCPPort(p intstr.IntOrString) networkingv1.NetworkPolicyPort {
	proto := corev1.ProtocolTCP
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &p}
}

// UDPPort is a numbered UDP port of a rule.
func UDPPort(p int32) networkingv1.NetworkPolicyPort {
	proto := corev1.ProtocolUDP
	port := intstr.FromInt32(p)
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &port}
}

// Sel is a selector matching the labels kv (key, value, ...).
func Sel(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

// Tiers are the fake pods' tier labels, by i%3.
var Tiers = []string{"frontend", "backend", "db"}

// Policy names in namespace bench. The compiler jumps to a pod's policy
// chains in the order of their namespace/name, so srv's chain walks
// deny-all and the srv-* policies before web-allow-cli, the one that
// allows cli, and cli's egress chain (node 2) walks the cli-egress-dns-*
// policies before cli-egress-web.
const (
	// AllowCli allows cli to srv; CliEgWeb lets cli reach srv.
	AllowCli = "web-allow-cli"
	CliEgWeb = "cli-egress-web"
)

// Policies are n NetworkPolicies (n >= 20): in namespace bench,
// deny-all (ingress, every pod), web-allow-cli (srv from role=cli on
// the named port http and iperf3's port), n/100 more selecting srv that
// do not allow cli (pod and namespace selectors, matchExpressions,
// ipBlocks with excepts, named ports, endPort ranges), n/250 egress
// policies selecting cli that allow DNS only and cli-egress-web (cli to
// srv's http and iperf3 ports, DNS); and the rest in bns-*: a
// default-deny per namespace and varied ones (Varied), each
// selecting app=a<k%200> (5 pods of its namespace).
func Policies(n int) []*networkingv1.NetworkPolicy {
	in := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	inEg := []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	eg := []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	dns := networkingv1.NetworkPolicyEgressRule{
		To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: Sel(), PodSelector: Sel("k8s-app", "kube-dns")}},
		Ports: []networkingv1.NetworkPolicyPort{UDPPort(53), TCPPort(intstr.FromInt32(53))},
	}
	out := []*networkingv1.NetworkPolicy{
		{
			ObjectMeta: metav1.ObjectMeta{Namespace: NSBench, Name: "deny-all"},
			Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: in},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Namespace: NSBench, Name: AllowCli},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: *Sel("app", "srv"),
				PolicyTypes: in,
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: Sel("role", "cli")}},
					Ports: []networkingv1.NetworkPolicyPort{TCPPort(intstr.FromString("http")), TCPPort(intstr.FromInt32(IperfPort))},
				}},
			},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Namespace: NSBench, Name: CliEgWeb},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: *Sel("role", "cli"),
				PolicyTypes: eg,
				Egress: []networkingv1.NetworkPolicyEgressRule{{
					To:    []networkingv1.NetworkPolicyPeer{{PodSelector: Sel("app", "srv")}},
					Ports: []networkingv1.NetworkPolicyPort{TCPPort(intstr.FromString("http")), TCPPort(intstr.FromInt32(IperfPort))},
				}, dns},
			},
		},
	}
	for k := range max(1, n/100) {
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: NSBench, Name: fmt.Sprintf("srv-%d", k)}}
		np.Spec.PolicyTypes = in
		switch k % 3 {
		case 0: // monitoring from another namespace's pods on the named port metrics
			np.Spec.PodSelector = *Sel("app", "srv")
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: Sel("team", "t1"), PodSelector: Sel("tier", "backend")}},
				Ports: []networkingv1.NetworkPolicyPort{TCPPort(intstr.FromString("metrics")), TCPPort(intstr.FromInt32(9100 + int32(k)))},
			}}
		case 1: // a tier of the namespace, ipBlocks with excepts on a port range
			np.Spec.PodSelector = metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"web", "edge"}}}}
			r := TCPPort(intstr.FromInt32(8000))
			r.EndPort = ptr(int32(8099))
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{
					{IPBlock: &networkingv1.IPBlock{CIDR: "192.168.0.0/16", Except: []string{fmt.Sprintf("192.168.%d.0/24", k), "192.168.255.0/24"}}},
					{IPBlock: &networkingv1.IPBlock{CIDR: "fd10::/16", Except: []string{fmt.Sprintf("fd10:%x::/32", k)}}},
				},
				Ports: []networkingv1.NetworkPolicyPort{r},
			}}
		case 2: // the same namespace's frontends, and ingress + egress
			np.Spec.PodSelector = *Sel("app", "srv")
			np.Spec.PolicyTypes = inEg
			np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: Sel("tier", "frontend")}},
				Ports: []networkingv1.NetworkPolicyPort{TCPPort(intstr.FromInt32(443)), UDPPort(int32(5000 + k))},
			}}
			np.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{dns, {
				To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"10.0.0.0/8", "169.254.0.0/16"}}}},
			}}
		}
		out = append(out, np)
	}
	for k := range n / 250 {
		out = append(out, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: NSBench, Name: fmt.Sprintf("cli-egress-dns-%d", k)},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: *Sel("role", "cli"), PolicyTypes: eg,
				Egress: []networkingv1.NetworkPolicyEgressRule{dns}},
		})
	}
	for i := range NSCount {
		if len(out) == n {
			break
		}
		out = append(out, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("bns-%d", i), Name: "default-deny-ingress"},
			Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: in},
		})
	}
	for k := 0; len(out) < n; k++ {
		out = append(out, Varied(k))
	}
	return out
}

// Varied is the k-th policy in the bns-* namespaces: in bns-<k%10>,
// selecting app=a<k%200>, of one of 8 kinds (k%8): pod selector + named
// port; namespace + pod selector; ipBlocks with excepts (both families);
// ingress + egress to db pods and DNS; matchExpressions and an endPort
// range; the whole namespace, egress to the internet but the cluster;
// two labels selected, several peers; another namespace by its
// kubernetes.io/metadata.name, named port and UDP.
func Varied(k int) *networkingv1.NetworkPolicy {
	np := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("bns-%d", k%NSCount), Name: fmt.Sprintf("pol-%d", k)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *Sel("app", fmt.Sprintf("a%d", k%Apps)),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
		},
	}
	team := fmt.Sprintf("t%d", k%3)
	ing := func(peers []networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) {
		np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: peers, Ports: ports})
	}
	egress := func(rules ...networkingv1.NetworkPolicyEgressRule) {
		np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		np.Spec.Egress = rules
	}
	switch k % 8 {
	case 0:
		ing([]networkingv1.NetworkPolicyPeer{{PodSelector: Sel("tier", "frontend")}}, TCPPort(intstr.FromString("http")), TCPPort(intstr.FromInt32(443)))
	case 1:
		ing([]networkingv1.NetworkPolicyPeer{{NamespaceSelector: Sel("team", team), PodSelector: Sel("tier", "backend")}}, TCPPort(intstr.FromString("metrics")))
	case 2:
		ing([]networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{fmt.Sprintf("10.250.%d.0/24", k%4), fmt.Sprintf("10.250.%d.128/25", 4+k%3)}}},
			{IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/8", Except: []string{fmt.Sprintf("fd00:%x::/32", k%64)}}},
		}, TCPPort(intstr.FromInt32(8443)))
	case 3:
		ing([]networkingv1.NetworkPolicyPeer{{PodSelector: Sel("app", fmt.Sprintf("a%d", (k+10)%Apps))}}, TCPPort(intstr.FromString("http")))
		egress(networkingv1.NetworkPolicyEgressRule{
			To:    []networkingv1.NetworkPolicyPeer{{PodSelector: Sel("tier", "db")}},
			Ports: []networkingv1.NetworkPolicyPort{TCPPort(intstr.FromInt32(5432))},
		}, networkingv1.NetworkPolicyEgressRule{
			To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: Sel(), PodSelector: Sel("k8s-app", "kube-dns")}},
			Ports: []networkingv1.NetworkPolicyPort{UDPPort(53), TCPPort(intstr.FromInt32(53))},
		})
	case 4:
		r := TCPPort(intstr.FromInt32(9000))
		r.EndPort = ptr(int32(9100))
		ing([]networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{fmt.Sprintf("a%d", (k+20)%Apps), fmt.Sprintf("a%d", (k+30)%Apps)}},
			{Key: "tier", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"db"}},
		}}}}, r)
	case 5:
		ing([]networkingv1.NetworkPolicyPeer{{PodSelector: Sel()}})
		egress(networkingv1.NetworkPolicyEgressRule{
			To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"10.0.0.0/8", "169.254.0.0/16", "192.168.0.0/16"}}}},
			Ports: []networkingv1.NetworkPolicyPort{TCPPort(intstr.FromInt32(443))},
		})
	case 6:
		np.Spec.PodSelector = *Sel("app", fmt.Sprintf("a%d", k%Apps), "tier", Tiers[k%3])
		ing([]networkingv1.NetworkPolicyPeer{
			{PodSelector: Sel("app", fmt.Sprintf("a%d", (k+40)%Apps))},
			{NamespaceSelector: Sel("team", team)},
		}, TCPPort(intstr.FromInt32(5432)), TCPPort(intstr.FromString("metrics")))
	case 7:
		ing([]networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: Sel("kubernetes.io/metadata.name", fmt.Sprintf("bns-%d", (k+1)%NSCount)),
			PodSelector:       Sel("version", "v2"),
		}}, TCPPort(intstr.FromString("http")), UDPPort(5353))
	}
	return np
}

func ptr[T any](v T) *T { return &v }
