package policy

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"math/bits"
	"net/netip"
	"slices"

	"k8s.io/apimachinery/pkg/labels"
)

// entry is a pod as the compiler and Explain see it: its addresses are
// those it owns (an address two pods claim goes to one of them:
// resolveClaims).
type entry struct {
	pod *Pod
	ips []netip.Addr
	// idx are the positions of ips in index.addrs.
	idx []int32
}

// index is built at the start of each Compile or Explain: the pods that
// have addresses, by namespace and by label, and who owns each address.
type index struct {
	s      *State
	owner  map[netip.Addr]*entry
	byNS   map[string]*nsIndex
	nsList []string // every namespace with a Namespace object or a pod
	// named: the addresses of the pods with a named port, by name and
	// protocol.
	named map[namedKey][]addrPort
	// caches for this compile
	nsCache   map[string][]string // namespace selector -> namespaces
	peerCache map[string][]uint64 // parsedPeer.cacheKey -> bitset over addrs
	// addrs are every owned address, sorted: a set of pods is a bitset
	// over it, turned into merged ranges by one walk, no sort.
	addrs []netip.Addr
	// clashes are the addresses two or more pods claim.
	clashes []Clash
}

type nsIndex struct {
	pods    []*entry
	byLabel map[string]map[string][]int32 // key -> value -> positions in pods
}

type namedKey struct {
	name  string
	proto uint8
}

type addrPort struct {
	addr netip.Addr
	port uint16
}

// index returns the index of the current objects.
func (s *State) index() *index {
	if s.ix == nil {
		s.ix = s.buildIndex()
	}
	return s.ix
}

