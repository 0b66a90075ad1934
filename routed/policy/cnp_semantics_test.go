package policy

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// cnpCase is one table case: NetworkPolicies and ClusterNetworkPolicies on
// the test cluster (cnpTestState), the flows and their verdicts. wantErr,
// when set, is a field path every refused ClusterNetworkPolicy's error
// must name.
type cnpCase struct {
	name    string
	nps     []*pol
	cnps    []*cnp
	flows   []flow
	wantErr string
}

// runCNPCases sets each case's objects and checks every flow against the
// compiled Rulesets (the AND of the nodes' Matchers), Explain and the
// oracle; a flow
// between two test pods runs in both families.
func runCNPCases(t *testing.T, cases []cnpCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := cnpTestState()
			for _, p := range c.nps {
				if err := s.SetPolicy(p); err != nil {
					t.Fatalf("SetPolicy %s: %v", p.Name, err)
				}
			}
			for _, p := range c.cnps {
				err := s.SetClusterPolicy(p)
				switch {
				case c.wantErr == "" && err != nil:
					t.Fatalf("SetClusterPolicy %s: %v", p.Name, err)
				case c.wantErr != "":
					var ce *ClusterPolicyError
					if !errors.As(err, &ce) || !strings.Contains(err.Error(), c.wantErr) || ce.Name != p.Name {
						t.Errorf("SetClusterPolicy %s: error %v, want a *ClusterPolicyError naming %q", p.Name, err, c.wantErr)
					}
				}
			}
			for n, cidrs := range nodeCIDRs {
				checkRuleset(t, s.Compile(n, cidrs))
			}
			var o *cnpOracle
			if c.wantErr == "" {
				o = newOracle(s, testNodes(), c.nps, c.cnps)
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
					proto := f.proto
					if v6 && proto == icmp {
						proto = icmp6
					}
					if got := clusterAllows(s, nodeCIDRs, src, dst, proto, f.port); got != f.allowed {
						t.Errorf("Ruleset %s -> %s %d/%d: allowed=%v, want %v", src, dst, proto, f.port, got, f.allowed)
					}
					if v := s.Explain(src, dst, proto, f.port); v.Allowed != f.allowed {
						t.Errorf("Explain %s -> %s %d/%d: allowed=%v, want %v\n%s", src, dst, proto, f.port, v.Allowed, f.allowed, v)
					}
					if o != nil {
						if got := o.allows(src, dst, proto, f.port); got != f.allowed || o.unsure {
							t.Errorf("oracle %s -> %s %d/%d: allowed=%v (unsure %v), want %v (the test is wrong)", src, dst, proto, f.port, got, o.unsure, f.allowed)
						}
					}
				}
			}
		})
	}
}

