package desired

import (
	"net/netip"
	"slices"
)

// Plan is the desired state kept per node, so that a change to one remote
// Node is turned into the few routes and VXLAN entries it changes, at a
// cost that does not grow with the cluster. NewPlan is the full
// computation (the same as Compute); Update is the per-Node step.
type Plan struct {
	cfg    Config
	onLink OnLink
	// v is the last full validation, kept current by Update: its
	// refusals, conflicts and what one Node is judged against
	v      Validation
	byNode map[string]Contribution
	// how many Nodes want each destination and each FDB entry: one
	// claimed by two Nodes (a PodCIDR handed from one Node to another,
	// two Nodes with one address) cannot be patched one Node at a time
	routeClaims map[netip.Prefix]int
	fdbClaims   map[FDB]int
	// how many Nodes with a route have each address (the tunnel filter's
	// peers)
	peerClaims map[netip.Addr]int
	routes     int // remote routes
	blackholes int
	skipped    int
	// refusalChanges are the Nodes whose refusal began, changed or ended
	// since the last TakeRefusalChanges
	refusalChanges map[string]bool
}

// Delta is what one Update changes. Remove holds destinations no Node
// wants any more; SetNeighbors and AddFDBs may rewrite an entry that is
// already there (a neighbor whose MAC changed).
type Delta struct {
	Upsert       []Route
	Remove       []Route
	SetNeighbors []Neighbor
	DelNeighbors []Neighbor
	AddFDBs      []FDB
	DelFDBs      []FDB
	// The tunnel filter's changes: the addresses of Nodes this node now
	// routes to (AddPeers, written before the routes) or no longer does
	// (DelPeers, after), and their PodCIDRs.
	AddPeers  []netip.Addr
	DelPeers  []netip.Addr
	AddRemote []netip.Prefix
	DelRemote []netip.Prefix
}

// Merge appends o, the delta of a later Update, to d. A peer or PodCIDR d
// removes and o adds back (an address or PodCIDR handed from one Node to
// another) is not removed: AddPeers are written before DelPeers.
func (d *Delta) Merge(o Delta) {
	d.Upsert = append(d.Upsert, o.Upsert...)
	d.Remove = append(d.Remove, o.Remove...)
	d.SetNeighbors = append(d.SetNeighbors, o.SetNeighbors...)
	d.DelNeighbors = append(d.DelNeighbors, o.DelNeighbors...)
	d.AddFDBs = append(d.AddFDBs, o.AddFDBs...)
	d.DelFDBs = append(d.DelFDBs, o.DelFDBs...)
	d.AddPeers = append(d.AddPeers, o.AddPeers...)
	d.AddRemote = append(d.AddRemote, o.AddRemote...)
	d.DelPeers = append(slices.DeleteFunc(d.DelPeers, func(a netip.Addr) bool { return slices.Contains(o.AddPeers, a) }), o.DelPeers...)
	d.DelRemote = append(slices.DeleteFunc(d.DelRemote, func(p netip.Prefix) bool { return slices.Contains(o.AddRemote, p) }), o.DelRemote...)
}

// Empty tells whether d changes nothing.
func (d Delta) Empty() bool {
	return len(d.Upsert)+len(d.Remove)+len(d.SetNeighbors)+len(d.DelNeighbors)+len(d.AddFDBs)+len(d.DelFDBs)+
		len(d.AddPeers)+len(d.DelPeers)+len(d.AddRemote)+len(d.DelRemote) == 0
}

