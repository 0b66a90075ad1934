package nft

// The incremental write: the difference between the table the kernel
// holds and the next one, in one transaction. The two tables compared
// are whole ones, or (the Writer's) only what one change touches
// (store.go): the order of the transaction is the same.

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/podnet/podnet/internal/nftutil"
)

// Stats describes one Apply or ApplyDelta.
type Stats struct {
	Full     bool // the whole table was written
	Elements int  // set and map elements added or deleted (incremental)
	Chains   int  // chains created, rewritten or deleted (incremental)
	Sets     int  // sets created or deleted (incremental)
	// Verdicts: verdict map elements added (incremental). A transaction
	// that adds one, or any rule (Chains), makes the kernel validate the
	// whole table at its commit; one of set elements only does not.
	Verdicts int
}

// writeChange writes a change of the store (the touched objects as they
// were and as they are) in one transaction (tableDiff.queue has its
// order), and leaves the read-back of what it changed to settle. Callers
// hold w.mu and have settled the write before.
func (w *Writer) writeChange(ch *change) (Stats, error) {
	c, err := w.nft()
	if err != nil {
		return Stats{}, err
	}
	d := newTableDiff(ch.old, ch.def)
	st, err := d.queue(c)
	if err != nil {
		return st, err
	}
	if st.Elements+st.Chains+st.Sets == 0 && slices.Equal(ch.old.counters, ch.def.counters) {
		return st, nil
	}
	w.seq++
	w.ours++
	if err := c.Flush(); err != nil {
		return st, fmt.Errorf("update nftables table %s: %w", TableName, err)
	}
	if p := d.patch(); len(p.Counters)+len(p.Sets)+len(p.Chains)+len(p.Gone)+len(p.Rules) > 0 {
		w.unread = &p
	}
	return st, nil
}

// tableDiff is what changes from old to def, indexed by name.
type tableDiff struct {
	old, def                 *tableDef
	oldSets, newSets         map[string]setDef
	oldChains, newChains     map[string]chainDef
	oldCounters, newCounters map[string]bool
	// rewrite are the chains that come or whose rules change
	rewrite []chainDef
}

func newTableDiff(old, def *tableDef) *tableDiff {
	return &tableDiff{old: old, def: def,
		oldSets: setIndex(old.sets), newSets: setIndex(def.sets),
		oldChains: chainIndex(old.chains), newChains: chainIndex(def.chains),
		oldCounters: nameSet(old.counters), newCounters: nameSet(def.counters)}
}

