package policy

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"slices"
)

// Compile returns the Ruleset of node: its pods' isolation and the rules of
// the policies that select them. localPodCIDRs are the node's PodCIDRs.
// Refused policies isolate and allow nothing (SetPolicy's error says why).
func (s *State) Compile(node string, localPodCIDRs []netip.Prefix) Ruleset {
	ix := s.index()
	rs := Ruleset{LocalPodCIDRs: normalCIDRs(localPodCIDRs)}
	locals, order := s.localPods(ix, node, &rs)
	ids := newIDs()
	s.policyChains(ix, ids, locals, &rs)
	s.clusterChains(ix, ids, order, &rs)
	for _, l := range order {
		if !l.isolated[dirIn] && !l.isolated[dirEg] && !l.tiered() {
			continue
		}
		p := l.e.pod
		routed, bridged := s.localPorts(p.Key())
		rs.Pods = append(rs.Pods, PodChains{
			ID:              ids.id(p.Namespace + "/" + p.Name),
			Namespace:       p.Namespace,
			Name:            p.Name,
			Addrs:           slices.Clone(l.e.ips),
			Ports:           routed,
			BridgePorts:     bridged,
			IngressIsolated: l.isolated[dirIn],
			Ingress:         l.chains[dirIn],
			EgressIsolated:  l.isolated[dirEg],
			Egress:          l.chains[dirEg],
			Admin:           l.tiers[0],
			Baseline:        l.tiers[1],
		})
	}
	return rs
}

