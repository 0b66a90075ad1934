package policy

import (
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	tcp  = ProtoTCP
	udp  = ProtoUDP
	sctp = ProtoSCTP
	icmp = uint8(1)
)

var (
	pIngress = networkingv1.PolicyTypeIngress
	pEgress  = networkingv1.PolicyTypeEgress
)

// TestSemantics checks every point of networking.k8s.io/v1 semantics on
// the test cluster, each flow through both Explain (the objects read
// directly) and the compiled Rulesets of the nodes involved (Matcher). Pod
// to pod flows run in both families.
func TestSemantics(t *testing.T) {
	cases := []struct {
		name     string
		policies []*pol
		flows    []flow
	}{
		{"no policy: everything allowed", nil, []flow{
			{"y/b", "x/a", tcp, 80, true}, {"x/a", "8.8.8.8", udp, 53, true}, {"x/c", "x/a", icmp, 0, true},
		}},
		{"deny-all ingress isolates ingress only", []*pol{policy("x", "deny", nil)}, []flow{
			{"y/b", "x/a", tcp, 80, false}, {"x/b", "x/a", tcp, 80, false}, {"y/a", "x/c", tcp, 80, false},
			{"x/a", "y/b", tcp, 80, true}, {"x/a", "8.8.8.8", tcp, 443, true}, {"8.8.8.8", "x/a", tcp, 80, false},
			{"y/a", "y/b", tcp, 80, true}, // another namespace: not selected
		}},
		{"podSelector picks the isolated pods", []*pol{policy("x", "deny-a", map[string]string{"app": "a"})}, []flow{
			{"x/b", "x/a", tcp, 80, false}, {"x/a", "x/b", tcp, 80, true}, {"y/a", "x/c", tcp, 80, true},
		}},
		{"policy in another namespace does not select", []*pol{policy("y", "deny-a", map[string]string{"app": "a"})}, []flow{
			{"x/b", "x/a", tcp, 80, true}, {"x/b", "y/a", tcp, 80, false},
		}},
		{"policyTypes default: egress rules make it Ingress+Egress", []*pol{
			policy("x", "eg", map[string]string{"app": "a"}, egress(nil, podPeer(sel("app", "b")))),
		}, []flow{
			{"x/a", "x/b", tcp, 80, true}, {"x/a", "x/c", tcp, 80, false}, {"x/a", "8.8.8.8", tcp, 80, false},
			{"x/b", "x/a", tcp, 80, false}, // Ingress always, with no ingress rule: deny
		}},
		{"policyTypes [Egress] without rules: egress deny-all, ingress open", []*pol{
			policy("x", "eg", map[string]string{"app": "a"}, ptypes(pEgress)),
		}, []flow{
			{"x/a", "x/b", tcp, 80, false}, {"x/a", "8.8.8.8", udp, 53, false}, {"x/b", "x/a", tcp, 80, true},
		}},
		{"policyTypes [Egress] ignores ingress rules", []*pol{
			policy("x", "eg", map[string]string{"app": "a"}, ptypes(pEgress), ingress(nil, podPeer(sel("app", "b"))),
				egress(nil, podPeer(sel("app", "c")))),
		}, []flow{
			{"z/c", "x/a", tcp, 80, true}, {"x/a", "x/c", tcp, 80, true}, {"x/a", "x/b", tcp, 80, false},
		}},
		{"policyTypes [Ingress] ignores egress rules", []*pol{
			policy("x", "in", map[string]string{"app": "a"}, ptypes(pIngress), egress(nil, podPeer(sel("app", "b")))),
		}, []flow{
			{"x/a", "x/c", tcp, 80, true}, {"x/b", "x/a", tcp, 80, false},
		}},
		{"union of policies", []*pol{
			policy("x", "from-b", map[string]string{"app": "a"}, ingress(nil, podPeer(sel("app", "b")))),
			policy("x", "from-y", map[string]string{"app": "a"}, ingress(nil, nsPeer(sel("team", "b")))),
			policy("x", "deny-all", nil),
		}, []flow{
			{"x/b", "x/a", tcp, 80, true}, {"y/a", "x/a", tcp, 80, true}, {"y/b", "x/a", udp, 9, true},
			{"x/c", "x/a", tcp, 80, false}, {"z/c", "x/a", tcp, 80, false},
		}},
		{"union of rules in one policy", []*pol{
			policy("x", "two", map[string]string{"app": "a"},
				ingress(ports(port("TCP", 80)), podPeer(sel("app", "b"))),
				ingress(ports(port("UDP", 53)), podPeer(sel("app", "c")))),
		}, []flow{
			{"x/b", "x/a", tcp, 80, true}, {"x/b", "x/a", udp, 53, false}, {"x/c", "x/a", udp, 53, true}, {"x/c", "x/a", tcp, 80, false},
		}},
		{"podSelector peer alone: the policy's namespace", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(nil, podPeer(sel("app", "b")))),
		}, []flow{
			{"x/b", "x/a", tcp, 80, true}, {"y/b", "x/a", tcp, 80, false},
		}},
		{"empty podSelector peer: every pod of the policy's namespace", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(nil, podPeer(sel()))),
		}, []flow{
			{"x/b", "x/a", tcp, 80, true}, {"x/c", "x/a", tcp, 80, true}, {"y/a", "x/a", tcp, 80, false},
			{"8.8.8.8", "x/a", tcp, 80, false},
		}},
		{"namespaceSelector alone: every pod of matching namespaces", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(nil, nsPeer(sel("team", "b")))),
		}, []flow{
			{"y/a", "x/a", tcp, 80, true}, {"y/b", "x/a", tcp, 80, true}, {"x/b", "x/a", tcp, 80, false}, {"z/c", "x/a", tcp, 80, false},
		}},
		{"namespaceSelector on kubernetes.io/metadata.name", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(nil, nsPeer(sel("kubernetes.io/metadata.name", "z")))),
		}, []flow{
			{"z/c", "x/a", tcp, 80, true}, {"y/a", "x/a", tcp, 80, false},
		}},
		{"empty namespaceSelector: every pod of every namespace, not outside", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(nil, nsPeer(sel()))),
		}, []flow{
			{"z/c", "x/a", tcp, 80, true}, {"x/b", "x/a", tcp, 80, true}, {"8.8.8.8", "x/a", tcp, 80, false},
			{"192.168.0.2", "x/a", tcp, 80, false}, // a hostNetwork pod of n2: no pod address
		}},
		{"namespaceSelector AND podSelector in one peer", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(nil, bothPeer(sel("team", "b"), sel("app", "b")))),
		}, []flow{
			{"y/b", "x/a", tcp, 80, true}, {"y/a", "x/a", tcp, 80, false}, {"x/b", "x/a", tcp, 80, false},
		}},
		{"two peers are OR", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(nil, nsPeer(sel("team", "b")), podPeer(sel("app", "b")))),
		}, []flow{
			{"y/a", "x/a", tcp, 80, true}, {"x/b", "x/a", tcp, 80, true}, {"z/c", "x/a", tcp, 80, false}, {"x/c", "x/a", tcp, 80, false},
		}},
		{"matchExpressions", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(nil, bothPeer(sel(), &metav1.LabelSelector{
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"b"}}},
			}))),
		}, []flow{
			{"x/c", "x/a", tcp, 80, true}, {"y/a", "x/a", tcp, 80, true}, {"y/b", "x/a", tcp, 80, false}, {"x/b", "x/a", tcp, 80, false},
		}},
		{"ipBlock with except", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(nil, blockPeer("10.0.2.0/24", "10.0.2.2/32"))),
		}, []flow{
			{"10.0.2.1", "10.0.1.1", tcp, 80, true}, {"10.0.2.2", "10.0.1.1", tcp, 80, false},
			{"10.0.2.3", "10.0.1.1", tcp, 80, true}, {"10.0.3.1", "10.0.1.1", tcp, 80, false},
			{"fd00::2:1", "fd00::1:1", tcp, 80, false}, // an IPv4 block holds no IPv6 address
		}},
		{"ipBlock nested and overlapping excepts", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(nil,
				blockPeer("10.0.0.0/16", "10.0.2.0/24", "10.0.2.0/25", "10.0.3.0/25", "10.0.3.64/26", "10.0.1.2/31"))),
		}, []flow{
			{"10.0.2.1", "10.0.1.1", tcp, 80, false}, {"10.0.2.200", "10.0.1.1", tcp, 80, false},
			{"10.0.3.1", "10.0.1.1", tcp, 80, false}, {"10.0.3.127", "10.0.1.1", tcp, 80, false}, {"10.0.3.128", "10.0.1.1", tcp, 80, true},
			{"10.0.1.2", "10.0.1.1", tcp, 80, false}, {"10.0.1.3", "10.0.1.1", tcp, 80, false}, {"10.0.4.1", "10.0.1.1", tcp, 80, true},
			{"10.0.255.255", "10.0.1.1", tcp, 80, true}, {"10.1.0.0", "10.0.1.1", tcp, 80, false},
		}},
		{"ipBlock except outside the cidr or of the other family is ignored", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(nil, blockPeer("10.0.2.0/24", "10.0.1.0/24", "fd00::/8"))),
		}, []flow{
			{"10.0.2.1", "10.0.1.1", tcp, 80, true}, {"10.0.1.2", "10.0.1.1", tcp, 80, false},
		}},
		{"ipBlock overlapping blocks in one rule", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(nil,
				blockPeer("10.0.0.0/16", "10.0.2.0/24"), blockPeer("10.0.2.0/25"))),
		}, []flow{
			{"10.0.2.1", "10.0.1.1", tcp, 80, true}, {"10.0.2.129", "10.0.1.1", tcp, 80, false}, {"10.0.1.2", "10.0.1.1", tcp, 80, true},
		}},
		{"ipBlock IPv6", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(nil, blockPeer("fd00::/16", "fd00::2:2/128"))),
		}, []flow{
			{"fd00::2:1", "fd00::1:1", tcp, 80, true}, {"fd00::2:2", "fd00::1:1", tcp, 80, false},
			{"fd01::1", "fd00::1:1", tcp, 80, false}, {"10.0.2.1", "10.0.1.1", tcp, 80, false},
		}},
		{"egress ipBlock 0.0.0.0/0 is IPv4 only", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ptypes(pEgress), egress(nil, blockPeer("0.0.0.0/0"))),
		}, []flow{
			{"10.0.1.1", "8.8.8.8", tcp, 443, true}, {"10.0.1.1", "10.0.2.2", tcp, 443, true},
			{"fd00::1:1", "2001:db8::1", tcp, 443, false},
		}},
		{"numbered port: protocol and number", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(ports(port("TCP", 80)))),
		}, []flow{
			{"x/b", "x/a", tcp, 80, true}, {"x/b", "x/a", tcp, 81, false}, {"x/b", "x/a", udp, 80, false},
			{"8.8.8.8", "x/a", tcp, 80, true}, {"x/b", "x/a", icmp, 0, false},
		}},
		{"protocol defaults to TCP", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(ports(port("", 53)))),
		}, []flow{
			{"x/b", "x/a", tcp, 53, true}, {"x/b", "x/a", udp, 53, false},
		}},
		{"UDP and SCTP", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(ports(port("UDP", 53), port("SCTP", 9999)))),
		}, []flow{
			{"x/b", "x/a", udp, 53, true}, {"x/b", "x/a", sctp, 9999, true}, {"x/b", "x/a", tcp, 53, false}, {"x/b", "x/a", sctp, 53, false},
		}},
		{"protocol without port: every port of it", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(ports(port("UDP", nil)))),
		}, []flow{
			{"x/b", "x/a", udp, 1, true}, {"x/b", "x/a", udp, 65535, true}, {"x/b", "x/a", tcp, 80, false},
		}},
		{"endPort range", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(ports(port("TCP", 8000, 8010)))),
		}, []flow{
			{"x/b", "x/a", tcp, 8000, true}, {"x/b", "x/a", tcp, 8005, true}, {"x/b", "x/a", tcp, 8010, true},
			{"x/b", "x/a", tcp, 7999, false}, {"x/b", "x/a", tcp, 8011, false}, {"x/b", "x/a", udp, 8005, false},
		}},
		{"ports without peers and peers without ports", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(ports(port("TCP", 80)), podPeer(sel("app", "b")))),
		}, []flow{
			{"x/b", "x/a", tcp, 80, true}, {"x/b", "x/a", tcp, 81, false}, {"x/c", "x/a", tcp, 80, false},
		}},
		{"no ports: ICMP too", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(nil, podPeer(sel("app", "b")))),
		}, []flow{
			{"x/b", "x/a", icmp, 0, true}, {"x/c", "x/a", icmp, 0, false},
		}},
		{"named port, ingress: resolved against the selected pod", []*pol{
			policy("x", "p", nil, ingress(ports(port("TCP", "http")))),
		}, []flow{
			{"y/a", "x/a", tcp, 80, true}, {"y/a", "x/a", tcp, 8080, false},
			{"y/a", "x/b", tcp, 8080, true}, {"y/a", "x/b", tcp, 80, false},
			{"y/a", "x/c", tcp, 81, true}, {"y/a", "x/c", tcp, 80, false},
		}},
		{"named port, protocol must match the container port's", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(ports(port("TCP", "dns"), port("UDP", "http")))),
		}, []flow{
			{"x/b", "x/a", udp, 53, false}, {"x/b", "x/a", tcp, 53, false}, {"x/b", "x/a", tcp, 80, false},
		}},
		{"named port UDP and SCTP", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(ports(port("UDP", "dns"), port("SCTP", "sctp")))),
		}, []flow{
			{"x/b", "x/a", udp, 53, true}, {"x/b", "x/a", sctp, 9999, true}, {"x/b", "x/a", udp, 9999, false},
		}},
		{"named port matching nothing matches nothing", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(ports(port("TCP", "nope")))),
		}, []flow{
			{"x/b", "x/a", tcp, 80, false}, {"x/b", "x/a", tcp, 0, false},
		}},
		{"named port next to a numbered one", []*pol{
			policy("x", "p", map[string]string{"app": "a"}, ingress(ports(port("TCP", "nope"), port("TCP", 70, 90)))),
		}, []flow{
			{"x/b", "x/a", tcp, 80, true}, {"x/b", "x/a", tcp, 91, false},
		}},
		{"named port, egress: resolved against the destination pod", []*pol{
			policy("x", "p", map[string]string{"app": "b"}, ptypes(pEgress), egress(ports(port("TCP", "http")))),
		}, []flow{
			{"x/b", "x/a", tcp, 80, true}, {"x/b", "x/a", tcp, 8080, false}, {"x/b", "x/c", tcp, 81, true},
			{"x/b", "x/c", tcp, 80, false}, {"x/b", "8.8.8.8", tcp, 80, false},
			{"x/b", "192.168.0.1", tcp, 80, false}, // a hostNetwork pod's named port: no pod address
		}},
		{"named port, egress, with peers", []*pol{
			policy("x", "p", map[string]string{"app": "b"}, ptypes(pEgress),
				egress(ports(port("TCP", "http")), podPeer(sel("app", "c")), blockPeer("10.0.1.0/24"))),
		}, []flow{
			{"x/b", "x/c", tcp, 81, true}, {"10.0.1.2", "10.0.1.1", tcp, 80, true}, {"10.0.1.2", "10.0.1.1", tcp, 81, false},
			{"fd00::1:2", "fd00::1:1", tcp, 80, false}, // the block is IPv4
			{"10.0.1.2", "10.0.4.9", tcp, 80, false},
		}},
		{"egress and ingress both judged, across nodes", []*pol{
			policy("x", "eg", map[string]string{"app": "a"}, ptypes(pEgress), egress(ports(port("TCP", 80)))),
			policy("y", "in", map[string]string{"app": "a"}, ingress(ports(port("TCP", 80, 90)), nsPeer(sel("team", "a")))),
		}, []flow{
			{"x/a", "y/a", tcp, 80, true}, {"x/a", "y/a", tcp, 85, false}, {"x/b", "y/a", tcp, 85, true}, {"z/c", "y/a", tcp, 80, false},
		}},
		{"hostNetwork pods are no target", []*pol{
			policy("x", "deny", nil, ptypes(pIngress, pEgress)),
		}, []flow{
			{"8.8.8.8", "192.168.0.1", tcp, 22, true}, {"192.168.0.1", "8.8.8.8", tcp, 22, true},
			{"192.168.0.2", "x/a", tcp, 80, false},
		}},
		{"hostNetwork pods contribute no address as selected peers", []*pol{
			policy("x", "p", map[string]string{"app": "b"}, ingress(nil, podPeer(sel("app", "a")))),
		}, []flow{
			{"x/a", "x/b", tcp, 80, true}, {"192.168.0.2", "x/b", tcp, 80, false},
		}},
		{"a pod reaching itself is allowed", []*pol{
			policy("x", "deny", nil, ptypes(pIngress, pEgress)),
		}, []flow{
			{"x/a", "x/a", tcp, 80, true}, {"x/a", "x/b", tcp, 80, false},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := testState()
			for _, p := range c.policies {
				if err := s.SetPolicy(p); err != nil {
					t.Fatalf("SetPolicy %s: %v", p.Name, err)
				}
			}
			for n, cidrs := range nodeCIDRs {
				checkRuleset(t, s.Compile(n, cidrs))
			}
			for _, f := range c.flows {
				fams := []bool{false}
				if _, ok := podAddr4[f.src]; ok {
					if _, ok := podAddr4[f.dst]; ok {
						fams = []bool{false, true}
					}
				}
				for _, v6 := range fams {
					src, dst := f.addrs(v6)
					v := s.Explain(src, dst, f.proto, f.port)
					if v.Allowed != f.allowed {
						t.Errorf("Explain %s -> %s %d/%d: allowed=%v, want %v\n%s", src, dst, f.proto, f.port, v.Allowed, f.allowed, v)
					}
					if got := clusterAllows(s, nodeCIDRs, src, dst, f.proto, f.port); got != f.allowed {
						t.Errorf("Ruleset %s -> %s %d/%d: allowed=%v, want %v", src, dst, f.proto, f.port, got, f.allowed)
					}
				}
			}
		})
	}
}

