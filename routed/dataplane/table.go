package dataplane

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
)

// nftTimeout bounds one nftables transaction. The nftables library waits
// for one acknowledgement per message of a batch; when the kernel aborts
// a batch and answers once (seen while several netns load nf_tables'
// modules at the same moment, in a VM), that wait never ends and the
// daemon would stop (no node state written, no resync). With a deadline
// the transaction fails, the error is reported, and the next resync
// retries.
const nftTimeout = 10 * time.Second

// nftSendBuffer is the send buffer of an nftables connection: a whole
// transaction is one sendmsg, and the table of a 10,000-Node cluster is
// about 1 MiB (the kernel's default buffer takes 200 KiB). It is a limit,
// not an allocation.
const nftSendBuffer = 16 << 20

// setElementsPerMessage bounds the elements of one message: their list is
// one netlink attribute, whose length is 16 bits (an IPv6 interval
// element takes about 40 bytes).
const setElementsPerMessage = 1000

func podnetTable() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: contract.NFTable}
}

// Table keeps podnet-routed's one nft table, `inet podnet` (see
// tablerules.go for its content), in line with a TableSpec:
//   - Apply writes the whole table in one transaction (add, delete,
//     re-create) when the spec changed, or, with verify, when what the
//     kernel holds is not what was written (someone deleted or edited the
//     table, a chain, a rule, a set, an element);
//   - AddPeers and RemovePeers change the tunnel filter's sets by their
//     elements only, one transaction each, for a Node event.
//
// There is no table at all when the spec wants neither masquerade nor a
// tunnel filter. The zero Table is ready; it is safe for concurrent use.
type Table struct {
	Log *slog.Logger

	mu sync.Mutex
	// spec is what the kernel holds (canonical): the last full write and
	// the deltas since. nil: not known (nothing written yet, or a write
	// failed), so the next Apply writes everything.
	spec *TableSpec
	// written is the table's structure (nftutil.Structure) read back after
	// the last full write: what verify compares the kernel's with.
	written []string
	// nested: spec's RemotePodCIDRs overlap (see change)
	nested bool
	// conn is the Table's one nftables socket, kept open: closing a
	// netfilter socket while the kernel still has deleted set elements to
	// free waits for them (an RCU grace period, ~10 ms) with nf_tables'
	// commit lock held, which would delay the next Node event's
	// transaction. Dialed at its next use after an error.
	conn nftutil.Conn
}

// nft returns the Table's socket, dialed when needed, with a deadline of
// nftTimeout for what the caller does now. Callers hold t.mu.
func (t *Table) nft() (*nftables.Conn, error) {
	t.conn.SendBuffer, t.conn.Timeout = nftSendBuffer, nftTimeout
	return t.conn.Open()
}

// Close closes the Table's socket (a later use dials again).
func (t *Table) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closeConn()
}

// closeConn drops the socket after an error: whatever it was in the
// middle of is not read as the answer to the next request.
func (t *Table) closeConn() { t.conn.Close() }

func (t *Table) log() *slog.Logger {
	if t.Log == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return t.Log
}

// Apply makes the table spec's: a full, atomic write when spec differs
// from what was written last, or, with verify, when the kernel's table
// differs from it in any way (structure or set elements). repaired says
// that verify found the kernel's table changed behind podnet-routed's
// back and wrote it again.
func (t *Table) Apply(spec TableSpec, verify bool) (repaired bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.apply(spec, verify)
}

// apply is Apply; the caller holds t.mu.
func (t *Table) apply(spec TableSpec, verify bool) (repaired bool, err error) {
	want := spec.canonical()
	why := ""
	if t.spec != nil && t.spec.equal(want) {
		if !verify {
			return false, nil
		}
		why, err = t.differs(want)
		if err != nil {
			why = err.Error()
			t.closeConn()
		}
		if why == "" {
			return false, nil
		}
	}
	if err := t.write(want); err != nil {
		t.spec, t.written = nil, nil
		t.closeConn()
		return false, err
	}
	if why != "" {
		t.log().Info("nft table repaired", "table", "inet "+contract.NFTable, "why", why)
	}
	return why != "", nil
}

// Verify checks the kernel's table against the last spec written and
// writes it again when it differs (Apply with verify, without a new
// spec): nothing to do before the first write.
func (t *Table) Verify() (repaired bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.spec == nil {
		return false, nil
	}
	// under the lock: change edits t.spec's sets in place
	return t.apply(*t.spec, true)
}