func (s *State) buildIndex() *index {
	ix := &index{s: s, owner: map[netip.Addr]*entry{}, byNS: map[string]*nsIndex{},
		named: map[namedKey][]addrPort{}, nsCache: map[string][]string{}, peerCache: map[string][]uint64{}}
	keys := make([]string, 0, len(s.pods))
	for k, p := range s.pods {
		if !p.HostNetwork && len(p.IPs) > 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	// who claims each address: the first pod, and every pod of the rare
	// address more than one claims
	winner := make(map[netip.Addr]*Pod, len(keys)*2)
	var contested map[netip.Addr][]*Pod
	for _, k := range keys {
		p := s.pods[k]
		for _, a := range p.IPs {
			first, taken := winner[a]
			switch {
			case !taken:
				winner[a] = p
			case first == p: // an address listed twice
			case contested == nil || contested[a] == nil:
				if contested == nil {
					contested = map[netip.Addr][]*Pod{}
				}
				contested[a] = []*Pod{first, p}
			case !slices.Contains(contested[a], p):
				contested[a] = append(contested[a], p)
			}
		}
	}
	ix.resolveClaims(contested, winner)
	for _, k := range keys {
		p := s.pods[k]
		e := &entry{pod: p}
		for _, a := range p.IPs {
			if winner[a] == p {
				ix.owner[a] = e
				e.ips = append(e.ips, a)
			}
		}
		if len(e.ips) == 0 {
			continue
		}
		n := ix.byNS[p.Namespace]
		if n == nil {
			n = &nsIndex{byLabel: map[string]map[string][]int32{}}
			ix.byNS[p.Namespace] = n
		}
		pos := int32(len(n.pods))
		n.pods = append(n.pods, e)
		for lk, lv := range p.Labels {
			m := n.byLabel[lk]
			if m == nil {
				m = map[string][]int32{}
				n.byLabel[lk] = m
			}
			m[lv] = append(m[lv], pos)
		}
		for _, np := range p.Ports {
			nk := namedKey{np.Name, np.Protocol}
			for _, a := range e.ips {
				ix.named[nk] = append(ix.named[nk], addrPort{a, np.Port})
			}
		}
	}
	for a := range ix.owner {
		ix.addrs = append(ix.addrs, a)
	}
	slices.SortFunc(ix.addrs, netip.Addr.Compare)
	pos := make(map[netip.Addr]int32, len(ix.addrs))
	for i, a := range ix.addrs {
		pos[a] = int32(i)
	}
	for _, n := range ix.byNS {
		for _, e := range n.pods {
			for _, a := range e.ips {
				e.idx = append(e.idx, pos[a])
			}
		}
	}
	for _, l := range ix.named {
		slices.SortFunc(l, func(x, y addrPort) int { return x.addr.Compare(y.addr) })
	}
	for ns := range s.namespaces {
		ix.nsList = append(ix.nsList, ns)
	}
	for ns := range ix.byNS {
		if _, ok := s.namespaces[ns]; !ok {
			ix.nsList = append(ix.nsList, ns)
		}
	}
	slices.Sort(ix.nsList)
	return ix
}

// selectIn returns the pods of namespace ns that sel selects (nil sel:
// all of them), in namespace/name order.
func (ix *index) selectIn(ns string, sel labels.Selector) []*entry {
	n := ix.byNS[ns]
	if n == nil {
		return nil
	}
	if sel == nil || sel.Empty() {
		return n.pods
	}
	// start from the smallest posting list of an equality requirement
	var best []int32
	found := false
	reqs, _ := sel.Requirements()
	for _, r := range reqs {
		switch r.Operator() {
		case "=", "==", "in":
		default:
			continue
		}
		vals := r.Values().UnsortedList()
		var cand []int32
		for _, v := range vals {
			cand = append(cand, n.byLabel[r.Key()][v]...)
		}
		if len(vals) > 1 {
			slices.Sort(cand)
			cand = slices.Compact(cand)
		}
		if !found || len(cand) < len(best) {
			best, found = cand, true
		}
	}
	var out []*entry
	if found {
		for _, i := range best {
			e := n.pods[i]
			if sel.Matches(labels.Set(e.pod.Labels)) {
				out = append(out, e)
			}
		}
		return out
	}
	for _, e := range n.pods {
		if sel.Matches(labels.Set(e.pod.Labels)) {
			out = append(out, e)
		}
	}
	return out
}

// namespaces returns the namespaces a peer designates.
func (ix *index) namespaces(policyNS string, p *parsedPeer) []string {
	if p.nsSel == nil {
		return []string{policyNS}
	}
	key := p.nsSel.String()
	if p.nsSel.Empty() {
		return ix.nsList
	}
	if got, ok := ix.nsCache[key]; ok {
		return got
	}
	var out []string
	for _, ns := range ix.nsList {
		if p.nsSel.Matches(labels.Set(ix.s.nsLabels(ns))) {
			out = append(out, ns)
		}
	}
	ix.nsCache[key] = out
	return out
}

// peerBits is the set of the addresses of the pods a selector peer
// selects, as a bitset over addrs. The result is shared: do not modify.
func (ix *index) peerBits(policyNS string, p *parsedPeer) []uint64 {
	key := p.cacheKey
	if got, ok := ix.peerCache[key]; ok {
		return got
	}
	set := make([]uint64, (len(ix.addrs)+63)/64)
	for _, ns := range ix.namespaces(policyNS, p) {
		for _, e := range ix.selectIn(ns, p.podSel) {
			for _, i := range e.idx {
				set[i/64] |= 1 << (i % 64)
			}
		}
	}
	ix.peerCache[key] = set
	return set
}

// ranges turns a bitset over addrs into merged ranges.
func (ix *index) ranges(set []uint64) []Range {
	n := 0
	for _, word := range set {
		n += bits.OnesCount64(word)
	}
	if n == 0 {
		return nil
	}
	out := make([]Range, 0, n)
	for w, word := range set {
		for word != 0 {
			b := bits.TrailingZeros64(word)
			word &= word - 1
			a := ix.addrs[w*64+b]
			if n := len(out); n > 0 && !lastOfFamily(out[n-1].To) && out[n-1].To.Next() == a {
				out[n-1].To = a
				continue
			}
			out = append(out, single(a))
		}
	}
	return out
}

// Compile returns the Ruleset of node: its pods' isolation and the rules of
// the policies that select them. localPodCIDRs are the node's PodCIDRs.
// Refused policies isolate and allow nothing (SetPolicy's error says why).
func (s *State) Compile(node string, localPodCIDRs []netip.Prefix) Ruleset {
	ix := s.index()
	rs := Ruleset{}
	for _, c := range localPodCIDRs {
		if c.IsValid() {
			rs.LocalPodCIDRs = append(rs.LocalPodCIDRs, c.Masked())
		}
	}
	slices.SortFunc(rs.LocalPodCIDRs, func(a, b netip.Prefix) int {
		return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
	})
	rs.LocalPodCIDRs = slices.Compact(rs.LocalPodCIDRs)

	// local pods, in namespace/name order (the index order)
	type local struct {
		e        *entry
		chains   [2][]string
		isolated [2]bool
	}
	locals := map[*entry]*local{}
	var order []*local
	nsNames := make([]string, 0, len(ix.byNS))
	for ns := range ix.byNS {
		nsNames = append(nsNames, ns)
	}
	slices.Sort(nsNames)
	for _, ns := range nsNames {
		for _, e := range ix.byNS[ns].pods {
			if e.pod.Node == node {
				l := &local{e: e}
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

	ids := newIDs()
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
		var selected []*local
		for _, e := range ix.selectIn(pp.namespace, pp.selector) {
			if l := locals[e]; l != nil {
				selected = append(selected, l)
			}
		}
		if len(selected) == 0 {
			continue
		}
		for d := range 2 {
			if !pp.types[d] {
				continue
			}
			pc := PolicyChain{
				ID:        ids.id(pp.namespace + "/" + pp.name + "/" + string(dirs[d])),
				Namespace: pp.namespace,
				Name:      pp.name,
				Direction: dirs[d],
			}
			var targets []*entry
			if d == dirIn {
				for _, l := range selected {
					targets = append(targets, l.e)
				}
			}
			for i := range pp.rules[d] {
				pc.Rules = append(pc.Rules, ix.compileRule(pp.namespace, &pp.rules[d][i], d, targets))
			}
			rs.Policies = append(rs.Policies, pc)
			for _, l := range selected {
				l.isolated[d] = true
				l.chains[d] = append(l.chains[d], pc.ID)
			}
		}
	}
	for _, l := range order {
		if !l.isolated[dirIn] && !l.isolated[dirEg] {
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
		})
	}
	return rs
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

// compileRule compiles one rule. targets are the local pods the policy
// selects, for an ingress rule's named ports.
func (ix *index) compileRule(policyNS string, r *parsedRule, d int, targets []*entry) Rule {
	out := Rule{AnyPeer: r.anyPeer, AnyPort: r.anyPort}
	if !r.anyPeer {
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
		out.Peers = unionRanges(r.blocks, ix.ranges(set))
	}
	if r.anyPort {
		return out
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
		for _, ap := range ix.named[namedKey{p.name, p.proto}] {
			if r.anyPeer || rangesContain(out.Peers, ap.addr) {
				boxes = append(boxes, portBox{addrs: single(ap.addr), proto: p.proto, from: ap.port, to: ap.port})
			}
		}
	}
	out.Ports = disjointPorts(boxes)
	return out
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
