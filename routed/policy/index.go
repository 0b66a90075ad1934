// The index of the objects a Compile or Explain reads: the pods that have
// addresses, by namespace and by label, who owns each address, and the
// selections of peers as bitsets over the owned addresses.

package policy

import (
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

// buildIndex indexes the pods with addresses and the arriving ones (an
// entry without addresses: a pod of the compiled node gets its chains
// before its addresses) in namespace/name order, and every namespace.
func (s *State) buildIndex() *index {
	ix := &index{s: s, owner: map[netip.Addr]*entry{}, byNS: map[string]*nsIndex{},
		named: map[namedKey][]addrPort{}, nsCache: map[string][]string{}, peerCache: map[string][]uint64{}}
	keys := make([]string, 0, len(s.pods))
	for k, p := range s.pods {
		if !p.HostNetwork && (len(p.IPs) > 0 || arriving(p)) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	winner, contested := s.claims(keys)
	ix.resolveClaims(contested, winner)
	for _, k := range keys {
		ix.addPod(s.pods[k], winner)
	}
	ix.positions()
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

// claims says who claims each address of the pods of keys (in that
// order): the first pod in winner, and every pod of the rare address more
// than one claims in contested (nil when there is none).
func (s *State) claims(keys []string) (map[netip.Addr]*Pod, map[netip.Addr][]*Pod) {
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
	return winner, contested
}

// addPod indexes pod p with the addresses it won (none: it is left out):
// as their owner, in its namespace by label, and its named ports.
func (ix *index) addPod(p *Pod, winner map[netip.Addr]*Pod) {
	e := &entry{pod: p}
	for _, a := range p.IPs {
		if winner[a] == p {
			ix.owner[a] = e
			e.ips = append(e.ips, a)
		}
	}
	if len(e.ips) == 0 && !arriving(p) {
		return
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

// positions sorts the owned addresses into addrs, gives each entry the
// positions of its addresses there, and sorts the named ports by address.
func (ix *index) positions() {
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
