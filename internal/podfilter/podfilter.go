// Package podfilter is the pod filter: the nftables tables podnet-pods
// (inet or bridge, and netdev) that let each pod send only as itself. The
// CNI plugins write a pod's elements at ADD (podnet-routed writes them on
// their behalf, InstallOn, when its NetworkPolicy engine answers on the
// node: see Install) and take them out at DEL; podnet-routed repairs the
// tables (Repair) and prunes what is left of gone pods (Prune). It builds on internal/nftutil's nftables layer (the
// tables described as data and written whole in one transaction); what is
// its own is which rules (rules.go) and which elements (a record per
// guarded port, whole.go).
package podfilter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
)

// Pods send only as themselves, and only what a pod needs: the filter is
// an allow-list. Every packet a pod sends enters the node through its
// host veth, so the host veth's index says which pod sent it. The plugins
// keep, in nftables tables of their own (contract.PodFilterTable), what
// each host veth may send as, and drop the rest, counted by reason,
// before anything else on the node sees it:
//
//	table inet podnet-pods (podnet) / table bridge podnet-pods (podnet-bridge)
//	  counters drop-<reason> (contract.PodFilterDropReasons), spoofed and
//	    ra-guard (sums)
//	  set ports  { type iface_index }                 guarded host veths
//	  set addrs4 { type iface_index . ipv4_addr }     what each may send from
//	  set addrs6 { type iface_index . ipv6_addr }     + its EUI-64 link-local
//	  set macs   { type iface_index . ether_addr }    bridge only
//	  chain prerouting { type filter hook prerouting priority -300; policy accept
//	    iif != @ports accept                           not a pod: not ours to judge
//	    ether saddr not the pod's -> mac               bridge only
//	    IPv4 from (iif . saddr) in @addrs4 accept      the fast path
//	    IPv6 not ICMPv6 from (iif . saddr) in @addrs6 accept
//	    ICMPv6 RA or redirect -> router-advertisement
//	    ICMPv6 NA for a target not in @addrs6 -> neighbor-advertisement
//	    ICMPv6 from (iif . saddr) in @addrs6 accept
//	    from :: only DAD NS for a target in @addrs6, MLD reports; else -> unspecified-source
//	    IPv6 from fe80::/10 -> link-local, else -> ipv6-source; IPv4 -> ipv4-source
//	    ARP (bridge): sender MAC the pod's, sender IP 0.0.0.0 or in @addrs4, else -> arp
//	    (bridge) a VLAN TPID -> vlan, anything else -> ethertype
//	    (inet) -> other
//	  }
//	table netdev podnet-pods-<k>, k = 0..15 (podnet only: what the inet
//	    family never sees; the ports of ifindex % 16 = k)
//	  sets ports, addrs4; counters drop-arp, drop-vlan, drop-ethertype, spoofed
//	  chain port-<ifindex> { type filter hook ingress device <host veth> priority -500; jump l2 }
//	  chain l2 { iif != @ports accept; IPv4, IPv6 accept (the inet table
//	    judges them); ARP as above; a VLAN TPID -> vlan; else -> ethertype }
//
// In the bridge (and netdev) family the protocol is the EtherType read
// from the link-layer header: meta protocol shows the EtherType behind
// the one VLAN tag the kernel strips into the skb, so a frame tagged VID 0
// would pass as untagged IPv4 and a double-tagged one (0x8100 behind the
// stripped tag) matched no rule at all; the payload expression puts the
// stripped tag back. The pod's link-local address is the EUI-64 one of
// its MAC (ADD sets addr_gen_mode 0 on the pod interface).
//
// Why not rp_filter: the effective value is max(conf/all, conf/<dev>), and
// distributions set all=2 (loose), which accepts any source the node can
// route, another pod's included; IPv6 has none; and in the bridge mode
// pod-to-pod frames are only bridged, never routed.
//
// Keys are interface indexes, which the kernel does not hand out again
// (it counts up per netns), so an element a crash left behind never matches
// a later pod. ADD records the port (whole.go), then writes one
// transaction: the pod's elements (and, routed, its port chain) alone;
// when that fails (first pod of the node, a table, chain or set deleted)
// the tables are written whole from every port's record. podnet-routed's
// Repair writes them whole whenever anything is missing or changed. So
// the common ADD pays for no rule change and no read of the chain: after
// a transaction that removes rules or chains the plugin's exit waits for
// an RCU grace period (about 12 ms: the kernel holds the next close of an
// nftables socket until what was removed is freed), while one that only
// adds takes about 0.1 ms. DEL removes the elements of the attachment's
// host veth (those of prevResult, else found by listing the sets; drop
// says how) and its record, GC those of every interface index that no
// longer exists (and their records and port chains), CHECK looks for the
// pod's elements and the chains' rules. The sets have the timeout flag
// (ADD's elements have no timeout; drop gives one).