// TestExplainReasons checks Explain says which policies isolate and which
// rule allowed.
func TestExplainReasons(t *testing.T) {
	s := testState()
	for _, p := range []*pol{
		policy("x", "deny", nil),
		policy("x", "web", map[string]string{"app": "a"}, ingress(ports(port("UDP", 53))), ingress(ports(port("TCP", "http")), podPeer(sel("app", "b")))),
	} {
		if err := s.SetPolicy(p); err != nil {
			t.Fatal(err)
		}
	}
	v := s.Explain(a("10.0.1.2"), a("10.0.1.1"), tcp, 80)
	if !v.Allowed || v.Egress.Pod != "x/b" || v.Ingress.Pod != "x/a" {
		t.Fatalf("verdict %+v", v)
	}
	if got := strings.Join(v.Ingress.Isolating, ","); got != "x/deny,x/web" {
		t.Errorf("isolating %q", got)
	}
	if got := strings.Join(v.Ingress.AllowedBy, ","); got != "x/web rule 1" {
		t.Errorf("allowed by %q", got)
	}
	if !strings.Contains(v.Egress.Reason, "no policy selects x/b for egress: allowed") {
		t.Errorf("egress reason %q", v.Egress.Reason)
	}
	v = s.Explain(a("10.0.2.2"), a("10.0.1.2"), tcp, 80)
	if v.Allowed || !strings.Contains(v.Ingress.Reason, "x/b isolated for ingress by x/deny; no rule allows 10.0.2.2 TCP port 80: denied") {
		t.Errorf("denied verdict %s", v)
	}
	v = s.Explain(a("8.8.8.8"), a("1.1.1.1"), udp, 53)
	if !v.Allowed || v.Egress.Pod != "" || !strings.Contains(v.Ingress.Reason, "no pod's address") {
		t.Errorf("outside verdict %s", v)
	}
}
