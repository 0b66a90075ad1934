package nftutil

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/testns"
)

// testTable is a table with what every writer's has: a counter, a set
// with elements, a verdict map jumping to a chain, a base chain that
// jumps before the chain it names is declared.
func testTable() *Table {
	addrs := AddrElements([]netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")}, false)
	return &Table{
		Family:   nftables.TableFamilyINet,
		Name:     "nftutil-test",
		Counters: []string{"dropped"},
		Sets: []Set{
			{Def: nftables.Set{Name: "peers4", KeyType: nftables.TypeIPAddr}, Elems: addrs},
			{Def: nftables.Set{Name: "jump4", KeyType: nftables.TypeIPAddr, IsMap: true, DataType: nftables.TypeVerdict},
				Elems: []nftables.SetElement{{Key: addrs[0].Key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: "inner"}}}},
		},
		Chains: []Chain{
			{Def: nftables.Chain{Name: "pre", Type: nftables.ChainTypeFilter, Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw},
				Rules: [][]expr.Any{{&expr.Verdict{Kind: expr.VerdictJump, Chain: "inner"}}}},
			{Def: nftables.Chain{Name: "inner"}, Rules: [][]expr.Any{Join(
				[]expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}}},
				[]expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4}, &expr.Lookup{SourceRegister: 1, SetName: "peers4", Invert: true}},
				[]expr.Any{&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: "dropped"}, &expr.Verdict{Kind: expr.VerdictDrop}},
			)}, UserData: [][]byte{[]byte("comment")}},
		},
	}
}

// TestTableWholeReadBackRepair: in a throwaway netns, a Table written
// whole in one transaction reads back the same (Differs finds nothing);
// an element gone, an object edited, the table gone are each found; a
// second whole write keeps the counter's value; DeleteTable takes a
// missing table as done.
func TestTableWholeReadBackRepair(t *testing.T) {
	inScratchNetns(t, func() error {
		var conn Conn
		defer conn.Close()
		c, err := conn.Open()
		if err != nil {
			return err
		}
		tt := testTable()
		write := func(kept map[string]expr.Counter) []string {
			t.Helper()
			if err := tt.QueueWhole(c, kept, 1); err != nil {
				t.Fatal(err)
			}
			if err := c.Flush(); err != nil {
				t.Fatalf("write: %v", err)
			}
			written, err := ReadBack(conn.Netlink(), tt.Family, tt.Name, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			return written
		}
		differs := func(written []string) string {
			t.Helper()
			d, err := Differs(c, conn.Netlink(), tt, written)
			if err != nil {
				t.Fatal(err)
			}
			return d
		}
		written := write(nil)
		if d := differs(written); d != "" {
			t.Fatalf("right after the write: %s", d)
		}
		// an element gone
		s := tt.Sets[0].SetOf(tt.Ref())
		if err := c.SetDeleteElements(s, tt.Sets[0].Elems[:1]); err != nil {
			t.Fatal(err)
		}
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if d := differs(written); !strings.Contains(d, "set peers4: 1 element(s) missing") {
			t.Errorf("an element deleted: %q", d)
		}
		// written again over it: the counter keeps what it was given
		written = write(map[string]expr.Counter{"dropped": {Packets: 7}})
		if d := differs(written); d != "" {
			t.Fatalf("rewritten: %s", d)
		}
		kept, err := ReadCounters(c, tt.Ref())
		if err != nil || kept["dropped"].Packets != 7 {
			t.Errorf("counters after the rewrite: %v, %v; want dropped 7", kept, err)
		}
		// a rule added to a chain
		c.AddRule(&nftables.Rule{Table: tt.Ref(), Chain: &nftables.Chain{Name: "inner", Table: tt.Ref()}, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}})
		if err := c.Flush(); err != nil {
			t.Fatal(err)
		}
		if d := differs(written); !strings.Contains(d, "rule 2 of chain inner added") {
			t.Errorf("a rule added: %q", d)
		}
		if err := DeleteTable(c, tt.Ref()); err != nil {
			t.Fatal(err)
		}
		if d := differs(written); d != "table missing" {
			t.Errorf("table deleted: %q", d)
		}
		if ok, err := TableExists(c, tt.Ref()); ok || err != nil {
			t.Errorf("TableExists after DeleteTable: %v, %v", ok, err)
		}
		return DeleteTable(c, tt.Ref()) // missing: fine
	})
}

func TestElementKeysAndDiff(t *testing.T) {
	before := []nftables.SetElement{{Key: []byte{10, 0, 0, 1}}, {Key: []byte{10, 0, 0, 2}, IntervalEnd: true}}
	after := []nftables.SetElement{{Key: []byte{10, 0, 0, 1}}, {Key: []byte{10, 0, 0, 3}, KeyEnd: []byte{10, 0, 0, 4}}}
	del, add := Changes(before, after)
	if len(del) != 1 || ElementKey(del[0]) != "0a000002(end)" || len(add) != 1 || ElementKey(add[0]) != "0a000003-0a000004" {
		t.Errorf("Changes: del %v add %v", del, add)
	}
	if d := ElementsDiff(after, before); d != "1 element(s) missing (0a000003-0a000004), 1 element(s) not wanted (0a000002(end))" {
		t.Errorf("ElementsDiff: %q", d)
	}
	v := nftables.SetElement{Key: []byte{1}, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: "c"}}
	if k := ElementKey(v); k != "01:-3/c" {
		t.Errorf("ElementKey of a verdict: %q", k)
	}
}

// inScratchNetns runs f in a throwaway network namespace.
func inScratchNetns(t *testing.T, f func() error) {
	t.Helper()
	n := testns.New(t)
	if err := n.Do(func(ns.NetNS) error { return f() }); err != nil {
		t.Fatal(err)
	}
}