// Set names of the pod filter.
const (
	setPorts  = "ports"
	setAddrs4 = "addrs4"
	setAddrs6 = "addrs6"
	setMACs   = "macs"
	// guardChain is the filter's one chain.
	guardChain = "prerouting"
)

// nftTimeout bounds one nftables request: a lost acknowledgement must fail
// the verb (and roll ADD back), not hang it.
const nftTimeout = 10 * time.Second

// Guard is the pod filter of one mode: family inet for podnet (the host
// veth is an L3 interface of the node) and bridge for podnet-bridge (the
// host veth is a port of the bridge; the MAC is checked too).
type Guard struct {
	family nftables.TableFamily
	// dir holds the records of the guarded ports (At; "": the default
	// state dir's)
	dir string
}

// The pod filters of the two modes: podnet's (routed) and podnet-bridge's.
var (
	Routed  = Guard{family: nftables.TableFamilyINet}
	Bridged = Guard{family: nftables.TableFamilyBridge}
)

// Port is what one host veth may send as.
type Port struct {
	Index int              // host veth ifindex in the node netns
	Name  string           // host veth name (the routed mode hooks its L2 chain on it)
	Alias string           // host veth alias (contract.VethOwner.Alias): the record holds only while the link has it
	IPs   []net.IP         // the pod's addresses
	MAC   net.HardwareAddr // the pod interface's MAC: the bridge checks it; its EUI-64 link-local address is the pod's
}

func (g Guard) l2() bool { return g.family == nftables.TableFamilyBridge }

func (g Guard) table() *nftables.Table {
	return &nftables.Table{Family: g.family, Name: contract.PodFilterTable}
}

func (g Guard) chain(t *nftables.Table) *nftables.Chain {
	return &nftables.Chain{
		Name:     guardChain,
		Table:    t,
		Type:     nftables.ChainTypeFilter,
		Hooknum:  nftables.ChainHookPrerouting,
		Priority: nftables.ChainPriorityRaw,
		Policy:   ptr(nftables.ChainPolicyAccept),
	}
}

// sets are the filter's sets, ports first.
func (g Guard) sets(t *nftables.Table) []*nftables.Set {
	concat := func(name string, second nftables.SetDatatype) *nftables.Set {
		return &nftables.Set{Table: t, Name: name, KeyType: nftables.MustConcatSetType(nftables.TypeIFIndex, second), Concatenation: true, HasTimeout: true}
	}
	s := []*nftables.Set{
		{Table: t, Name: setPorts, KeyType: nftables.TypeIFIndex, KeyByteOrder: binaryutil.NativeEndian, HasTimeout: true},
		concat(setAddrs4, nftables.TypeIPAddr),
		concat(setAddrs6, nftables.TypeIP6Addr),
	}
	if g.l2() {
		s = append(s, concat(setMACs, nftables.TypeEtherAddr))
	}
	return s
}

// elements are p's keys per set name.
func (g Guard) elements(p Port) map[string][]nftables.SetElement {
	out := map[string][]nftables.SetElement{setPorts: {{Key: ifKey(p.Index)}}}
	for _, ip := range p.IPs {
		if v4 := ip.To4(); v4 != nil {
			out[setAddrs4] = append(out[setAddrs4], nftables.SetElement{Key: append(ifKey(p.Index), v4...)})
		} else {
			out[setAddrs6] = append(out[setAddrs6], nftables.SetElement{Key: append(ifKey(p.Index), ip.To16()...)})
		}
	}
	if len(p.MAC) == 6 {
		if g.l2() {
			out[setMACs] = []nftables.SetElement{{Key: append(append(ifKey(p.Index), p.MAC...), 0, 0)}}
		}
		// the pod's link-local address (the kernel's EUI-64 one of its
		// MAC; ADD sets addr_gen_mode eui64 on the pod interface): the
		// only link-local address it may send from or claim
		out[setAddrs6] = append(out[setAddrs6], nftables.SetElement{Key: append(ifKey(p.Index), EUI64LinkLocal(p.MAC)...)})
	}
	return out
}

