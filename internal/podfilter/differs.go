package podfilter

// What of the filter the kernel lacks or holds changed: Repair's check.

import (
	"fmt"
	"reflect"
	"slices"

	"github.com/google/nftables"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
)

// differs says what of the filter and of ports' elements the kernel lacks
// or holds changed ("" : nothing).
func (g Guard) differs(c *nftables.Conn, ports []Port) (string, error) {
	want := map[string]map[string][]nftables.SetElement{} // by table, set
	portsOf := map[string][]Port{}                        // by table
	for _, p := range ports {
		for _, t := range g.portTables(p.Index) {
			key := familyName(t.Family) + " " + t.Name
			if want[key] == nil {
				want[key] = map[string][]nftables.SetElement{}
			}
			for set, e := range g.elementsOf(t, p) {
				want[key][set] = append(want[key][set], e...)
			}
			portsOf[key] = append(portsOf[key], p)
		}
	}
	if !g.l2() {
		switch ok, err := nftutil.TableExists(c, legacyL2Table()); {
		case err != nil:
			return "", err
		case ok:
			return "table netdev " + contract.PodFilterTable + " of an older podnet present (its ports go to the tables netdev " + contract.PodFilterTable + "-*)", nil
		}
	}
	chainsOf := map[nftables.TableFamily][]*nftables.Chain{}
	for _, t := range g.tables() {
		where := familyName(t.Family) + " " + t.Name
		if why, err := g.tableDiffers(c, t, chainsOf, want[where], portsOf[where]); err != nil || why != "" {
			return why, err
		}
	}
	return "", nil
}

// tableDiffers says what of table t the kernel lacks or holds changed:
// the table, its chain and rules, the port chains of ports (an L2
// table's), its counters and the elements want (by set). chainsOf caches
// the chains of each family.
func (g Guard) tableDiffers(c *nftables.Conn, t *nftables.Table, chainsOf map[nftables.TableFamily][]*nftables.Chain, want map[string][]nftables.SetElement, ports []Port) (string, error) {
	where := familyName(t.Family) + " " + t.Name
	ok, err := nftutil.TableExists(c, t)
	if err != nil {
		return "", err
	}
	if !ok {
		return "table " + where + " missing", nil
	}
	chains, listed := chainsOf[t.Family]
	if !listed {
		if chains, err = c.ListChainsOfTableFamily(t.Family); err != nil {
			return "", fmt.Errorf("list nftables chains: %w", err)
		}
		chainsOf[t.Family] = chains
	}
	wantCh := g.chainOf(t)
	i := slices.IndexFunc(chains, func(ch *nftables.Chain) bool { return ch.Table.Name == t.Name && ch.Name == wantCh.Name })
	if i < 0 {
		return "chain " + where + "/" + wantCh.Name + " missing", nil
	}
	if !sameHook(chains[i], wantCh) {
		return "chain " + where + "/" + wantCh.Name + " changed (type, hook, priority or policy)", nil
	}
	if ok, err := rulesIntact(c, t, wantCh, g.rulesOf(t)); err != nil || !ok {
		return "rules of " + where + "/" + wantCh.Name + " changed", err
	}
	for _, p := range ports {
		if !isL2Table(t) {
			break
		}
		pc := portChain(t, p)
		if !slices.ContainsFunc(chains, func(ch *nftables.Chain) bool { return ch.Table.Name == t.Name && ch.Name == pc.Name }) {
			return "chain " + where + "/" + pc.Name + " missing", nil
		}
		if ok, err := rulesIntact(c, t, pc, portRules()); err != nil || !ok {
			return "rules of " + where + "/" + pc.Name + " changed", err
		}
	}
	have, _ := nftutil.ReadCounters(c, t) // unreadable: counted missing
	for _, name := range g.counterNames(t) {
		if _, ok := have[name]; !ok {
			return "counter " + where + "/" + name + " missing", nil
		}
	}
	for _, s := range g.setsOf(t) {
		elems, err := c.GetSetElements(s)
		if err != nil {
			if nftutil.IsNotFound(err) {
				return "set " + where + "/" + s.Name + " missing", nil
			}
			return "", fmt.Errorf("list nftables set %s/%s: %w", where, s.Name, err)
		}
		in := make(map[string]bool, len(elems))
		for _, e := range elems {
			if e.Timeout == 0 && e.Expires == 0 { // one with a timeout is being dropped
				in[string(e.Key)] = true
			}
		}
		for _, e := range want[s.Name] {
			if !in[string(e.Key)] {
				i, _ := keyIndex(e.Key)
				return fmt.Sprintf("set %s/%s lacks %s (host veth index %d)", where, s.Name, describeKey(s.Name, e.Key), i), nil
			}
		}
	}
	return "", nil
}

func sameHook(a, b *nftables.Chain) bool {
	eq := func(x, y any) bool { return reflect.DeepEqual(x, y) }
	return a.Type == b.Type && eq(a.Hooknum, b.Hooknum) && eq(a.Priority, b.Priority) && eq(a.Policy, b.Policy)
}

// rulesIntact reports whether chain ch holds exactly want, in order.
func rulesIntact(c *nftables.Conn, t *nftables.Table, ch *nftables.Chain, want []guardRule) (bool, error) {
	got, err := c.GetRules(t, ch)
	if err != nil {
		if nftutil.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("list nftables chain %s %s/%s: %w", familyName(t.Family), t.Name, ch.Name, err)
	}
	if len(got) != len(want) {
		return false, nil
	}
	for i, r := range want {
		if string(got[i].UserData) != string(r.userData()) || !reflect.DeepEqual(got[i].Exprs, r.exprs) {
			return false, nil
		}
	}
	return true, nil
}
