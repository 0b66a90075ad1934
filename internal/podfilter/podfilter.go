package podfilter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
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
//	table netdev podnet-pods (podnet only: what the inet family never sees)
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

// The routed mode's L2 table (family netdev, same name): the inet family
// never sees what is not IP (ARP, a VLAN-tagged frame, another
// EtherType), so each routed host veth gets an ingress base chain of its
// own, port-<ifindex>, hooked on its name, that jumps to the shared chain
// l2: IPv4 and IPv6 go on to the inet table, ARP only from the pod's
// IPv4 address, the rest is dropped and counted. A base chain per port:
// the kernel hooks a netdev chain on named devices only; adding it costs
// ADD nothing measurable in the transaction that adds the port's
// elements. DEL leaves it (deleting it would make DEL wait for an RCU
// grace period): it hooks a name whose veth is detached (renamed) or
// gone, and Prune removes it with the port's other leftovers.
const l2ChainName = "l2"

func l2Table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyNetdev, Name: contract.PodFilterTable}
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
		{"not a pod's host veth", join([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIF, Register: reg1},
			&expr.Lookup{SourceRegister: reg1, SetName: setPorts, Invert: true},
		}, []expr.Any{accept})},
		{"IPv4: judged by the inet table", join(etherType(etherIPv4), []expr.Any{accept})},
		{"IPv6: judged by the inet table", join(etherType(etherIPv6), []expr.Any{accept})},
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
	return []*nftables.Table{g.table(), l2Table()}
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
		return []*nftables.Set{
			{Table: t, Name: setPorts, KeyType: nftables.TypeIFIndex, KeyByteOrder: binaryutil.NativeEndian, HasTimeout: true},
			{Table: t, Name: setAddrs4, KeyType: nftables.MustConcatSetType(nftables.TypeIFIndex, nftables.TypeIPAddr), Concatenation: true, HasTimeout: true},
		}
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

// elementsByTable are p's elements per table family and set.
func (g Guard) elementsByTable(p Port) map[*nftables.Table]map[string][]nftables.SetElement {
	main := g.elements(p)
	out := map[*nftables.Table]map[string][]nftables.SetElement{g.table(): main}
	if !g.l2() {
		out[l2Table()] = map[string][]nftables.SetElement{setPorts: main[setPorts], setAddrs4: main[setAddrs4]}
	}
	return out
}