// write replaces the table with want's in one transaction, then reads
// back its structure for verify.
func (t *Table) write(want TableSpec) error {
	c, err := t.nft()
	if err != nil {
		return err
	}
	if want.empty() {
		if err := deleteTable(c); err != nil {
			return err
		}
		t.spec, t.written = &want, nil
		return nil
	}
	def := buildTable(want)
	// the counter outlives the rewrite: podnet_tunnel_dropped_total must
	// not go back to 0 because a Node came or went
	kept, _ := nftutil.ReadCounters(c, podnetTable())
	if err := def.QueueWhole(c, kept, setElementsPerMessage); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("write nftables table %s: %w", contract.NFTable, err)
	}
	written, err := nftutil.ReadBack(t.conn.Netlink(), nftables.TableFamilyINet, contract.NFTable, nil, nil)
	if err != nil {
		return err
	}
	t.spec, t.written, t.nested = &want, written, nested(want.RemotePodCIDRs)
	return nil
}

// differs compares the kernel's table with what was written for want and
// says how it differs ("" when it does not).
func (t *Table) differs(want TableSpec) (string, error) {
	c, err := t.nft()
	if err != nil {
		return "", err
	}
	if !want.empty() {
		return nftutil.Differs(c, t.conn.Netlink(), buildTable(want), t.written)
	}
	have, err := nftutil.Structure(t.conn.Netlink(), unix.NFPROTO_INET, contract.NFTable)
	if err != nil || have == nil {
		return "", err
	}
	return "table present, none wanted", nil
}

// AddPeers adds remote Nodes (their addresses and PodCIDRs) to the tunnel
// filter's sets, in one transaction: call it before their routes are
// written, so that their first packets are not dropped.
func (t *Table) AddPeers(peers []netip.Addr, cidrs []netip.Prefix) error {
	return t.change(sortedAddrs(peers), sortedPrefixes(cidrs), nil, nil)
}

// RemovePeers removes remote Nodes from the tunnel filter's sets, in one
// transaction: call it after their routes are removed.
func (t *Table) RemovePeers(peers []netip.Addr, cidrs []netip.Prefix) error {
	return t.change(nil, nil, sortedAddrs(peers), sortedPrefixes(cidrs))
}