// NewPlan validates the Nodes (Validate, with this node's network as
// local tells it), computes the whole desired state of the valid ones
// (as Compute does) and keeps it per node for Update.
func NewPlan(cfg Config, local Local, nodes []Node, onLink OnLink) (*Plan, State) {
	p := &Plan{
		cfg:            cfg,
		onLink:         onLink,
		byNode:         make(map[string]Contribution, len(nodes)),
		routeClaims:    make(map[netip.Prefix]int, len(nodes)),
		fdbClaims:      map[FDB]int{},
		peerClaims:     map[netip.Addr]int{},
		refusalChanges: map[string]bool{},
	}
	p.v = Validate(cfg, local, nodes)
	// the plan keeps the verdicts, not a copy of every valid Node (which
	// Update would not keep current anyway)
	p.v.Valid = nil
	st := compute(cfg, routable(cfg, p.v, nodes), onLink, p.put)
	for _, r := range st.Routes {
		if r.Kind == Blackhole {
			p.routeClaims[r.Dst]++
			p.blackholes++
		}
	}
	p.routes = len(st.Routes) - p.blackholes
	p.skipped = len(st.Skipped)
	st.Refused, st.SelfProblem = p.v.Refused, p.v.SelfProblem
	return p, st
}

// Refused are the Nodes refused now, by name (the plan's own map: read
// only).
func (p *Plan) Refused() map[string]Refusal { return p.v.Refused }

// TakeRefusalChanges returns the names of the Nodes whose refusal began,
// changed or ended through Update since the last call.
func (p *Plan) TakeRefusalChanges() []string {
	names := make([]string, 0, len(p.refusalChanges))
	for n := range p.refusalChanges {
		names = append(names, n)
	}
	clear(p.refusalChanges)
	slices.Sort(names)
	return names
}

// Routes is how many routes the plan wants (the local blackholes too).
func (p *Plan) Routes() int { return p.routes + p.blackholes }

// Skipped is how many PodCIDRs or Nodes the plan leaves out.
func (p *Plan) Skipped() int { return p.skipped }

// Peers are the addresses of the remote Nodes the plan routes to and
// their PodCIDRs, unsorted: what the tunnel filter accepts.
func (p *Plan) Peers() ([]netip.Addr, []netip.Prefix) {
	peers := make([]netip.Addr, 0, len(p.peerClaims))
	for a := range p.peerClaims {
		peers = append(peers, a)
	}
	var cidrs []netip.Prefix
	for _, c := range p.byNode {
		for _, r := range c.Routes {
			cidrs = append(cidrs, r.Dst)
		}
	}
	return peers, cidrs
}

// peerOf is the underlay address of the Node that contributes c, when it
// has a route: its VXLAN FDB entry's destination, else its routes' next
// hop (IPIP, direct).
func peerOf(c Contribution) netip.Addr {
	switch {
	case len(c.Routes) == 0:
		return netip.Addr{}
	case len(c.FDBs) > 0:
		return c.FDBs[0].Dst
	}
	return c.Routes[0].Gw
}

func (p *Plan) put(name string, c Contribution) {
	p.byNode[name] = c
	p.routes += len(c.Routes)
	p.skipped += len(c.Skipped)
	for _, r := range c.Routes {
		p.routeClaims[r.Dst]++
	}
	for _, f := range c.FDBs {
		p.fdbClaims[f]++
	}
	if a := peerOf(c); a.IsValid() {
		p.peerClaims[a]++
	}
}

func (p *Plan) drop(name string) {
	c, ok := p.byNode[name]
	if !ok {
		return
	}
	delete(p.byNode, name)
	p.routes -= len(c.Routes)
	p.skipped -= len(c.Skipped)
	for _, r := range c.Routes {
		if p.routeClaims[r.Dst]--; p.routeClaims[r.Dst] == 0 {
			delete(p.routeClaims, r.Dst)
		}
	}
	for _, f := range c.FDBs {
		if p.fdbClaims[f]--; p.fdbClaims[f] == 0 {
			delete(p.fdbClaims, f)
		}
	}
	if a := peerOf(c); a.IsValid() {
		if p.peerClaims[a]--; p.peerClaims[a] == 0 {
			delete(p.peerClaims, a)
		}
	}
}