// queuePort queues p's elements (and, routed, its L2 chain) on c.
func (g Guard) queuePort(c *nftables.Conn, p Port) error {
	for _, t := range g.tables() {
		var elems map[string][]nftables.SetElement
		for tt, m := range g.elementsByTable(p) {
			if tt.Family == t.Family {
				elems = m
			}
		}
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
func newNFT() (*nftables.Conn, error) {
	c, err := nftables.New(nftables.AsLasting(), nftables.WithSockOptions(func(c *netlink.Conn) error {
		return c.SetDeadline(time.Now().Add(nftTimeout))
	}))
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	return c, nil
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
	unlock, err := g.lockRecords(false)
	if err != nil {
		return err
	}
	if err := g.writeRecord(p); err != nil {
		unlock()
		return err
	}
	c, err := newNFT()
	if err != nil {
		unlock()
		return err
	}
	defer c.CloseLasting()
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
		if isNFTNotFound(err) {
			hint = " (the kernel lacks a part of nf_tables the filter needs: the " + familyName(g.family) + " or netdev family, or the modules nft_objref, nft_counter)"
		}
		return fmt.Errorf("write nftables table %s for host veth index %d%s: %w", g, p.Index, hint, err)
	}
	return nil
}

// String names the guard's table ("inet podnet-pods").
func (g Guard) String() string { return familyName(g.family) + " " + contract.PodFilterTable }

// intact reports whether the chain holds exactly the filter's rules, in
// order (a missing table or chain is not intact).
func (g Guard) intact(c *nftables.Conn) (bool, error) {
	t := g.table()
	return rulesIntact(c, t, g.chain(t), g.rules())
}

// remove removes (see drop) every element of the filter's sets whose
// interface index selects, and returns how many. A missing table or set
// holds nothing to remove. It lists every set: its cost grows with the
// pods of the node.
func (g Guard) remove(selects func(index int) bool) (int, error) {
	return g.removeAfterList(func() (func(int) bool, error) { return selects, nil })
}

// removeAfterList is remove with the selection made only once every set
// has been read: Prune lists the node's links then, so that an element
// an ADD adds meanwhile (always after its veth exists) is never taken
// for a leftover.
func (g Guard) removeAfterList(selection func() (func(int) bool, error)) (int, error) {
	c, err := newNFT()
	if err != nil {
		return 0, err
	}
	defer c.CloseLasting()
	listed := map[string][]nftables.SetElement{}
	for _, s := range g.sets(g.table()) {
		elems, err := c.GetSetElements(s)
		if err != nil {
			if isNFTNotFound(err) {
				continue
			}
			return 0, fmt.Errorf("list nftables set %s %s/%s: %w", familyName(g.family), contract.PodFilterTable, s.Name, err)
		}
		listed[s.Name] = elems
	}
	if len(listed) == 0 {
		return 0, nil
	}
	selects, err := selection()
	if err != nil {
		return 0, err
	}
	gone := map[string][]nftables.SetElement{}
	n := 0
	for set, elems := range listed {
		for _, e := range elems {
			if i, ok := keyIndex(e.Key); ok && selects(i) {
				gone[set] = append(gone[set], nftables.SetElement{Key: e.Key})
				n++
			}
		}
	}
	if !g.l2() {
		g.dropL2(selects)
	}
	if n == 0 {
		return 0, nil
	}
	if err := g.drop(gone); err != nil && !errors.Is(err, errNotAllThere) {
		return 0, err // errNotAllThere: someone else removed some meanwhile
	}
	return n, nil
}

// dropL2 takes the selected ports' elements out of the routed mode's L2
// table, best effort: they key interface indexes the kernel never hands
// out again, so one left behind matches nothing, and the next Prune
// tries again.
func (g Guard) dropL2(selects func(int) bool) {
	c, err := newNFT()
	if err != nil {
		return
	}
	defer c.CloseLasting()
	t := l2Table()
	queued := false
	for _, s := range g.setsOf(t) {
		elems, err := c.GetSetElements(s)
		if err != nil {
			continue
		}
		var timed []nftables.SetElement
		for _, e := range elems {
			if i, ok := keyIndex(e.Key); ok && selects(i) && e.Timeout == 0 {
				timed = append(timed, nftables.SetElement{Key: e.Key, Timeout: expiry})
			}
		}
		if len(timed) > 0 && c.SetAddElements(s, timed) == nil {
			queued = true
		}
	}
	if queued {
		_ = c.Flush()
	}
}

// pruneL2Chains deletes the routed mode's L2 chains of ports that are
// gone (live says which indexes are not).
func pruneL2Chains(live func(int) bool) error {
	c, err := newNFT()
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyNetdev)
	if err != nil {
		return nil
	}
	n := 0
	for _, ch := range chains {
		if ch.Table.Name != contract.PodFilterTable || !strings.HasPrefix(ch.Name, "port-") {
			continue
		}
		i, err := strconv.Atoi(strings.TrimPrefix(ch.Name, "port-"))
		if err != nil || live(i) {
			continue
		}
		c.DelChain(&nftables.Chain{Name: ch.Name, Table: l2Table()})
		n++
	}
	if n == 0 {
		return nil
	}
	if err := c.Flush(); err != nil && !isNFTNotFound(err) {
		return fmt.Errorf("delete %d L2 chains of gone ports from nftables table netdev %s: %w", n, contract.PodFilterTable, err)
	}
	return nil
}

// pruneRecords removes the records of ports whose host veth is gone or
// no longer the one recorded (detached by DEL, or another link).
func (g Guard) pruneRecords(links map[int]vnl.Link) {
	dir := g.recordsDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		r, err := readRecord(dir + "/" + e.Name())
		if err != nil {
			// a record cut short (a crash during ADD's write) goes with
			// its port; anything else is not ours to remove
			if i, aerr := strconv.Atoi(e.Name()); aerr == nil && i > 0 && e.Type().IsRegular() {
				if _, live := links[i]; !live {
					_ = os.Remove(dir + "/" + e.Name())
				}
			}
			continue
		}
		if _, err := portOf(r, e.Name(), links); errors.Is(err, errGone) {
			_ = os.Remove(dir + "/" + e.Name())
		}
	}
}

