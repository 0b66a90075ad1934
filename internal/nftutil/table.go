package nftutil

// A table described as data, and what every writer does with it: write
// it whole in one transaction, read its counters, tell whether it is
// there, delete it, and compare the kernel's with it (the repair rule).

import (
	"fmt"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
)

// Table is a whole nftables table as data: its named counters, its sets
// and maps with their elements, its chains with their rules, each in the
// order they are written.
type Table struct {
	Family   nftables.TableFamily
	Name     string
	Counters []string
	Sets     []Set
	Chains   []Chain
}

// Set is a set or verdict map of a Table: its definition (Table and ID
// are filled in when it is written) and its elements.
type Set struct {
	Def   nftables.Set
	Elems []nftables.SetElement
}

// Chain is a chain of a Table (Table is filled in when it is written) and
// its rules; UserData, when set, holds each rule's user data by index.
type Chain struct {
	Def      nftables.Chain
	Rules    [][]expr.Any
	UserData [][]byte
}

// Ref is the table as the nftables library names it.
func (t *Table) Ref() *nftables.Table {
	return &nftables.Table{Family: t.Family, Name: t.Name}
}

// SetOf is s's definition in table tbl, ready for the library's calls.
func (s *Set) SetOf(tbl *nftables.Table) *nftables.Set {
	d := s.Def
	d.Table = tbl
	return &d
}

// QueueWhole queues on c the whole table in place of whatever the kernel
// holds of that name (add, delete, add: one transaction replaces it): the
// counters with the values of kept (a counter kept lacks starts at 0),
// the sets with their elements, the chains and their rules, and the
// maps' elements last (their jumps name the chains). Sets' elements go in
// messages of at most perMessage elements.
func (t *Table) QueueWhole(c *nftables.Conn, kept map[string]expr.Counter, perMessage int) error {
	tbl := t.Ref()
	c.AddTable(tbl)
	c.DelTable(tbl)
	c.AddTable(tbl)
	for _, name := range t.Counters {
		v := kept[name]
		c.AddObj(&nftables.NamedObj{Table: tbl, Name: name, Type: nftables.ObjTypeCounter, Obj: &v})
	}
	ids := map[string]uint32{}
	for i := range t.Sets {
		s := t.Sets[i].SetOf(tbl)
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("nftables set %s: %w", s.Name, err)
		}
		ids[s.Name] = s.ID
		if s.IsMap {
			continue // its jumps need the chains
		}
		if err := QueueElements(c, s, t.Sets[i].Elems, false, perMessage); err != nil {
			return err
		}
	}
	chains := make([]*nftables.Chain, len(t.Chains))
	for i := range t.Chains { // all of them before any rule: a rule may jump to any
		ch := t.Chains[i].Def
		ch.Table = tbl
		chains[i] = c.AddChain(&ch)
	}
	for i, ch := range chains {
		AddRules(c, ch, t.Chains[i].Rules, t.Chains[i].UserData, ids)
	}
	for i := range t.Sets {
		if s := t.Sets[i].SetOf(tbl); s.IsMap {
			if err := QueueElements(c, s, t.Sets[i].Elems, false, perMessage); err != nil {
				return err
			}
		}
	}
	return nil
}

// AddRules queues rules at the end of chain (userData: each rule's user
// data by index, or nil), with the IDs of the sets created in the same
// transaction (ids, by name). The rules stay as they are: a lookup of a
// set created now is copied with its ID.
func AddRules(c *nftables.Conn, chain *nftables.Chain, rules [][]expr.Any, userData [][]byte, ids map[string]uint32) {
	for i, r := range rules {
		exprs := make([]expr.Any, len(r))
		for j, e := range r {
			if l, ok := e.(*expr.Lookup); ok && ids[l.SetName] != 0 {
				cp := *l
				cp.SetID = ids[l.SetName]
				e = &cp
			}
			exprs[j] = e
		}
		rule := &nftables.Rule{Table: chain.Table, Chain: chain, Exprs: exprs}
		if i < len(userData) {
			rule.UserData = userData[i]
		}
		c.AddRule(rule)
	}
}