// change adds and removes peers and PodCIDRs in the spec the kernel holds
// and writes the elements that change, in one transaction. With no table
// written yet (or no tunnel filter) there is nothing to change: the next
// Apply writes it whole. Its cost is that of the change (a binary search
// per item), not of the cluster, unless PodCIDRs overlap (the validation
// refuses that): then the sets are compared whole.
func (t *Table) change(addPeers []netip.Addr, addCIDRs []netip.Prefix, delPeers []netip.Addr, delCIDRs []netip.Prefix) error {
	if len(addPeers)+len(addCIDRs)+len(delPeers)+len(delCIDRs) == 0 {
		return nil
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.spec == nil || !t.spec.tunnel() {
		return nil
	}
	c, err := t.nft()
	if err != nil {
		return err
	}
	next, ops := peerChanges(*t.spec, t.nested, addPeers, addCIDRs, delPeers, delCIDRs)
	writes := 0
	for _, o := range ops {
		if err := nftutil.QueueElements(c, o.s, o.e, o.del, setElementsPerMessage); err != nil {
			t.spec, t.written = nil, nil
			t.closeConn()
			return err
		}
		writes += len(o.e)
	}
	if writes > 0 {
		if err := c.Flush(); err != nil {
			// the kernel's sets are not known any more: the next Apply
			// writes the whole table
			t.spec, t.written = nil, nil
			t.closeConn()
			return fmt.Errorf("update nftables table %s's peers: %w", contract.NFTable, err)
		}
	}
	t.spec, t.nested = &next, nested(next.RemotePodCIDRs)
	return nil
}

// elemOp adds or deletes elements of one set.
type elemOp struct {
	s   *nftables.Set
	e   []nftables.SetElement
	del bool
}

// peerChanges is spec (canonical; nested: its RemotePodCIDRs overlap)
// with the peers and PodCIDRs added and removed, and the element changes
// that make the kernel's sets next's, deletions first (a freed interval
// may be taken again). next's sets are spec's, changed in place (spec's
// are not to be used after): copying them on every Node event cost
// more garbage than the event itself (280 kB at 5,000 Nodes).
func peerChanges(spec TableSpec, nested bool, addPeers []netip.Addr, addCIDRs []netip.Prefix, delPeers []netip.Addr, delCIDRs []netip.Prefix) (next TableSpec, ops []elemOp) {
	table := podnetTable()
	set := func(base string, v6 bool) *nftables.Set {
		s := addrSet(setName(base, v6), v6, base != setPeers)
		return s.SetOf(table)
	}
	var dels, adds []elemOp
	// what was taken out and put in, to tell what spec held (below)
	var gonePeers, newPeers []netip.Addr
	var goneCIDRs, newCIDRs []netip.Prefix
	ok := true
	next = spec
	for _, a := range delPeers {
		if i, found := slices.BinarySearchFunc(next.Peers, a, netip.Addr.Compare); found {
			next.Peers = slices.Delete(next.Peers, i, i+1)
			gonePeers = append(gonePeers, a)
			dels = append(dels, elemOp{set(setPeers, a.Is6()), nftutil.AddrElements([]netip.Addr{a}, a.Is6()), true})
		}
	}
	for _, p := range delCIDRs {
		i, found := slices.BinarySearchFunc(next.RemotePodCIDRs, p, comparePrefixes)
		if !found {
			continue
		}
		ok = ok && !overlapsAround(next.RemotePodCIDRs, i, i+1, p)
		next.RemotePodCIDRs = slices.Delete(next.RemotePodCIDRs, i, i+1)
		goneCIDRs = append(goneCIDRs, p)
		dels = append(dels, elemOp{set(setRemote, p.Addr().Is6()), intervalElements([]netip.Prefix{p}, p.Addr().Is6()), true})
	}
	for _, a := range addPeers {
		if i, found := slices.BinarySearchFunc(next.Peers, a, netip.Addr.Compare); !found {
			next.Peers = slices.Insert(next.Peers, i, a)
			newPeers = append(newPeers, a)
			adds = append(adds, elemOp{set(setPeers, a.Is6()), nftutil.AddrElements([]netip.Addr{a}, a.Is6()), false})
		}
	}
	for _, p := range addCIDRs {
		i, found := slices.BinarySearchFunc(next.RemotePodCIDRs, p, comparePrefixes)
		if found {
			continue
		}
		ok = ok && !overlapsAround(next.RemotePodCIDRs, i, i, p)
		next.RemotePodCIDRs = slices.Insert(next.RemotePodCIDRs, i, p)
		newCIDRs = append(newCIDRs, p)
		adds = append(adds, elemOp{set(setRemote, p.Addr().Is6()), intervalElements([]netip.Prefix{p}, p.Addr().Is6()), false})
	}
	if ok && !nested {
		return next, append(dels, adds...)
	}
	// overlapping PodCIDRs: an interval set holds the outer one only
	// (intervalElements), so compare the sets whole. What spec held is
	// next without what was put in, with what was taken out (an element
	// taken out and put back was in spec: it is back).
	was := next
	was.Peers = sortedAddrs(append(slices.DeleteFunc(slices.Clone(next.Peers), func(a netip.Addr) bool {
		return slices.Contains(newPeers, a)
	}), gonePeers...))
	was.RemotePodCIDRs = sortedPrefixes(append(slices.DeleteFunc(slices.Clone(next.RemotePodCIDRs), func(p netip.Prefix) bool {
		return slices.Contains(newCIDRs, p)
	}), goneCIDRs...))
	dels, adds = nil, nil
	before, after := tunnelSets(was), tunnelSets(next)
	for i := range after {
		del, add := nftutil.Changes(before[i].Elems, after[i].Elems)
		s := after[i].SetOf(table)
		dels, adds = append(dels, elemOp{s, del, true}), append(adds, elemOp{s, add, false})
	}
	return next, append(dels, adds...)
}

// overlapsAround tells whether p overlaps prefixes[before-1] or
// prefixes[after] (the neighbours of the place p takes or leaves in the
// sorted list).
func overlapsAround(prefixes []netip.Prefix, before, after int, p netip.Prefix) bool {
	return (before > 0 && prefixes[before-1].Overlaps(p)) || (after < len(prefixes) && prefixes[after].Overlaps(p))
}

// nested tells whether any of prefixes (sorted) overlap: then one of them
// overlaps the next.
func nested(prefixes []netip.Prefix) bool {
	for i := 1; i < len(prefixes); i++ {
		if prefixes[i-1].Overlaps(prefixes[i]) {
			return true
		}
	}
	return false
}

// TunnelDropped is the number of encapsulated packets the table dropped
// (its counter tunnel_dropped): 0 without a table.
func (t *Table) TunnelDropped() (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, err := t.nft()
	if err != nil {
		return 0, err
	}
	v, found, err := readCounter(c)
	if err != nil {
		t.closeConn()
		return 0, err
	}
	if !found {
		return 0, nil
	}
	return v.Packets, nil
}

// readCounter reads the table's counter; found is false without one.
func readCounter(c *nftables.Conn) (expr.Counter, bool, error) {
	o, err := c.GetObject(&nftables.NamedObj{Table: podnetTable(), Name: CounterTunnelDropped, Type: nftables.ObjTypeCounter})
	if nftutil.IsNotFound(err) {
		return expr.Counter{}, false, nil
	}
	if err != nil {
		return expr.Counter{}, false, fmt.Errorf("read nftables counter %s: %w", CounterTunnelDropped, err)
	}
	if n, ok := o.(*nftables.NamedObj); ok {
		if v, ok := n.Obj.(*expr.Counter); ok {
			return *v, true, nil
		}
	}
	return expr.Counter{}, false, fmt.Errorf("nftables object %s is not a counter", CounterTunnelDropped)
}

// DeleteTable removes podnet's table; a missing table is fine.
func DeleteTable() error {
	c, _, err := nftutil.Dial(nftTimeout, 0, 0)
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	return deleteTable(c)
}

func deleteTable(c *nftables.Conn) error { return nftutil.DeleteTable(c, podnetTable()) }