// TestCNPSemantics: the tiers, the peers, the protocols and the subjects
// of ClusterNetworkPolicy v1beta1, with NetworkPolicy between the tiers.
func TestCNPSemantics(t *testing.T) {
	all := sel()
	teamA, teamB, teamC := sel("team", "a"), sel("team", "b"), sel("team", "c")
	allowB := policy("x", "allow-b", map[string]string{"app": "a"}, ingress(nil, podPeer(sel("app", "b"))))
	denyX := policy("x", "deny", nil)
	runCNPCases(t, []cnpCase{
		{name: "no policy: everything allowed", flows: []flow{
			{"y/b", "x/a", tcp, 80, true}, {"x/a", "8.8.8.8", udp, 53, true},
		}},
		{name: "Admin Deny beats a NetworkPolicy allow", nps: []*pol{allowB}, cnps: []*cnp{
			cnpol("deny-b", admin, 10, subjNS(teamA), cin(deny, "no-b", nil, cPods(teamA, sel("app", "b")))),
		}, flows: []flow{
			{"x/b", "x/a", tcp, 80, false}, {"x/c", "x/a", tcp, 80, false}, {"x/a", "x/b", tcp, 80, true},
			{"y/b", "x/b", tcp, 80, true},
		}},
		{name: "Admin Accept beats a NetworkPolicy deny", nps: []*pol{denyX}, cnps: []*cnp{
			cnpol("from-b", admin, 10, subjNS(teamA), cin(accept, "", nil, cNS(teamB))),
		}, flows: []flow{
			{"y/a", "x/a", tcp, 80, true}, {"y/b", "x/b", udp, 53, true}, {"y/a", "x/c", icmp, 0, true},
			{"z/c", "x/a", tcp, 80, false}, {"x/b", "x/a", tcp, 80, false},
		}},
		{name: "Admin Pass hands over to NetworkPolicy, skipping the rest of the Admin tier", nps: []*pol{allowB}, cnps: []*cnp{
			cnpol("pass-a", admin, 10, subjNS(all), cin(pass, "", nil, cNS(teamA))),
			cnpol("deny-all", admin, 20, subjNS(all), cin(deny, "", nil, cNS(all))),
		}, flows: []flow{
			{"x/b", "x/a", tcp, 80, true},  // Pass, NP allows
			{"x/c", "x/a", tcp, 80, false}, // Pass, NP denies
			{"x/a", "x/b", tcp, 80, true},  // Pass, no NP, no Baseline
			{"y/a", "x/a", tcp, 80, false}, // not passed: Admin Deny
			{"x/a", "y/a", tcp, 80, true},  // Pass (source in team a) then allowed
		}},
		{name: "Pass with no NetworkPolicy goes to Baseline", cnps: []*cnp{
			cnpol("pass", admin, 10, subjNS(all), cin(pass, "", nil, cNS(all))),
			cnpol("base", baseline, 10, subjNS(all), cin(deny, "", nil, cNS(teamB))),
		}, flows: []flow{
			{"y/a", "x/a", tcp, 80, false}, {"x/b", "x/a", tcp, 80, true}, {"y/a", "y/b", tcp, 80, false},
		}},
		{name: "Baseline Deny only where no NetworkPolicy isolates that direction", nps: []*pol{
			allowB,
			policy("x", "eg-c", map[string]string{"app": "c"}, ptypes(pEgress), egress(nil, nsPeer(all))),
		}, cnps: []*cnp{
			cnpol("base-in", baseline, 5, subjNS(teamA), cin(deny, "", nil, cNS(all))),
		}, flows: []flow{
			{"x/b", "x/a", tcp, 80, true},  // NP isolates x/a: NP allows
			{"x/c", "x/a", tcp, 80, false}, // NP isolates x/a: NP denies
			{"y/a", "x/b", tcp, 80, false}, // x/b not isolated: Baseline
			{"y/a", "x/c", tcp, 80, false}, // x/c isolated for egress only: Baseline still judges ingress
			{"x/c", "y/a", tcp, 80, true},  // x/c egress: NP allows; y is not the subject
		}},
		{name: "Baseline egress Deny not stopped by NetworkPolicy ingress isolation", nps: []*pol{allowB}, cnps: []*cnp{
			cnpol("base-eg", baseline, 5, subjNS(teamA), ceg(deny, "", nil, cNS(teamC))),
		}, flows: []flow{
			{"x/a", "z/c", tcp, 80, false}, {"x/a", "y/a", tcp, 80, true}, {"x/b", "x/a", tcp, 80, true},
		}},
		{name: "Baseline Accept over Baseline Deny, NetworkPolicy over both", nps: []*pol{denyX}, cnps: []*cnp{
			cnpol("b1", baseline, 1, subjNS(all), cin(accept, "", nil, cNS(teamB))),
			cnpol("b2", baseline, 2, subjNS(all), cin(deny, "", nil, cNS(all))),
		}, flows: []flow{
			{"y/a", "z/c", tcp, 80, true}, {"x/a", "z/c", tcp, 80, false}, {"y/a", "x/a", tcp, 80, false},
		}},
		{name: "priority: lower first, whatever the names", cnps: []*cnp{
			cnpol("a-deny", admin, 20, subjNS(all), cin(deny, "", nil, cNS(all))),
			cnpol("z-accept", admin, 10, subjNS(all), cin(accept, "", nil, cNS(teamB))),
		}, flows: []flow{
			{"y/a", "x/a", tcp, 80, true}, {"z/c", "x/a", tcp, 80, false}, {"x/b", "x/a", tcp, 80, false},
		}},
		{name: "priority 0 and 1000", cnps: []*cnp{
			cnpol("last", admin, 1000, subjNS(all), cin(accept, "", nil, cNS(all))),
			cnpol("first", admin, 0, subjNS(all), cin(deny, "", nil, cNS(teamC))),
		}, flows: []flow{
			{"z/c", "x/a", tcp, 80, false}, {"y/a", "x/a", tcp, 80, true},
		}},
		{name: "same priority: ordered by name", cnps: []*cnp{
			cnpol("b-deny", admin, 10, subjNS(all), cin(deny, "", nil, cNS(all))),
			cnpol("a-accept", admin, 10, subjNS(all), cin(accept, "", nil, cNS(teamB))),
		}, flows: []flow{
			{"y/a", "x/a", tcp, 80, true}, {"z/c", "x/a", tcp, 80, false},
		}},
		{name: "rule order within a policy: Deny first", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(teamA),
				cin(deny, "deny-b", nil, cPods(all, sel("app", "b"))),
				cin(accept, "accept-all", nil, cNS(all))),
		}, nps: []*pol{denyX}, flows: []flow{
			{"x/b", "x/a", tcp, 80, false}, {"y/b", "x/a", tcp, 80, false}, {"x/c", "x/a", tcp, 80, true}, {"z/c", "x/a", tcp, 80, true},
		}},
		{name: "rule order within a policy: Accept first", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(teamA),
				cin(accept, "accept-all", nil, cNS(all)),
				cin(deny, "deny-b", nil, cPods(all, sel("app", "b")))),
		}, nps: []*pol{denyX}, flows: []flow{
			{"x/b", "x/a", tcp, 80, true}, {"y/b", "x/a", tcp, 80, true},
		}},
		{name: "egress Accept does not bypass the destination's ingress", nps: []*pol{denyX}, cnps: []*cnp{
			cnpol("eg", admin, 10, subjNS(teamB), ceg(accept, "", nil, cNS(all))),
		}, flows: []flow{
			{"y/a", "x/a", tcp, 80, false}, {"y/a", "z/c", tcp, 80, true},
		}},
		{name: "ingress Accept does not bypass the source's egress", nps: []*pol{
			policy("y", "no-egress", nil, ptypes(pEgress)),
		}, cnps: []*cnp{
			cnpol("in", admin, 10, subjNS(teamA), cin(accept, "", nil, cNS(all))),
		}, flows: []flow{
			{"y/a", "x/a", tcp, 80, false}, {"z/c", "x/a", tcp, 80, true},
		}},
		{name: "ingress Deny at the destination, egress Deny at the source", cnps: []*cnp{
			cnpol("in", admin, 10, subjNS(teamA), cin(deny, "", nil, cNS(teamC))),
			cnpol("eg", admin, 11, subjNS(teamB), ceg(deny, "", nil, cNS(teamA))),
		}, flows: []flow{
			{"z/c", "x/a", tcp, 80, false}, {"x/a", "z/c", tcp, 80, true}, {"y/a", "x/a", tcp, 80, false}, {"x/a", "y/a", tcp, 80, true},
		}},
		{name: "a policy without ingress rules does not affect ingress", nps: []*pol{denyX}, cnps: []*cnp{
			cnpol("eg-only", admin, 0, subjNS(all), ceg(accept, "", nil, cNS(all))),
			cnpol("base", baseline, 0, subjNS(teamB), cin(deny, "", nil, cNS(teamC))),
		}, flows: []flow{
			{"y/a", "x/a", tcp, 80, false}, // NetworkPolicy still judges x's ingress
			{"z/c", "y/a", tcp, 80, false}, // Baseline still judges y's ingress
			{"x/a", "y/a", tcp, 80, true},
		}},
		{name: "peer namespaces by kubernetes.io/metadata.name", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(all), cin(deny, "", nil, cNS(sel("kubernetes.io/metadata.name", "z")))),
		}, flows: []flow{
			{"z/c", "x/a", tcp, 80, false}, {"y/a", "x/a", tcp, 80, true},
		}},
		{name: "peer pods: namespace AND pod selector", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(all), cin(deny, "", nil, cPods(teamB, sel("app", "b")))),
		}, flows: []flow{
			{"y/b", "x/a", tcp, 80, false}, {"y/a", "x/a", tcp, 80, true}, {"x/b", "x/a", tcp, 80, true},
		}},
		{name: "peer pods: empty pod selector is every pod of the namespaces", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(all), cin(deny, "", nil, cPods(teamB, all))),
		}, flows: []flow{
			{"y/b", "x/a", tcp, 80, false}, {"y/a", "x/a", tcp, 80, false}, {"x/b", "x/a", tcp, 80, true},
		}},
		{name: "peer pods: several peers are OR", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(all), ceg(deny, "", nil, cPods(teamB, sel("app", "a")), cNS(teamC))),
		}, flows: []flow{
			{"x/a", "y/a", tcp, 80, false}, {"x/a", "z/c", tcp, 80, false}, {"x/a", "y/b", tcp, 80, true},
		}},
		{name: "peer networks, IPv4 and IPv6", cnps: []*cnp{
			cnpol("p", admin, 10, subjPods(teamA, sel("app", "a")), ceg(deny, "", nil, cNets("10.0.2.0/24", "fd00::2:0/112"))),
		}, flows: []flow{
			{"x/a", "x/c", tcp, 80, false}, {"x/a", "y/a", udp, 53, false}, {"x/a", "x/b", tcp, 80, true},
			{"10.0.1.1", "8.8.8.8", tcp, 443, true}, {"fd00::1:1", "fd00::2:99", tcp, 443, false},
			{"x/b", "x/c", tcp, 80, true}, // not the subject
		}},
		{name: "peer networks: 0.0.0.0/0 is IPv4 only, ::/0 IPv6 only", cnps: []*cnp{
			cnpol("v4", admin, 10, subjNS(teamA), ceg(deny, "", nil, cNets("0.0.0.0/0"))),
			cnpol("v6", admin, 11, subjNS(teamB), ceg(deny, "", nil, cNets("::/0"))),
		}, flows: []flow{
			{"10.0.1.1", "8.8.8.8", tcp, 443, false}, {"fd00::1:1", "2001:db8::1", tcp, 443, true},
			{"10.0.2.2", "8.8.8.8", tcp, 443, true}, {"fd00::2:2", "2001:db8::1", tcp, 443, false},
			{"10.0.1.1", "10.0.2.2", icmp, 0, false}, // pod to pod traffic too, ICMP too
			{"fd00::2:2", "fd00::1:1", icmp6, 0, false},
		}},
		{name: "peer networks: overlapping CIDRs in one peer, and across rules", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(teamA),
				ceg(accept, "", nil, cNets("10.0.2.0/25", "10.0.2.0/24", "10.0.2.3/32", "10.0.0.0/16", "10.0.2.0/26")),
				ceg(deny, "", nil, cNets("10.0.0.0/8", "10.0.2.0/24")),
				ceg(deny, "", nil, cNets("fd00::/16", "fd00::2:0/112", "fd00::2:1/128"))),
		}, flows: []flow{
			{"10.0.1.1", "10.0.2.200", tcp, 80, true}, {"10.0.1.1", "10.0.255.1", tcp, 80, true},
			{"10.0.1.1", "10.1.0.1", tcp, 80, false}, {"10.0.1.1", "8.8.8.8", tcp, 80, true},
			{"fd00::1:1", "fd00::2:1", tcp, 80, false}, {"fd00::1:1", "fd01::1", tcp, 80, true},
		}},
		{name: "peer nodes: the node's status addresses, by label", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(teamA), ceg(deny, "", nil, cNodes(sel("role", "control")))),
		}, flows: []flow{
			{"10.0.1.1", "192.168.0.2", tcp, 6443, false}, {"fd00::1:1", "fd00:ffff::2", tcp, 6443, false},
			{"10.0.1.1", "192.168.0.1", tcp, 6443, true}, {"10.0.1.1", "203.0.113.1", tcp, 6443, true},
			{"10.0.2.2", "192.168.0.2", tcp, 6443, true}, // not the subject
		}},
		{name: "peer nodes: empty selector is every node", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(teamA), ceg(deny, "", nil, cNodes(all))),
		}, flows: []flow{
			{"10.0.1.1", "192.168.0.2", tcp, 6443, false}, {"10.0.1.1", "203.0.113.1", tcp, 443, false},
			{"fd00::1:1", "fd00:ffff::1", tcp, 10250, false}, {"10.0.1.1", "8.8.8.8", tcp, 443, true},
		}},
		{name: "peer domainNames: refused, matches nothing", wantErr: "spec.egress[0].to[0].domainNames", nps: []*pol{
			policy("x", "no-egress", nil, ptypes(pEgress)),
		}, cnps: []*cnp{
			cnpol("dns", admin, 10, subjNS(teamA), ceg(accept, "", nil, cDomains("example.com"), cNets("8.8.8.8/32"))),
		}, flows: []flow{
			{"10.0.1.1", "93.184.215.14", tcp, 443, false}, {"10.0.1.1", "8.8.8.8", tcp, 443, true},
		}},
		{name: "protocols: tcp, udp, sctp numbers and ranges", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(teamA), cin(deny, "", protos(cTCP(cport(80)), cUDP(crange(50, 60)), cSCTP(cport(9999)), cTCP(crange(8000, 8010))), cNS(all))),
		}, flows: []flow{
			{"x/b", "x/a", tcp, 80, false}, {"x/b", "x/a", tcp, 81, true}, {"x/b", "x/a", udp, 80, true},
			{"x/b", "x/a", udp, 50, false}, {"x/b", "x/a", udp, 60, false}, {"x/b", "x/a", udp, 61, true}, {"x/b", "x/a", tcp, 53, true},
			{"x/b", "x/a", sctp, 9999, false}, {"x/b", "x/a", sctp, 9998, true}, {"x/b", "x/a", tcp, 9999, true},
			{"x/b", "x/a", tcp, 8000, false}, {"x/b", "x/a", tcp, 8010, false}, {"x/b", "x/a", tcp, 8011, true},
			{"x/b", "x/a", icmp, 0, true},
		}},
		{name: "no protocols: all traffic, ICMP too", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(teamA), cin(deny, "", nil, cNS(all))),
		}, flows: []flow{
			{"x/b", "x/a", icmp, 0, false}, {"x/b", "x/a", 47, 0, false}, {"x/b", "x/a", sctp, 1, false}, {"x/b", "x/a", udp, 65535, false},
		}},
		{name: "destinationNamedPort, ingress: the destination pod's container ports, any protocol", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(teamA), cin(deny, "", protos(cNamed("http"), cNamed("dns"), cNamed("sctp")), cNS(all))),
		}, flows: []flow{
			{"x/b", "x/a", tcp, 80, false}, {"x/b", "x/a", tcp, 8080, true}, {"y/a", "x/b", tcp, 8080, false},
			{"y/a", "x/b", tcp, 80, true}, {"x/a", "x/c", tcp, 81, false}, {"x/b", "x/a", udp, 53, false},
			{"x/b", "x/a", tcp, 53, true}, {"x/b", "x/a", sctp, 9999, false}, {"x/b", "x/a", udp, 80, true},
		}},
		{name: "destinationNamedPort, egress: resolved against the destination pod", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(teamB), ceg(deny, "", protos(cNamed("http")), cNS(all))),
		}, flows: []flow{
			{"y/a", "x/a", tcp, 80, false}, {"y/a", "x/b", tcp, 80, true}, {"y/a", "x/b", tcp, 8080, false},
			{"y/a", "x/c", tcp, 81, false}, {"y/a", "z/c", tcp, 80, true}, // z/c has no named port
			{"10.0.2.2", "192.168.0.1", tcp, 80, true}, // a hostNetwork pod's named port: not a pod
		}},
		{name: "destinationNamedPort naming no port matches nothing", nps: []*pol{denyX}, cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(teamA), cin(accept, "", protos(cNamed("nope")), cNS(all))),
		}, flows: []flow{
			{"x/b", "x/a", tcp, 80, false}, {"y/a", "x/a", tcp, 0, false},
		}},
		{name: "subject namespaces: every pod of them", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(teamA), cin(deny, "", nil, cNS(teamB))),
		}, flows: []flow{
			{"y/a", "x/a", tcp, 80, false}, {"y/a", "x/b", tcp, 80, false}, {"y/a", "x/c", tcp, 80, false}, {"y/a", "z/c", tcp, 80, true},
		}},
		{name: "subject pods: namespace AND pod selector", cnps: []*cnp{
			cnpol("p", admin, 10, subjPods(teamA, sel("app", "a")), cin(deny, "", nil, cNS(teamB))),
		}, flows: []flow{
			{"y/a", "x/a", tcp, 80, false}, {"y/a", "x/b", tcp, 80, true}, {"z/c", "x/a", tcp, 80, true},
			{"x/b", "y/a", tcp, 80, true}, // y/a has app=a but is in team b
		}},
		{name: "subject pods: empty selectors select every pod", cnps: []*cnp{
			cnpol("p", admin, 10, subjPods(all, all), cin(deny, "", nil, cNS(teamB))),
		}, flows: []flow{
			{"y/a", "x/a", tcp, 80, false}, {"y/a", "z/c", tcp, 80, false}, {"y/a", "y/b", tcp, 80, false},
		}},
		{name: "hostNetwork pods are never subjects", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(all), ceg(deny, "", nil, cNets("0.0.0.0/0", "::/0")), cin(deny, "", nil, cNS(all))),
		}, flows: []flow{
			{"192.168.0.1", "8.8.8.8", tcp, 443, true}, {"8.8.8.8", "192.168.0.2", tcp, 22, true},
			{"10.0.1.1", "8.8.8.8", tcp, 443, false},
		}},
		{name: "hostNetwork pods are never namespaces or pods peers", cnps: []*cnp{
			cnpol("p", admin, 10, subjNS(teamB), cin(deny, "", nil, cPods(teamA, sel("app", "a")))),
		}, flows: []flow{
			{"192.168.0.1", "10.0.2.2", tcp, 80, true}, // x/host1, labelled app=a
			{"x/a", "y/a", tcp, 80, false},
		}},
		{name: "a pod reaching itself is allowed", cnps: []*cnp{
			cnpol("p", admin, 0, subjNS(all), cin(deny, "", nil, cNS(all)), ceg(deny, "", nil, cNS(all))),
		}, flows: []flow{
			{"x/a", "x/a", tcp, 80, true}, {"x/a", "x/b", tcp, 80, false},
		}},
		{name: "Pass through every tier: Admin Pass, no NetworkPolicy, Baseline Pass, allowed", cnps: []*cnp{
			cnpol("a-pass", admin, 0, subjNS(all), cin(pass, "", nil, cNS(all))),
			cnpol("a-deny", admin, 1, subjNS(all), cin(deny, "", nil, cNS(all))),
			cnpol("b-pass", baseline, 0, subjNS(all), cin(pass, "", nil, cNS(all))),
			cnpol("b-deny", baseline, 1, subjNS(all), cin(deny, "", nil, cNS(all))),
		}, flows: []flow{
			{"y/a", "x/a", tcp, 80, true}, {"z/c", "y/b", udp, 53, true}, {"8.8.8.8", "x/a", tcp, 80, true},
		}},
		{name: "dual-stack: a dual-stack pod judged in each family", cnps: []*cnp{
			cnpol("v6-only", admin, 10, subjNS(teamA), ceg(deny, "", nil, cNets("fd00::2:0/112"))),
		}, flows: []flow{
			{"10.0.1.1", "10.0.2.1", tcp, 80, true}, {"fd00::1:1", "fd00::2:1", tcp, 80, false},
		}},
	})
}