// The routed mode's L2 tables (family netdev, contract.PodFilterL2Table):
// the inet family never sees what is not IP (ARP, a VLAN-tagged frame,
// another EtherType), so each routed host veth gets an ingress base chain
// of its own, port-<ifindex>, hooked on its name, that jumps to its
// table's chain l2: IPv4 and IPv6 go on to the inet table, ARP only from
// the pod's IPv4 address, the rest is dropped and counted. A base chain
// per port: the kernel hooks a netdev chain on named devices only. The
// ports are spread over contract.PodFilterL2Tables tables by interface
// index, each with its own l2 chain, sets and counters: a transaction
// that adds a rule with a verdict (the port chain's jump) makes the kernel
// check every base chain of that table at its commit, which with one
// table for all grew each ADD's guard write with the pods of the node
// (BenchmarkGuardPort: 439-620 µs against 392-434 µs spread, with 1,000
// to 1,500 ports in place); a sixteenth of them costs little. DEL leaves the
// chain (deleting it would make DEL wait for an RCU grace period): it
// hooks a name whose veth is detached (renamed) or gone, and Prune
// removes it with the port's other leftovers.
const l2ChainName = "l2"

// legacyL2Table is the one netdev table of a podnet before the L2 tables
// were spread: a whole write deletes it.
func legacyL2Table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyNetdev, Name: contract.PodFilterTable}
}

func l2Table(k int) *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyNetdev, Name: contract.PodFilterL2Table(k)}
}

// l2TableOf is the L2 table of the port of interface index index.
func l2TableOf(index int) *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyNetdev, Name: contract.PodFilterL2TableOf(index)}
}

func l2Tables() []*nftables.Table {
	out := make([]*nftables.Table, contract.PodFilterL2Tables)
	for k := range out {
		out[k] = l2Table(k)
	}
	return out
}

func portChainName(index int) string { return "port-" + strconv.Itoa(index) }

func portChain(t *nftables.Table, p Port) *nftables.Chain {
	return &nftables.Chain{Name: portChainName(p.Index), Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookIngress, Priority: nftables.ChainPriorityRef(-500), Device: p.Name,
		Policy: ptr(nftables.ChainPolicyAccept)}
}

func portRules() []guardRule {
	return []guardRule{{"the pod filter's L2 rules", []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: l2ChainName}}}}
}

// l2Rules are the rules of the routed mode's chain l2.
func l2Rules() []guardRule {
	rules := []guardRule{
		{"not a pod's host veth", nftutil.Join([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIF, Register: reg1},
			&expr.Lookup{SourceRegister: reg1, SetName: setPorts, Invert: true},
		}, []expr.Any{accept})},
		{"IPv4: judged by the inet table", nftutil.Join(etherType(etherIPv4), []expr.Any{accept})},
		{"IPv6: judged by the inet table", nftutil.Join(etherType(etherIPv6), []expr.Any{accept})},
	}
	rules = append(rules, arpRules(false)...)
	return append(rules, l2Tail()...)
}

// tables are g's tables: the bridge mode's one, the routed mode's inet
// and netdev ones.
func (g Guard) tables() []*nftables.Table {
	if g.l2() {
		return []*nftables.Table{g.table()}
	}
	return append([]*nftables.Table{g.table()}, l2Tables()...)
}

// Tables are g's tables, each with the filter's named counters: the
// bridge mode's one, the routed mode's inet one and its L2 tables.
func (g Guard) Tables() []*nftables.Table { return g.tables() }

// portTables are the tables that hold p's elements (and, routed, its
// port chain): the main table, and the routed mode's L2 table of p.
func (g Guard) portTables(index int) []*nftables.Table {
	if g.l2() {
		return []*nftables.Table{g.table()}
	}
	return []*nftables.Table{g.table(), l2TableOf(index)}
}

func isL2Table(t *nftables.Table) bool { return t.Family == nftables.TableFamilyNetdev }

func (g Guard) counterNames(t *nftables.Table) []string {
	if isL2Table(t) {
		return counters([]string{contract.DropARP, contract.DropVLAN, contract.DropEtherType})
	}
	return counters(g.reasons())
}

func (g Guard) setsOf(t *nftables.Table) []*nftables.Set {
	if isL2Table(t) {
		return g.sets(t)[:2] // ports and addrs4
	}
	return g.sets(t)
}

func (g Guard) chainOf(t *nftables.Table) *nftables.Chain {
	if isL2Table(t) {
		return &nftables.Chain{Name: l2ChainName, Table: t}
	}
	return g.chain(t)
}

func (g Guard) rulesOf(t *nftables.Table) []guardRule {
	if isL2Table(t) {
		return l2Rules()
	}
	return g.rules()
}