// Update replaces what the plan knows of the remote Node name: n is its
// new content, or nil when it was deleted. It returns what changes. ok is
// false when the change cannot be patched in alone: the Node is this node
// (its PodCIDRs and address shape everything), or a destination or FDB
// entry it gives up or takes is claimed by another Node too. The plan is
// then unchanged and the caller computes everything again (NewPlan).
func (p *Plan) Update(name string, n *Node) (d Delta, ok bool) {
	if name == p.cfg.Self || p.v.Conflicted[name] {
		// this node shapes every verdict; a Node in a conflict can
		// change the verdict on the other side
		return Delta{}, false
	}
	var refusal *Refusal
	var claim bool
	var altProblem string
	if n != nil {
		if refusal, claim, altProblem, ok = p.v.claims.judge(name, *n); !ok {
			return Delta{}, false
		}
	}
	old := p.byNode[name]
	var next Contribution
	if n != nil && refusal == nil {
		routed := *n
		routed.AltProblem = altProblem
		next = ForNode(p.cfg, routed, p.onLink)
	}
	if !p.alone(old, next) {
		return Delta{}, false
	}
	d = contributionDelta(old, next)
	p.drop(name)
	if n != nil {
		p.put(name, next)
	}
	// an address another Node routed through too stays a peer
	if was, is := peerOf(old), peerOf(next); was != is {
		if was.IsValid() && p.peerClaims[was] == 0 {
			d.DelPeers = append(d.DelPeers, was)
		}
		if is.IsValid() && p.peerClaims[is] == 1 {
			d.AddPeers = append(d.AddPeers, is)
		}
	}
	p.v.claims.unclaim(name)
	if claim {
		p.v.claims.claim(*n)
	}
	if altProblem != "" {
		p.v.AltProblems[name] = altProblem
	} else {
		delete(p.v.AltProblems, name)
	}
	p.setRefusal(name, refusal)
	return d, true
}

// alone tells whether every destination and FDB entry of a Node's old and
// next contribution is this Node's alone.
func (p *Plan) alone(old, next Contribution) bool {
	for _, c := range [2]Contribution{old, next} {
		for _, r := range c.Routes {
			mine := 0
			if slices.ContainsFunc(old.Routes, func(o Route) bool { return o.Dst == r.Dst }) {
				mine = 1
			}
			if p.routeClaims[r.Dst] > mine {
				return false
			}
		}
		for _, f := range c.FDBs {
			mine := 0
			if slices.Contains(old.FDBs, f) {
				mine = 1
			}
			if p.fdbClaims[f] > mine {
				return false
			}
		}
	}
	return true
}

// contributionDelta is what turns a Node's old contribution into next:
// routes, neighbors, FDB entries, and the tunnel filter's PodCIDRs (its
// peers are the plan's: Update).
func contributionDelta(old, next Contribution) (d Delta) {
	d.Upsert, d.Remove = changes(old.Routes, next.Routes, func(r Route) netip.Prefix { return r.Dst })
	d.SetNeighbors, d.DelNeighbors = changes(old.Neighbors, next.Neighbors, func(n Neighbor) netip.Addr { return n.IP })
	d.AddFDBs, d.DelFDBs = changes(old.FDBs, next.FDBs, func(f FDB) FDB { return f })
	for _, r := range d.Upsert {
		if !slices.ContainsFunc(old.Routes, func(o Route) bool { return o.Dst == r.Dst }) {
			d.AddRemote = append(d.AddRemote, r.Dst)
		}
	}
	for _, r := range d.Remove {
		d.DelRemote = append(d.DelRemote, r.Dst)
	}
	return d
}

func (p *Plan) setRefusal(name string, r *Refusal) {
	cur, was := p.v.Refused[name]
	switch {
	case r == nil && !was:
		return
	case r == nil:
		delete(p.v.Refused, name)
	case was && cur == *r:
		return
	default:
		p.v.Refused[name] = *r
	}
	p.refusalChanges[name] = true
}

// changes compares two lists of entries keyed by key: set holds the
// entries of next that old lacks or holds differently, del the entries of
// old whose key next lacks.
func changes[T comparable, K comparable](old, next []T, key func(T) K) (set, del []T) {
	for _, n := range next {
		if i := slices.IndexFunc(old, func(o T) bool { return key(o) == key(n) }); i < 0 || old[i] != n {
			set = append(set, n)
		}
	}
	for _, o := range old {
		if !slices.ContainsFunc(next, func(n T) bool { return key(n) == key(o) }) {
			del = append(del, o)
		}
	}
	return set, del
}