// removePort removes the elements of the host veth index.
func (g Guard) RemovePort(index int) error {
	_, err := g.remove(func(i int) bool { return i == index })
	if err != nil {
		return err
	}
	return g.RemoveRecord(index)
}

// removeExact removes p's elements without listing the sets. When they
// are not all there (a pod of an older podnet, a prevResult that is not
// what ADD wrote) removePort finds what there is.
func (g Guard) RemoveExact(p Port) error {
	err := g.drop(g.elements(p))
	if errors.Is(err, errNotAllThere) {
		return g.RemovePort(p.Index)
	}
	if err != nil {
		return err
	}
	return g.RemoveRecord(p.Index)
}

// errNotAllThere: an element to delete was not in its set.
var errNotAllThere = errors.New("not every element is in its set")

// expiry is the timeout drop gives the elements it removes.
const expiry = time.Millisecond

// timeoutUpdates says whether drop tries timeouts first; tests turn it off
// to take the path of kernels without element timeout updates.
var timeoutUpdates = true

// drop takes elements (by set name; each set's elements of one interface
// index or more, ports included) out of the filter. Deleting elements
// would make the plugin's exit wait: after a transaction that deletes
// elements, the kernel holds the next close of an nftables socket in the
// netns until an RCU grace period has passed (10-15 ms, and with
// concurrent DELs several of them, up to 70 ms measured). So drop first
// gives them a timeout of 1 ms (the sets have the timeout flag; ADD's
// elements have none): they stop matching at once and the kernel's set
// garbage collection frees them, with no wait. Older kernels (element
// timeout updates came in Linux 6.1x) silently keep an existing element's
// missing timeout; drop sees it (the ports element still there, without a
// timeout) and deletes them, waiting as above.
func (g Guard) drop(elems map[string][]nftables.SetElement) error {
	c, err := newNFT()
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	sets := g.sets(g.table())
	for _, s := range sets {
		if !timeoutUpdates {
			break
		}
		var timed []nftables.SetElement
		for _, e := range elems[s.Name] {
			timed = append(timed, nftables.SetElement{Key: e.Key, Timeout: expiry})
		}
		if len(timed) == 0 {
			continue
		}
		if err := c.SetAddElements(s, timed); err != nil {
			return fmt.Errorf("nftables set %s: %w", s.Name, err)
		}
	}
	where := familyName(g.family) + " " + contract.PodFilterTable
	switch err := c.Flush(); {
	case err != nil && isNFTNotFound(err):
		return nil // no table or set: nothing to remove
	case err == nil && len(elems[setPorts]) > 0:
		found, timed, err := getElement(g.family, setPorts, elems[setPorts][0].Key)
		if err != nil {
			return fmt.Errorf("nftables table %s: %w", where, err)
		}
		if !found || timed {
			return nil // expired already, or will in 1 ms
		}
	}
	// the timeouts did not take (or failed): delete
	for _, s := range sets {
		if len(elems[s.Name]) > 0 {
			if err := c.SetDeleteElements(s, elems[s.Name]); err != nil {
				return fmt.Errorf("nftables set %s: %w", s.Name, err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		if isNFTNotFound(err) {
			return errNotAllThere
		}
		return fmt.Errorf("delete elements from nftables table %s: %w", where, err)
	}
	return nil
}

// getElement looks key up in set of the filter (one request, no dump):
// found is false when it is not there (or has expired), timed when it has
// a timeout.
func getElement(fam nftables.TableFamily, set string, key []byte) (found, timed bool, err error) {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return false, false, fmt.Errorf("netlink: %w", err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(nftTimeout)); err != nil {
		return false, false, err
	}
	keyAttr, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_DATA_VALUE, Data: key}})
	if err != nil {
		return false, false, err
	}
	elem, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_KEY, Data: keyAttr}})
	if err != nil {
		return false, false, err
	}
	list, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: elem}})
	if err != nil {
		return false, false, err
	}
	data, err := netlink.MarshalAttributes([]netlink.Attribute{
		{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: []byte(contract.PodFilterTable + "\x00")},
		{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: []byte(set + "\x00")},
		{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_LIST_ELEMENTS, Data: list},
	})
	if err != nil {
		return false, false, err
	}
	msgs, err := conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETSETELEM), Flags: netlink.Request},
		Data:   append([]byte{byte(fam), unix.NFNETLINK_V0, 0, 0}, data...),
	})
	if err != nil {
		if isNFTNotFound(err) {
			return false, false, nil
		}
		return false, false, fmt.Errorf("get element of set %s: %w", set, err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		found = true
		timed = timed || hasTimeout(m.Data[4:])
	}
	return found, timed, nil
}