func nameSet(names []string) map[string]bool {
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// sameSet tells whether a set of one name stays (same kind and family):
// else it is deleted and created.
func sameSet(a, b setDef) bool { return a.kind == b.kind && a.v6 == b.v6 }

// elemOp adds or deletes elements of a set that stays.
type elemOp struct {
	d   setDef
	e   []nftables.SetElement
	del bool
}

// elementOps are the element changes of the sets that stay: deletions
// (maps' first: the jumps to pod chains) and additions (maps' last).
func (d *tableDiff) elementOps() (dels, adds []elemOp) {
	for _, s := range d.def.sets {
		o, ok := d.oldSets[s.name]
		if !ok || !sameSet(o, s) || sameElements(o.elems, s.elems) {
			continue
		}
		// only the elements between the lists' common start and end
		// differ (each list holds an element once): a patch of one
		// address is compared where it is, not element by element
		// through the whole set
		i, j := commonEnds(o.elems, s.elems)
		var del, add []nftables.SetElement
		if s.kind == kindInterval {
			del, add = wholeIntervals(o.elems, s.elems, i, j)
		} else {
			del, add = nftutil.Changes(o.elems[i:len(o.elems)-j], s.elems[i:len(s.elems)-j])
		}
		if len(del) > 0 {
			dels = append(dels, elemOp{s, del, true})
		}
		if len(add) > 0 {
			adds = append(adds, elemOp{s, add, false})
		}
	}
	slices.SortStableFunc(dels, func(a, b elemOp) int { return kindOrder(b.d.kind) - kindOrder(a.d.kind) })
	slices.SortStableFunc(adds, func(a, b elemOp) int { return kindOrder(a.d.kind) - kindOrder(b.d.kind) })
	return dels, adds
}

// queue queues the difference on c, ordered so that nothing is deleted
// while still used and nothing is used before it exists:
//  1. elements deleted (map elements first: the jumps to pod chains);
//  2. chains that change or go flushed, then those that go deleted;
//  3. sets and counters that go deleted (no rule uses them any more);
//  4. counters, sets (with their elements) and chains that come created;
//  5. the rules of chains that come or change;
//  6. elements added to sets that stay (map elements last).
func (d *tableDiff) queue(c *nftables.Conn) (Stats, error) {
	var st Stats
	t := table()
	dels, adds := d.elementOps()
	if err := queueOps(c, t, dels, &st); err != nil {
		return st, err
	}
	if err := d.queueChainsGoing(c, t, &st); err != nil {
		return st, err
	}
	d.queueGoing(c, t, &st)
	chains, ids, err := d.queueComing(c, t, &st)
	if err != nil {
		return st, err
	}
	for _, ch := range d.rewrite {
		nftutil.AddRules(c, chains[ch.chain.Name], ch.rules, nil, ids)
	}
	return st, queueOps(c, t, adds, &st)
}

func queueOps(c *nftables.Conn, t *nftables.Table, ops []elemOp, st *Stats) error {
	for _, o := range ops {
		if err := nftutil.QueueElements(c, o.d.set(t), o.e, o.del, setElementsPerMessage); err != nil {
			return err
		}
		st.Elements += len(o.e)
		if !o.del && o.d.kind.isMap() {
			st.Verdicts += len(o.e)
		}
	}
	return nil
}

// queueChainsGoing finds the chains to rewrite (d.rewrite), flushes those
// that change or go and deletes those that go.
func (d *tableDiff) queueChainsGoing(c *nftables.Conn, t *nftables.Table, st *Stats) error {
	for _, ch := range d.def.chains {
		o, ok := d.oldChains[ch.chain.Name]
		switch {
		case !ok:
			d.rewrite = append(d.rewrite, ch)
		case !reflect.DeepEqual(o.chain, ch.chain):
			return fmt.Errorf("chain %s changed type: a full write is needed", ch.chain.Name)
		case o.sig != ch.sig:
			c.FlushChain(inTable(ch.chain, t))
			d.rewrite = append(d.rewrite, ch)
		}
	}
	var going []*nftables.Chain
	for _, o := range d.old.chains {
		if _, ok := d.newChains[o.chain.Name]; !ok {
			ch := inTable(o.chain, t)
			c.FlushChain(ch)
			going = append(going, ch)
		}
	}
	for _, ch := range going {
		c.DelChain(ch)
		st.Chains++
	}
	return nil
}

func inTable(ch nftables.Chain, t *nftables.Table) *nftables.Chain {
	ch.Table = t
	return &ch
}

// queueGoing deletes the sets and counters that go.
func (d *tableDiff) queueGoing(c *nftables.Conn, t *nftables.Table, st *Stats) {
	for _, o := range d.old.sets {
		if s, ok := d.newSets[o.name]; !ok || !sameSet(o, s) {
			c.DelSet(o.set(t))
			st.Sets++
		}
	}
	for _, n := range d.old.counters {
		if !d.newCounters[n] {
			c.DeleteObject(&nftables.NamedObj{Table: t, Name: n, Type: nftables.ObjTypeCounter})
		}
	}
}

// queueComing creates the counters, sets (with their elements) and
// chains that come; it returns the chains to write rules in and the IDs
// of the sets created.
func (d *tableDiff) queueComing(c *nftables.Conn, t *nftables.Table, st *Stats) (map[string]*nftables.Chain, map[string]uint32, error) {
	for _, n := range d.def.counters {
		if !d.oldCounters[n] {
			c.AddObj(&nftables.NamedObj{Table: t, Name: n, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}})
		}
	}
	ids := map[string]uint32{}
	for _, s := range d.def.sets {
		if o, ok := d.oldSets[s.name]; ok && sameSet(o, s) {
			continue
		}
		set := s.set(t)
		if err := c.AddSet(set, nil); err != nil {
			return nil, nil, fmt.Errorf("nftables set %s: %w", s.name, err)
		}
		ids[set.Name] = set.ID
		if err := nftutil.QueueElements(c, set, s.elems, false, setElementsPerMessage); err != nil {
			return nil, nil, err
		}
		st.Sets++
		st.Elements += len(s.elems)
		if s.kind.isMap() {
			st.Verdicts += len(s.elems)
		}
	}
	chains := map[string]*nftables.Chain{}
	for _, ch := range d.rewrite {
		chains[ch.chain.Name] = inTable(ch.chain, t)
		if _, ok := d.oldChains[ch.chain.Name]; !ok {
			chains[ch.chain.Name] = c.AddChain(chains[ch.chain.Name])
		}
		st.Chains++
	}
	return chains, ids, nil
}

// patch is what the read-back reads again after the difference.
func (d *tableDiff) patch() nftutil.Patch {
	var p nftutil.Patch
	for _, o := range d.old.chains {
		if _, ok := d.newChains[o.chain.Name]; !ok {
			p.Gone = append(p.Gone, "chain "+o.chain.Name)
		}
	}
	for _, ch := range d.rewrite {
		if _, ok := d.oldChains[ch.chain.Name]; !ok {
			p.Chains = append(p.Chains, ch.chain.Name)
		}
		p.Rules = append(p.Rules, ch.chain.Name)
	}
	for _, o := range d.old.sets {
		if s, ok := d.newSets[o.name]; !ok || !sameSet(o, s) {
			p.Gone = append(p.Gone, "set "+o.name)
		}
	}
	for _, s := range d.def.sets {
		if o, ok := d.oldSets[s.name]; !ok || !sameSet(o, s) {
			p.Sets = append(p.Sets, s.name)
		}
	}
	for _, n := range d.old.counters {
		if !d.newCounters[n] {
			p.Gone = append(p.Gone, "object "+n)
		}
	}
	for _, n := range d.def.counters {
		if !d.oldCounters[n] {
			p.Counters = append(p.Counters, n)
		}
	}
	return p
}