// normalCIDRs are the valid ones of cidrs, masked, sorted, without
// duplicates.
func normalCIDRs(cidrs []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, c := range cidrs {
		if c.IsValid() {
			out = append(out, c.Masked())
		}
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	return slices.Compact(out)
}

// localPod is a pod of the compiled node, with the chains of the policies
// that select it by direction, and whether one isolates it.
type localPod struct {
	e        *entry
	chains   [2][]string
	isolated [2]bool
	// tiers are the ClusterNetworkPolicy chains that select the pod:
	// [0] Admin, [1] Baseline, each by direction, in evaluation order.
	tiers [2][2][]string
}

// localPods returns the pods of node, by entry and in namespace/name
// order (the index order), and puts their addresses and ports in rs.
func (s *State) localPods(ix *index, node string, rs *Ruleset) (map[*entry]*localPod, []*localPod) {
	locals := map[*entry]*localPod{}
	var order []*localPod
	nsNames := make([]string, 0, len(ix.byNS))
	for ns := range ix.byNS {
		nsNames = append(nsNames, ns)
	}
	slices.Sort(nsNames)
	for _, ns := range nsNames {
		for _, e := range ix.byNS[ns].pods {
			if e.pod.Node == node {
				l := &localPod{e: e}
				locals[e] = l
				order = append(order, l)
				rs.Known = append(rs.Known, e.ips...)
				routed, bridged := s.localPorts(e.pod.Key())
				rs.Ports = append(rs.Ports, routed...)
				rs.BridgePorts = append(rs.BridgePorts, bridged...)
			}
		}
	}
	slices.SortFunc(rs.Known, netip.Addr.Compare)
	slices.Sort(rs.Ports)
	rs.Ports = slices.Compact(rs.Ports)
	slices.Sort(rs.BridgePorts)
	rs.BridgePorts = slices.Compact(rs.BridgePorts)
	return locals, order
}

// policyChains compiles, in policy key order, a chain per direction of
// each policy that selects local pods into rs, and marks those pods
// isolated by it.
func (s *State) policyChains(ix *index, ids *idSet, locals map[*entry]*localPod, rs *Ruleset) {
	pkeys := make([]string, 0, len(s.policies))
	for k := range s.policies {
		pkeys = append(pkeys, k)
	}
	slices.Sort(pkeys)
	for _, k := range pkeys {
		pp := s.policies[k]
		if pp.selector == nil {
			continue
		}
		var selected []*localPod
		for _, e := range ix.selectIn(pp.namespace, pp.selector) {
			if l := locals[e]; l != nil {
				selected = append(selected, l)
			}
		}
		if len(selected) == 0 {
			continue
		}
		targets := make([]*entry, len(selected))
		for i, l := range selected {
			targets[i] = l.e
		}
		for d := range 2 {
			if !pp.types[d] {
				continue
			}
			pc := npChain(ix, ids.id(pp.namespace+"/"+pp.name+"/"+string(dirs[d])), pp, d, targets)
			rs.Policies = append(rs.Policies, pc)
			for _, l := range selected {
				l.isolated[d] = true
				l.chains[d] = append(l.chains[d], pc.ID)
			}
		}
	}
}

// npChain compiles NetworkPolicy pp's chain for direction d (ID id);
// selected are the local pods it selects (an ingress rule's named ports
// resolve against them).
func npChain(src peerSource, id string, pp *parsedPolicy, d int, selected []*entry) PolicyChain {
	pc := PolicyChain{ID: id, Namespace: pp.namespace, Name: pp.name, Direction: dirs[d]}
	var targets []*entry
	if d == dirIn {
		targets = selected
	}
	for i := range pp.rules[d] {
		pc.Rules = append(pc.Rules, compileRule(src, pp.namespace, &pp.rules[d][i], d, targets))
	}
	return pc
}

// tiered tells whether a ClusterNetworkPolicy selects the pod.
func (l *localPod) tiered() bool {
	for _, t := range l.tiers {
		if len(t[0])+len(t[1]) > 0 {
			return true
		}
	}
	return false
}

// clusterChains compiles a chain per direction of each
// ClusterNetworkPolicy that selects local pods and has rules for that
// direction (one without ingress rules does not affect ingress), in
// evaluation order, into rs, and adds it to those pods' tier lists.
func (s *State) clusterChains(ix *index, ids *idSet, order []*localPod, rs *Ruleset) {
	for ti, t := range []Tier{TierAdmin, TierBaseline} {
		for _, c := range s.sortedCNPs(t) {
			var selected []*localPod
			for _, l := range order {
				if c.selectsPod(s, l.e.pod) {
					selected = append(selected, l)
				}
			}
			if len(selected) == 0 {
				continue
			}
			targets := make([]*entry, len(selected))
			for i, l := range selected {
				targets[i] = l.e
			}
			for d := range 2 {
				if len(c.rules[d]) == 0 {
					continue
				}
				// "/name/dir": no NetworkPolicy's key (its namespace is
				// never empty) nor pod's is that
				pc := s.cnpChain(ix, ids.id("/"+c.name+"/"+string(dirs[d])), c, d, targets)
				rs.Policies = append(rs.Policies, pc)
				for _, l := range selected {
					l.tiers[ti][d] = append(l.tiers[ti][d], pc.ID)
				}
			}
		}
	}
}

// cnpChain compiles ClusterNetworkPolicy c's chain for direction d (ID
// id); selected are the local pods it selects.
func (s *State) cnpChain(src peerSource, id string, c *parsedCNP, d int, selected []*entry) PolicyChain {
	pc := PolicyChain{ID: id, Name: c.name, Direction: dirs[d], Tier: c.tier, Priority: c.priority}
	var targets []*entry
	if d == dirIn {
		targets = selected
	}
	for i := range c.rules[d] {
		r := &c.rules[d][i]
		cr := compileRule(src, "", &r.parsedRule, d, targets)
		if len(r.nodes) > 0 {
			cr.Peers = unionRanges(cr.Peers, s.nodeRanges(r.nodes))
		}
		cr.Action, cr.Name = r.action, r.name
		pc.Rules = append(pc.Rules, cr)
	}
	return pc
}

// localPorts are the names of pod key's routed host veths and bridge
// ports on this node, sorted.
func (s *State) localPorts(key string) (routed, bridged []string) {
	for _, p := range s.ports[key] {
		if p.Bridged {
			bridged = append(bridged, p.Name)
		} else {
			routed = append(routed, p.Name)
		}
	}
	slices.Sort(routed)
	slices.Sort(bridged)
	return slices.Compact(routed), slices.Compact(bridged)
}

// peerSource is where a rule's compile finds the addresses of the pods
// its selector peers select and the pods' named ports: the index of a
// whole compile, or Incremental's, kept change by change.
type peerSource interface {
	// selectorRanges are the owned addresses of the pods r's selector
	// peers select, merged (ipBlocks aside).
	selectorRanges(policyNS string, r *parsedRule) []Range
	// namedPorts calls f for each address of a pod with a container port
	// of name and protocol k, and that port.
	namedPorts(k namedKey, f func(netip.Addr, uint16))
}

func (ix *index) selectorRanges(policyNS string, r *parsedRule) []Range {
	var set []uint64
	for i := range r.peers {
		if r.peers[i].isBlock {
			continue
		}
		pb := ix.peerBits(policyNS, &r.peers[i])
		if set == nil {
			set = slices.Clone(pb)
			continue
		}
		for w := range set {
			set[w] |= pb[w]
		}
	}
	return ix.ranges(set)
}

func (ix *index) namedPorts(k namedKey, f func(netip.Addr, uint16)) {
	for _, ap := range ix.named[k] {
		f(ap.addr, ap.port)
	}
}

// compileRule compiles one rule. targets are the local pods the policy
// selects, for an ingress rule's named ports.
func compileRule(src peerSource, policyNS string, r *parsedRule, d int, targets []*entry) Rule {
	out := Rule{AnyPeer: r.anyPeer, AnyPort: r.anyPort}
	if !r.anyPeer {
		out.Peers = unionRanges(r.blocks, src.selectorRanges(policyNS, r))
	}
	out.Ports = rulePorts(src, r, d, targets, out.Peers)
	return out
}

// rulePorts are what r's ports allow (nil for any port): numbered ports
// for every address, named ports resolved against the packet's
// destination (targets for ingress, the pods among peers for egress).
func rulePorts(src peerSource, r *parsedRule, d int, targets []*entry, peers []Range) []PortRange {
	if r.anyPort {
		return nil
	}
	var boxes []portBox
	for _, p := range r.ports {
		if p.name == "" {
			boxes = append(boxes,
				portBox{addrs: fullRange(true), proto: p.proto, from: p.from, to: p.to},
				portBox{addrs: fullRange(false), proto: p.proto, from: p.from, to: p.to})
			continue
		}
		// a named port resolves against the packet's destination: the
		// selected pod for ingress, the peer pod for egress
		if d == dirIn {
			for _, e := range targets {
				for _, np := range e.pod.Ports {
					if np.Name == p.name && np.Protocol == p.proto {
						for _, a := range e.ips {
							boxes = append(boxes, portBox{addrs: single(a), proto: p.proto, from: np.Port, to: np.Port})
						}
					}
				}
			}
			continue
		}
		src.namedPorts(namedKey{p.name, p.proto}, func(a netip.Addr, port uint16) {
			if r.anyPeer || rangesContain(peers, a) {
				boxes = append(boxes, portBox{addrs: single(a), proto: p.proto, from: port, to: port})
			}
		})
	}
	return disjointPorts(boxes)
}

// ids hands out short stable IDs: the first 12 hex digits of the SHA-256 of
// the object's key, longer in the (astronomically rare) case two keys of
// one Ruleset share them.
type idSet struct{ used map[string]string }

func newIDs() *idSet { return &idSet{used: map[string]string{}} }

func (s *idSet) id(key string) string {
	sum := sha256.Sum256([]byte(key))
	h := hex.EncodeToString(sum[:])
	for n := 12; n <= len(h); n += 4 {
		id := h[:n]
		if k, ok := s.used[id]; !ok || k == key {
			s.used[id] = key
			return id
		}
	}
	return h
}

// PodID is the ID of a pod's chains (without collision handling).
func PodID(namespace, name string) string { return shortID(namespace + "/" + name) }

// PolicyID is the ID of a policy's chain for one direction (without
// collision handling).
func PolicyID(namespace, name string, d Direction) string {
	return shortID(namespace + "/" + name + "/" + string(d))
}

func shortID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:6])
}