// TestCNPNodeChanges: a nodes peer follows the Node objects: labels and
// addresses set, changed and deleted.
func TestCNPNodeChanges(t *testing.T) {
	s := testState()
	n1 := Node{Name: "n1", Labels: map[string]string{"role": "worker"}, IPs: []netip.Addr{a("192.168.0.1")}}
	if s.SetNode(n1) {
		t.Errorf("SetNode without a nodes peer: a Ruleset can change")
	}
	if err := s.SetClusterPolicy(cnpol("p", admin, 0, subjNS(sel()), ceg(deny, "", nil, cNodes(sel("role", "control"))))); err != nil {
		t.Fatal(err)
	}
	check := func(dst string, want bool) {
		t.Helper()
		if got := clusterAllows(s, nodeCIDRs, a("10.0.1.1"), a(dst), tcp, 443); got != want {
			t.Errorf("x/a -> %s: allowed=%v, want %v", dst, got, want)
		}
	}
	check("192.168.0.1", true)
	n1.Labels = map[string]string{"role": "control"}
	if !s.SetNode(n1) {
		t.Errorf("relabelled node: no change reported")
	}
	check("192.168.0.1", false)
	n1.IPs = []netip.Addr{a("192.168.0.11"), a("::ffff:192.168.0.12")}
	if !s.SetNode(n1) {
		t.Errorf("readdressed node: no change reported")
	}
	if s.SetNode(n1) {
		t.Errorf("the same node again: a change reported")
	}
	check("192.168.0.1", true)
	check("192.168.0.11", false)
	check("192.168.0.12", false)
	if !s.DeleteNode("n1") {
		t.Errorf("DeleteNode: no change reported")
	}
	check("192.168.0.11", true)
	if s.DeleteNode("n1") {
		t.Errorf("DeleteNode of a missing node: a change reported")
	}
}