func kindOrder(k setKind) int {
	if k.isMap() {
		return 1
	}
	return 0
}

func setIndex(sets []setDef) map[string]setDef {
	m := make(map[string]setDef, len(sets))
	for _, s := range sets {
		m[s.name] = s
	}
	return m
}

func chainIndex(chains []chainDef) map[string]chainDef {
	m := make(map[string]chainDef, len(chains))
	for _, c := range chains {
		m[c.chain.Name] = c
	}
	return m
}

// defDiff says how two table contents differ ("" when they do not).
func defDiff(a, b *tableDef) string {
	if !slices.Equal(a.counters, b.counters) {
		ac, bc := nameSet(a.counters), nameSet(b.counters)
		for _, n := range a.counters {
			if !bc[n] {
				return "counter " + n + " only in the first"
			}
		}
		for _, n := range b.counters {
			if !ac[n] {
				return "counter " + n + " only in the second"
			}
		}
		return "counters"
	}
	as, bs := setIndex(a.sets), setIndex(b.sets)
	if len(as) != len(bs) {
		return "sets"
	}
	for n, s := range as {
		o, ok := bs[n]
		if !ok || !sameSet(o, s) {
			return "set " + n
		}
		if sameElements(s.elems, o.elems) {
			continue
		}
		if del, add := nftutil.Changes(s.elems, o.elems); len(del)+len(add) > 0 {
			return "set " + n + " elements"
		}
	}
	if len(a.chains) != len(b.chains) {
		return "chains"
	}
	for i := range a.chains {
		if a.chains[i].sig != b.chains[i].sig || !reflect.DeepEqual(a.chains[i].chain, b.chains[i].chain) {
			return "chain " + a.chains[i].chain.Name
		}
	}
	return ""
}

// trimCommon is a and b without the elements they start and end with
// alike (sameElements'). An element of a's rest is in none of b's start
// or end (which are a's, and a holds each element once), nor the other
// way round: the rests' changes are the lists' changes.
func trimCommon(a, b []nftables.SetElement) ([]nftables.SetElement, []nftables.SetElement) {
	i, j := commonEnds(a, b)
	return a[i : len(a)-j], b[i : len(b)-j]
}

// commonEnds are the lengths of a's and b's common start and end.
func commonEnds(a, b []nftables.SetElement) (i, j int) {
	n := min(len(a), len(b))
	for i < n && sameElements(a[i:i+1], b[i:i+1]) {
		i++
	}
	for j < n-i && sameElements(a[len(a)-1-j:len(a)-j], b[len(b)-1-j:len(b)-j]) {
		j++
	}
	return i, j
}

// wholeIntervals widens a change of an interval set (kindInterval: its
// elements are interval starts and ends, an end has IntervalEnd) to the
// whole intervals it touches, to delete and add as they are. The kernel
// refuses an end or a start added inside an interval it holds (EEXIST):
// a pod's address taken
// out of a merged range of peers is an end and a start added inside it,
// and an address added next to one moves its end. Deleting the intervals
// the change touches and adding what they become, in one transaction, is
// what it takes; an element deleted and added again is fine there. a and
// b are the lists before and after, i and j the lengths of their common
// start and end (commonEnds).
func wholeIntervals(a, b []nftables.SetElement, i, j int) (del, add []nftables.SetElement) {
	ea, eb := len(a)-j, len(b)-j // the middles: a[i:ea], b[i:eb]
	// a common start before the middle begins the interval it is in; a
	// common end after it ends it
	if i > 0 && !a[i-1].IntervalEnd {
		i--
	}
	if ea < len(a) && eb < len(b) && a[ea].IntervalEnd {
		ea, eb = ea+1, eb+1
	}
	return slices.Clone(a[i:ea]), slices.Clone(b[i:eb])
}

// sameElements tells whether two lists of elements built by build are
// the same, in the same order (build sorts them): the common case of a
// set an update does not touch, without making keys of its elements.
func sameElements(a, b []nftables.SetElement) bool {
	return slices.EqualFunc(a, b, func(x, y nftables.SetElement) bool {
		if x.IntervalEnd != y.IntervalEnd || !bytes.Equal(x.Key, y.Key) || !bytes.Equal(x.KeyEnd, y.KeyEnd) {
			return false
		}
		if x.VerdictData == nil || y.VerdictData == nil {
			return x.VerdictData == y.VerdictData
		}
		return *x.VerdictData == *y.VerdictData
	})
}