// hasTimeout reports whether a NEWSETELEM message's attributes carry an
// element with a timeout or an expiration.
func hasTimeout(b []byte) bool {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return false
	}
	timed := false
	for ad.Next() {
		if ad.Type() != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
			continue
		}
		ad.Nested(func(list *netlink.AttributeDecoder) error {
			for list.Next() {
				list.Nested(func(e *netlink.AttributeDecoder) error {
					for e.Next() {
						if t := e.Type(); t == unix.NFTA_SET_ELEM_TIMEOUT || t == unix.NFTA_SET_ELEM_EXPIRATION {
							timed = true
						}
					}
					return nil
				})
			}
			return nil
		})
	}
	return timed
}

// Prune removes g's elements of every interface the node no longer
// has (a pod whose DEL never came, a crash between a veth's deletion and
// its elements'). The links are listed after the elements: an ADD adds
// its elements only once its veth exists, so one that runs meanwhile
// keeps them. A listing the kernel marks interrupted (links came or went
// while it was dumped, as during a burst of ADDs: it may lack some) is
// retried, and when it stays so each element's link is looked up on its
// own: netlinksafe.LinkList would hand back the incomplete list, and the
// elements of every live pod missing from it would go.
func Prune(g Guard) error {
	_, err := g.removeAfterList(func() (func(int) bool, error) {
		links, err := vnl.LinkList()
		for try := 0; errors.Is(err, vnl.ErrDumpInterrupted) && try < 4; try++ {
			links, err = vnl.LinkList()
		}
		if errors.Is(err, vnl.ErrDumpInterrupted) {
			gone := map[int]bool{}
			return func(i int) bool {
				isGone, ok := gone[i]
				if !ok {
					_, err := vnl.LinkByIndex(i)
					var nf vnl.LinkNotFoundError
					isGone = errors.As(err, &nf)
					gone[i] = isGone
				}
				return isGone
			}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("list links: %w", err)
		}
		live := make(map[int]bool, len(links))
		for _, l := range links {
			live[l.Attrs().Index] = true
		}
		return func(i int) bool { return !live[i] }, nil
	})
	if err != nil {
		return err
	}
	// the records and L2 chains of ports that are gone: after the
	// elements, from a complete list of links taken now (a port added
	// meanwhile has its veth before its record and chain)
	links, lerr := vnl.LinkList()
	if lerr != nil {
		return nil // the next Prune
	}
	byIndex := make(map[int]vnl.Link, len(links))
	for _, l := range links {
		byIndex[l.Attrs().Index] = l
	}
	g.pruneRecords(byIndex)
	if !g.l2() {
		return pruneL2Chains(func(i int) bool { _, ok := byIndex[i]; return ok })
	}
	return nil
}

// Delete deletes the pod filter's tables (both families) from the
// calling thread's netns, elements and counters with them; a missing table
// is fine. It is for uninstalling podnet from a node: every pod left there
// is then unfiltered.
func Delete() error {
	c, err := newNFT()
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	for _, t := range append(Routed.tables(), Bridged.table()) {
		c.DelTable(t)
		if err := c.Flush(); err != nil && !isNFTNotFound(err) {
			return fmt.Errorf("delete nftables table %s %s: %w", familyName(t.Family), contract.PodFilterTable, err)
		}
	}
	return nil
}