// ReadCounters reads the named counters of tbl: none without a table.
func ReadCounters(c *nftables.Conn, tbl *nftables.Table) (map[string]expr.Counter, error) {
	objs, err := c.GetNamedObjects(tbl)
	if IsNotFound(err) {
		return map[string]expr.Counter{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read nftables counters of %s: %w", tbl.Name, err)
	}
	out := make(map[string]expr.Counter, len(objs))
	for _, o := range objs {
		if n, ok := o.(*nftables.NamedObj); ok {
			if v, ok := n.Obj.(*expr.Counter); ok && n.Table != nil && n.Table.Name == tbl.Name {
				out[n.Name] = *v
			}
		}
	}
	return out, nil
}

// TableExists tells whether the kernel holds tbl.
func TableExists(c *nftables.Conn, tbl *nftables.Table) (bool, error) {
	tables, err := c.ListTablesOfFamily(tbl.Family)
	if err != nil {
		return false, fmt.Errorf("list nftables tables: %w", err)
	}
	return slices.ContainsFunc(tables, func(x *nftables.Table) bool { return x.Name == tbl.Name }), nil
}

// DeleteTable deletes tbl in a transaction of its own; a missing table
// is fine.
func DeleteTable(c *nftables.Conn, tbl *nftables.Table) error {
	ok, err := TableExists(c, tbl)
	if err != nil || !ok {
		return err
	}
	c.DelTable(tbl)
	if err := c.Flush(); err != nil && !IsNotFound(err) {
		return fmt.Errorf("delete nftables table %s: %w", tbl.Name, err)
	}
	return nil
}

// ReadBack reads table name of family back right after a write, for
// Differs later: its whole structure (p nil), or (StructurePatch) only
// what the write changed (p) on top of old, the structure read before.
// A table gone meanwhile is an error.
func ReadBack(nl *netlink.Conn, family nftables.TableFamily, name string, old []string, p *Patch) ([]string, error) {
	var lines []string
	var err error
	if p != nil {
		lines, err = StructurePatch(nl, byte(family), name, old, *p)
	} else {
		lines, err = Structure(nl, byte(family), name)
	}
	if err != nil {
		return nil, fmt.Errorf("read back nftables table %s: %w", name, err)
	}
	if lines == nil {
		return nil, fmt.Errorf("nftables table %s gone right after it was written", name)
	}
	return lines, nil
}

// Differs is the repair rule every writer applies: it compares the
// kernel's table (read on c and its netlink side nl) with t, whose
// structure was read back as written right after t was written, and says
// how they differ ("" when they do not): the table missing, any object
// added, deleted or edited (Structure), any element missing or not
// wanted in one of t's sets. A difference is the writer's to rewrite.
func Differs(c *nftables.Conn, nl *netlink.Conn, t *Table, written []string) (string, error) {
	have, err := Structure(nl, byte(t.Family), t.Name)
	if err != nil {
		return "", err
	}
	if have == nil {
		return "table missing", nil
	}
	if d := StructureDiff(written, have); d != "" {
		return d, nil
	}
	tbl := t.Ref()
	for i := range t.Sets {
		s := t.Sets[i].SetOf(tbl)
		got, err := c.GetSetElements(s)
		if err != nil {
			return fmt.Sprintf("set %s: %v", s.Name, err), nil
		}
		if d := ElementsDiff(t.Sets[i].Elems, got); d != "" {
			return fmt.Sprintf("set %s: %s", s.Name, d), nil
		}
	}
	return "", nil
}

// Join is the expressions of parts, in order: one rule made of pieces.
func Join(parts ...[]expr.Any) []expr.Any {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	out := make([]expr.Any, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// AddrElements are the elements of a set of addresses: those of addrs in
// the family v6 says, in their order.
func AddrElements(addrs []netip.Addr, v6 bool) []nftables.SetElement {
	var out []nftables.SetElement
	for _, a := range addrs {
		if a.Is6() == v6 {
			out = append(out, nftables.SetElement{Key: a.AsSlice()})
		}
	}
	return out
}