// TestCNPDelete: a deleted ClusterNetworkPolicy stops applying; the
// refused list follows.
func TestCNPDelete(t *testing.T) {
	s := cnpTestState()
	if err := s.SetClusterPolicy(cnpol("p", admin, 0, subjNS(sel()), cin(deny, "", nil, cNS(sel())))); err != nil {
		t.Fatal(err)
	}
	if s.SetClusterPolicy(cnpol("zz-bad", "Tier0", 0, subjNS(sel()), cin(pass, "", nil, cNS(sel())))) == nil {
		t.Fatal("no error for tier Tier0")
	}
	if s.ClusterPolicies() != 2 || len(s.RefusedClusterPolicies()) != 1 || s.RefusedClusterPolicies()["zz-bad"] == nil {
		t.Errorf("%d policies, refused %v", s.ClusterPolicies(), s.RefusedClusterPolicies())
	}
	if clusterAllows(s, nodeCIDRs, a("10.0.2.2"), a("10.0.1.1"), tcp, 80) {
		t.Errorf("allowed under Deny")
	}
	s.DeleteClusterPolicy("p")
	s.DeleteClusterPolicy("zz-bad")
	if !clusterAllows(s, nodeCIDRs, a("10.0.2.2"), a("10.0.1.1"), tcp, 80) || s.ClusterPolicies() != 0 || len(s.RefusedClusterPolicies()) != 0 {
		t.Errorf("deleted policies still apply")
	}
	for n, c := range nodeCIDRs {
		if rs := s.Compile(n, c); len(rs.Pods)+len(rs.Policies) != 0 {
			t.Errorf("node %s: chains left: %+v", n, rs)
		}
	}
}