// verify says what of p's filter is missing: the chain's rules (as many as
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
		lt := l2Table()
		for _, ch := range []struct {
			c *nftables.Chain
			r []guardRule
		}{{g.chainOf(lt), l2Rules()}, {portChain(lt, p), portRules()}} {
			if ok, err := rulesIntact(c, lt, ch.c, ch.r); err != nil || !ok {
				return errors.Join(err, fmt.Errorf("nftables chain netdev %s/%s does not hold the pod filter's L2 rules (podnet-routed's next resync writes them again)", contract.PodFilterTable, ch.c.Name))
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

func isNFTNotFound(err error) bool {
	// the nftables library flattens some errors into text (%v)
	return errors.Is(err, unix.ENOENT) || errors.Is(err, os.ErrNotExist) || strings.Contains(err.Error(), unix.ENOENT.Error())
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

// guardRule is one rule of the chain and its comment (shown by nft list).
type guardRule struct {
	comment string
	exprs   []expr.Any
}

func (r guardRule) userData() []byte {
	return userdata.AppendString(nil, userdata.TypeComment, r.comment)
}

// Registers: reg 1 holds a single value or the first field of a
// concatenation (the interface index, 4 bytes); the second field starts at
// the next 32-bit register, NFT_REG32_01.
const (
	reg1   = unix.NFT_REG_1
	reg2nd = unix.NFT_REG32_01
)

// l3 is a network protocol as the chain tells it apart: meta nfproto in
// the inet family; in the bridge (and netdev) family the EtherType of the
// frame as sent, read from the link-layer header: meta protocol would show
// the EtherType behind the one VLAN tag the kernel strips into the skb
// (a frame tagged VID 0 would pass as untagged IPv4), the payload
// expression puts the stripped tag back, so a tagged frame of any depth
// is never IPv4, IPv6 or ARP here.
type l3 int

const (
	l3IPv4 l3 = iota
	l3IPv6
	l3ARP
)

// EtherTypes the filter knows.
var (
	etherIPv4 = []byte{0x08, 0x00}
	etherIPv6 = []byte{0x86, 0xdd}
	etherARP  = []byte{0x08, 0x06}
	// VLAN tags: 802.1Q, 802.1ad, and the old QinQ 0x9100
	etherVLAN = [][]byte{{0x81, 0x00}, {0x88, 0xa8}, {0x91, 0x00}}
)

const etherTypeOff = 12 // the EtherType, link-layer header

func etherType(et []byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseLLHeader, Offset: etherTypeOff, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: et},
	}
}

func (g Guard) is(p l3) []expr.Any {
	if g.l2() {
		return etherType(map[l3][]byte{l3IPv4: etherIPv4, l3IPv6: etherIPv6, l3ARP: etherARP}[p])
	}
	nf := map[l3]byte{l3IPv4: unix.NFPROTO_IPV4, l3IPv6: unix.NFPROTO_IPV6}[p]
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{nf}},
	}
}

// icmp6Type matches ICMPv6 messages of type typ.
func icmp6Type(typ byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_ICMPV6}},
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{typ}},
	}
}

// inSet looks up (iif . the len bytes at base+offset) in set; invert
// matches when it is absent.
func inSet(set string, base expr.PayloadBase, offset, length uint32, invert bool) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIF, Register: reg1},
		&expr.Payload{DestRegister: reg2nd, Base: base, Offset: offset, Len: length},
		&expr.Lookup{SourceRegister: reg1, SetName: set, Invert: invert},
	}
}

// isLinkLocal6 matches when the 16 bytes at base+offset are in fe80::/10.
func isLinkLocal6(base expr.PayloadBase, offset uint32) []expr.Any {
	mask := make([]byte, 16)
	mask[0], mask[1] = 0xff, 0xc0
	ll := make([]byte, 16)
	ll[0], ll[1] = 0xfe, 0x80
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: base, Offset: offset, Len: 16},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 16, Mask: mask, Xor: make([]byte, 16)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: ll},
	}
}

// fromUnspecified matches IPv6 from ::.
func fromUnspecified() []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: ipv6Src, Len: 16},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: make([]byte, 16)},
	}
}