// elementsOf are p's elements in table t (one of portTables(p.Index))
// by set name.
func (g Guard) elementsOf(t *nftables.Table, p Port) map[string][]nftables.SetElement {
	main := g.elements(p)
	if isL2Table(t) {
		return map[string][]nftables.SetElement{setPorts: main[setPorts], setAddrs4: main[setAddrs4]}
	}
	return main
}

// queuePort queues p's elements (and, routed, its L2 chain) on c.
func (g Guard) queuePort(c *nftables.Conn, p Port) error {
	for _, t := range g.portTables(p.Index) {
		elems := g.elementsOf(t, p)
		for _, s := range g.setsOf(t) {
			if len(elems[s.Name]) == 0 {
				continue
			}
			if err := c.SetAddElements(s, elems[s.Name]); err != nil {
				return fmt.Errorf("nftables set %s: %w", s.Name, err)
			}
		}
		if isL2Table(t) && p.Name != "" {
			// new (an index is never handed out again; a whole write
			// makes the table afresh): nothing to flush, which would make
			// the transaction one that removes rules
			ch := c.AddChain(portChain(t, p))
			for _, r := range portRules() {
				c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.exprs, UserData: r.userData()})
			}
		}
	}
	return nil
}

// EUI64LinkLocal is the link-local address the kernel gives an interface
// with MAC mac (addr_gen_mode eui64, the default): fe80::/64 with the
// modified EUI-64 interface identifier.
func EUI64LinkLocal(mac net.HardwareAddr) net.IP {
	ip := make(net.IP, 16)
	ip[0], ip[1] = 0xfe, 0x80
	copy(ip[8:], []byte{mac[0] ^ 0x02, mac[1], mac[2], 0xff, 0xfe, mac[3], mac[4], mac[5]})
	return ip
}

// ifKey is an interface index as nftables keys it (host byte order, as
// meta iif loads it).
func ifKey(index int) []byte {
	return binary.NativeEndian.AppendUint32(nil, uint32(index))
}

// keyIndex is the interface index a key of the filter's sets starts with.
func keyIndex(key []byte) (int, bool) {
	if len(key) < 4 {
		return 0, false
	}
	return int(binary.NativeEndian.Uint32(key)), true
}

// newNFT opens one netlink socket for the dumps and the batch of a verb
// (close it with CloseLasting).
// ReceiveBuffer is the receive buffer a socket writing the filter needs:
// the kernel queues one acknowledgement per message of a transaction
// before the writer reads any, and a whole write has a chain and a rule
// per port (a socket buffer is a bound, not memory held).
const ReceiveBuffer = 16 << 20

func newNFT() (*nftables.Conn, error) {
	c, _, err := nftutil.Dial(nftTimeout, 0, ReceiveBuffer)
	return c, err
}

// Install records p (see whole.go) and adds its elements to the filter
// in one transaction. The common ADD sends only them (about 0.1 ms): no
// read of the chain. When that fails (the first pod of the node, the
// table or a set deleted), the filter is written whole, with the elements
// of every port the records describe: never a table holding only this
// pod while the others' are lost. A rule someone deleted or edited while
// the table stayed is put back by Repair, which podnet-routed runs at
// every resync and on every change of the table it hears of (and CHECK
// reports it).
func (g Guard) Install(p Port) error {
	c, err := newNFT()
	if err != nil {
		return fmt.Errorf("write nftables table %s for host veth index %d: %w", g, p.Index, err)
	}
	defer c.CloseLasting()
	return g.InstallOn(c, p)
}

// InstallOn is Install on an open socket: podnet-routed's lasting one,
// when a plugin asks it to guard its new port (the plugin's own socket
// would be closed at its exit, and the kernel holds the netns's nftables
// commit lock through every close of an nftables socket while it waits
// out the grace period of what earlier transactions removed).
func (g Guard) InstallOn(c *nftables.Conn, p Port) error {
	unlock, err := g.lockRecords(false)
	if err != nil {
		return err
	}
	if err := g.writeRecord(p); err != nil {
		unlock()
		return err
	}
	err = g.queuePort(c, p)
	if err == nil {
		err = c.Flush()
	}
	unlock()
	if err != nil {
		if unlock, err = g.lockRecords(true); err != nil {
			return err
		}
		err = g.installWhole(c, p)
		unlock()
	}
	if err != nil {
		hint := ""
		if nftutil.IsNotFound(err) {
			hint = " (the kernel lacks a part of nf_tables the filter needs: the " + familyName(g.family) + " or netdev family, or the modules nft_objref, nft_counter)"
		}
		return fmt.Errorf("write nftables table %s for host veth index %d%s: %w", g, p.Index, hint, err)
	}
	return nil
}