// dropFor counts a drop under reason (and under the sums the reason
// belongs to) and drops.
func dropFor(reason string) []expr.Any {
	out := count(contract.PodFilterDropCounter(reason))
	switch reason {
	case contract.DropRouterAdvertisement:
		out = append(out, count(contract.PodFilterRAGuardCounter)...)
	case contract.DropVLAN, contract.DropEtherType, contract.DropOther:
	default:
		out = append(out, count(contract.PodFilterSpoofedCounter)...)
	}
	return append(out, drop)
}

// counters are the named counters of a table: the sums and one per
// reason.
func counters(reasons []string) []string {
	out := []string{contract.PodFilterSpoofedCounter, contract.PodFilterRAGuardCounter}
	for _, r := range reasons {
		out = append(out, contract.PodFilterDropCounter(r))
	}
	return out
}

// reasons are the drop reasons of g's main table.
func (g Guard) reasons() []string {
	if g.l2() {
		return contract.PodFilterDropReasons
	}
	var out []string
	for _, r := range contract.PodFilterDropReasons {
		switch r {
		case contract.DropARP, contract.DropMAC, contract.DropVLAN, contract.DropEtherType:
			continue // the netdev table's, or no such thing on a routed port
		}
		out = append(out, r)
	}
	return out
}

func count(counter string) []expr.Any {
	return []expr.Any{&expr.Objref{Type: int(nftables.ObjTypeCounter), Name: counter}}
}

var (
	accept = &expr.Verdict{Kind: expr.VerdictAccept}
	drop   = &expr.Verdict{Kind: expr.VerdictDrop}
)

func join(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// Header offsets the rules read.
const (
	ipv4Src     = 12 // IPv4 source address, network header
	ipv6Src     = 8  // IPv6 source address, network header
	arpSrcMAC   = 8  // ARP sender hardware address, network header
	arpSrcIP    = 14 // ARP sender protocol address (Ethernet/IPv4 ARP; the kernel drops any other), network header
	etherSrc    = 6  // Ethernet source, link-layer header
	ndTarget    = 8  // Neighbor Solicitation and Advertisement target address, ICMPv6 header
	icmp6MLDRep = 131
	icmp6MLDEnd = 132
	icmp6RA     = 134
	icmp6NS     = 135
	icmp6NA     = 136
	icmp6Redir  = 137
	icmp6MLD2   = 143
)

// rules are the chain's rules, in order (see the top of this file). It is
// an allow-list: what a pod may send is accepted by name, and everything
// else meets a counted drop at the end of the chain (the chain's accept
// policy is for the ports that are not pods').
func (g Guard) rules() []guardRule {
	nh, th, ll := expr.PayloadBaseNetworkHeader, expr.PayloadBaseTransportHeader, expr.PayloadBaseLLHeader
	rules := []guardRule{
		{"not a pod's host veth", join([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIF, Register: reg1},
			&expr.Lookup{SourceRegister: reg1, SetName: setPorts, Invert: true},
		}, []expr.Any{accept})},
	}
	if g.l2() {
		rules = append(rules, guardRule{"source MAC is not the pod's",
			join(inSet(setMACs, ll, etherSrc, 6, true), dropFor(contract.DropMAC))})
	}
	// The fast path: a pod's ordinary traffic (IPv4, and IPv6 other than
	// ICMPv6, from its own address) is accepted here, after 2 or 3 rules.
	// addrs6 holds the pod's own link-local address too.
	rules = append(rules,
		guardRule{"IPv4 from the pod's address", join(g.is(l3IPv4), inSet(setAddrs4, nh, ipv4Src, 4, false), []expr.Any{accept})},
		guardRule{"IPv6 other than ICMPv6 from the pod's address", join(g.is(l3IPv6), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{unix.IPPROTO_ICMPV6}},
		}, inSet(setAddrs6, nh, ipv6Src, 16, false), []expr.Any{accept})},
		guardRule{"router advertisement from a pod", join(g.is(l3IPv6), icmp6Type(icmp6RA), dropFor(contract.DropRouterAdvertisement))},
		guardRule{"redirect from a pod", join(g.is(l3IPv6), icmp6Type(icmp6Redir), dropFor(contract.DropRouterAdvertisement))},
		// a pod's NA for another pod's address (link-local ones included:
		// on the bridge every pod shares the link) would take it over in
		// its neighbors' tables
		guardRule{"neighbor advertisement for an address not the pod's",
			join(g.is(l3IPv6), icmp6Type(icmp6NA), inSet(setAddrs6, th, ndTarget, 16, true), dropFor(contract.DropNeighborAdvert))},
		guardRule{"ICMPv6 from the pod's address", join(g.is(l3IPv6), inSet(setAddrs6, nh, ipv6Src, 16, false), []expr.Any{accept})},
		// from :: only what an address without one sends: DAD for one of
		// its own addresses, and MLD reports
		guardRule{"DAD neighbor solicitation for the pod's address", join(g.is(l3IPv6), fromUnspecified(), icmp6Type(icmp6NS),
			inSet(setAddrs6, th, ndTarget, 16, false), []expr.Any{accept})},
	)
	for _, typ := range []byte{icmp6MLD2, icmp6MLDRep, icmp6MLDEnd} {
		rules = append(rules, guardRule{fmt.Sprintf("MLD (ICMPv6 type %d) from ::", typ), join(g.is(l3IPv6), fromUnspecified(), icmp6Type(typ), []expr.Any{accept})})
	}
	rules = append(rules,
		guardRule{"IPv6 from :: otherwise", join(g.is(l3IPv6), fromUnspecified(), dropFor(contract.DropUnspecified))},
		guardRule{"IPv6 from a link-local address not the pod's", join(g.is(l3IPv6), isLinkLocal6(nh, ipv6Src), dropFor(contract.DropLinkLocal))},
		guardRule{"IPv6 from another address", join(g.is(l3IPv6), dropFor(contract.DropIPv6Source))},
		guardRule{"IPv4 from another address", join(g.is(l3IPv4), dropFor(contract.DropIPv4Source))},
	)
	if g.l2() {
		rules = append(rules, arpRules(true)...)
		rules = append(rules, l2Tail()...)
	} else {
		rules = append(rules, guardRule{"anything else from a pod", dropFor(contract.DropOther)})
	}
	return rules
}