// InstallAllOn is InstallOn for several ports in one transaction: the
// ports of pods that start together, which podnet-routed guards for their
// plugins (one transaction each would queue every later pod behind the
// earlier ones' commits). Each port's record is written first, then one
// transaction adds every recorded port's elements. When the kernel refuses
// it (the first pod of the node, a table deleted, a port's device gone
// before its chain was added), each port is installed alone (InstallOn),
// so one port's failure costs the others nothing. errs[i] is ports[i]'s.
func (g Guard) InstallAllOn(c *nftables.Conn, ports []Port) (errs []error) {
	errs = make([]error, len(ports))
	if len(ports) == 1 {
		errs[0] = g.InstallOn(c, ports[0])
		return errs
	}
	fail := func(i int, err error) {
		errs[i] = fmt.Errorf("write nftables table %s for host veth index %d: %w", g, ports[i].Index, err)
	}
	unlock, err := g.lockRecords(false)
	if err != nil {
		for i := range ports {
			fail(i, err)
		}
		return errs
	}
	queued := 0
	for i, p := range ports {
		if err := g.writeRecord(p); err != nil {
			fail(i, err)
			continue
		}
		if err := g.queuePort(c, p); err != nil {
			fail(i, err)
			continue
		}
		queued++
	}
	if queued == 0 {
		unlock()
		return errs
	}
	err = c.Flush()
	unlock()
	if err == nil {
		return errs
	}
	for i, p := range ports {
		if errs[i] == nil {
			errs[i] = g.InstallOn(c, p)
		}
	}
	return errs
}

// String names the guard's table ("inet podnet-pods").
func (g Guard) String() string { return familyName(g.family) + " " + contract.PodFilterTable }

// intact reports whether the chain holds exactly the filter's rules, in
// order (a missing table or chain is not intact).
func (g Guard) intact(c *nftables.Conn) (bool, error) {
	t := g.table()
	return rulesIntact(c, t, g.chain(t), g.rules())
}

// Verify says what of p's filter is missing: the chain's rules (as many as
// install writes) and p's elements.
func (g Guard) Verify(p Port) error {
	c, err := newNFT()
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	t := g.table()
	where := familyName(g.family) + " " + contract.PodFilterTable
	intact, err := g.intact(c)
	if err != nil {
		return err
	}
	if !intact {
		return fmt.Errorf("nftables chain %s/%s does not hold the pod filter's rules (deleted, added or changed; podnet-routed's next resync writes them again)", where, guardChain)
	}
	if !g.l2() {
		lt := l2TableOf(p.Index)
		for _, ch := range []struct {
			c *nftables.Chain
			r []guardRule
		}{{g.chainOf(lt), l2Rules()}, {portChain(lt, p), portRules()}} {
			if ok, err := rulesIntact(c, lt, ch.c, ch.r); err != nil || !ok {
				return errors.Join(err, fmt.Errorf("nftables chain netdev %s/%s does not hold the pod filter's L2 rules (podnet-routed's next resync writes them again)", lt.Name, ch.c.Name))
			}
		}
	}
	want := g.elements(p)
	for _, s := range g.sets(t) {
		if len(want[s.Name]) == 0 {
			continue
		}
		elems, err := c.GetSetElements(s)
		if err != nil {
			return fmt.Errorf("nftables set %s/%s: %w", where, s.Name, err)
		}
		have := make(map[string]bool, len(elems))
		for _, e := range elems {
			have[string(e.Key)] = true
		}
		for _, e := range want[s.Name] {
			if !have[string(e.Key)] {
				return fmt.Errorf("nftables set %s/%s lacks the element %s of host veth index %d: the pod's packets are dropped", where, s.Name, describeKey(s.Name, e.Key), p.Index)
			}
		}
	}
	return nil
}

// describeKey renders a key of the filter's sets for an error message.
func describeKey(set string, key []byte) string {
	i, _ := keyIndex(key)
	switch set {
	case setAddrs4, setAddrs6:
		return fmt.Sprintf("%d . %s", i, net.IP(key[4:]))
	case setMACs:
		return fmt.Sprintf("%d . %s", i, net.HardwareAddr(key[4:10]))
	}
	return fmt.Sprint(i)
}

func familyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return "inet"
}

func ptr[T any](v T) *T { return &v }