// arpRules admit ARP from the pod's IPv4 address (and probes from
// 0.0.0.0); withMAC: its sender hardware address must be the pod's MAC
// too (the bridge, where the MAC set exists).
func arpRules(withMAC bool) []guardRule {
	nh := expr.PayloadBaseNetworkHeader
	var out []guardRule
	if withMAC {
		out = append(out, guardRule{"ARP with a sender MAC not the pod's", join(etherType(etherARP), inSetPadded(setMACs, nh, arpSrcMAC, 6), dropFor(contract.DropARP))})
	}
	return append(out,
		guardRule{"ARP probe", join(etherType(etherARP), []expr.Any{
			&expr.Payload{DestRegister: reg1, Base: nh, Offset: arpSrcIP, Len: 4},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{0, 0, 0, 0}},
			accept,
		})},
		guardRule{"ARP from the pod's IPv4 address", join(etherType(etherARP), inSet(setAddrs4, nh, arpSrcIP, 4, false), []expr.Any{accept})},
		guardRule{"ARP from another address", join(etherType(etherARP), dropFor(contract.DropARP))},
	)
}

// inSetPadded is inSet (inverted) for a 6-byte MAC, whose set key is
// padded to 8 bytes.
func inSetPadded(set string, base expr.PayloadBase, offset, length uint32) []expr.Any {
	return inSet(set, base, offset, length, true)
}

// l2Tail drops, counted by reason, the frames no rule above allowed:
// tagged ones and other EtherTypes.
func l2Tail() []guardRule {
	var out []guardRule
	for _, vt := range etherVLAN {
		out = append(out, guardRule{fmt.Sprintf("VLAN tag %x", vt), join(etherType(vt), dropFor(contract.DropVLAN))})
	}
	return append(out, guardRule{"any other EtherType", dropFor(contract.DropEtherType)})
}
