package podfilter

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"slices"
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

// Pods send only as themselves. Every packet a pod sends enters the node
// through its host veth, so the host veth's index says which pod sent it.
// The plugins keep, in an nftables table of their own
// (contract.PodFilterTable), which source addresses each host veth may
// carry, and drop the rest before anything else on the node sees it:
//
//	table inet podnet-pods (podnet) / table bridge podnet-pods (podnet-bridge)
//	  counter spoofed, counter ra-Guard
//	  set ports  { type iface_index }                 guarded host veths
//	  set addrs4 { type iface_index . ipv4_addr }     what each may send from
//	  set addrs6 { type iface_index . ipv6_addr }     (bridge: + the EUI-64 link-local)
//	  set macs   { type iface_index . ether_addr }    bridge only
//	  chain prerouting { type filter hook prerouting priority -300
//	    iif != @ports accept                           not a pod: not ours to judge
//	    iif . ether saddr != @macs  -> spoofed, drop   bridge only
//	    IPv4 with (iif . saddr) in @addrs4 accept      the fast path: a pod's
//	    IPv6 not ICMPv6 with (iif . saddr) in @addrs6 accept   ordinary traffic
//	    ICMPv6 Router Advertisement or Redirect -> ra-Guard, drop
//	    ICMPv6 Neighbor Advertisement for a target neither link-local (inet
//	      only) nor (iif . target) in @addrs6 -> spoofed, drop
//	    ARP (bridge only): sender IP 0.0.0.0 or (iif . sender IP) in @addrs4, else spoofed, drop
//	    IPv4: spoofed, drop (its own address was accepted above)
//	    IPv6: saddr fe80::/10, :: (ICMPv6 only: DAD, MLD), or (iif . saddr) in @addrs6, else spoofed, drop
//	  }
//
// Why not rp_filter: the effective value is max(conf/all, conf/<dev>), and
// distributions set all=2 (loose), which accepts any source the node can
// route, another pod's included; IPv6 has none; and in the bridge mode
// pod-to-pod frames are only bridged, never routed. The bridge family's
// prerouting hook sees the receiving port (the pod's host veth) of every
// frame, also of those bridged to another pod; the inet family's sees the
// host veth of the routed mode.
//
// Keys are interface indexes, which the kernel does not hand out again
// (it counts up per netns), so an element a crash left behind never matches
// a later pod. ADD writes one transaction: the pod's elements alone, and
// when that fails (first pod of the node, the table or a set deleted) the
// table, sets and counters (kept when they exist) and the chain flushed and
// written again before them. A rule deleted, inserted or changed while the
// table stayed is put back by Repair, which podnet-routed runs at every
// resync. So the filter never holds a rule twice, and the common ADD pays
// for no rule change and no read of the chain: after a transaction that removes rules (or updates
// the base chain) the plugin's exit waits for an RCU grace period (about
// 12 ms: the kernel holds the next close of an nftables socket until what
// was removed is freed), while one that only adds elements takes about
// 0.1 ms. DEL removes the elements of the attachment's host veth (those of
// prevResult, else found by listing the sets; drop says how), GC those of
// every interface index that no longer exists, CHECK looks for the pod's
// elements and the chain's rules. The sets have the timeout flag (ADD's
// elements have no timeout; drop gives one).

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
}

var (
	Routed  = Guard{family: nftables.TableFamilyINet}
	Bridged = Guard{family: nftables.TableFamilyBridge}
)

// Port is what one host veth may send as.
type Port struct {
	Index int              // host veth ifindex in the node netns
	IPs   []net.IP         // the pod's addresses
	MAC   net.HardwareAddr // the pod interface's MAC (checked in the bridge mode)
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
	if g.l2() && len(p.MAC) == 6 {
		out[setMACs] = []nftables.SetElement{{Key: append(append(ifKey(p.Index), p.MAC...), 0, 0)}}
		// the pod's link-local address (the kernel's EUI-64 one of its
		// MAC): on the shared L2 of the bridge, the only link-local
		// address its Neighbor Advertisements may claim
		out[setAddrs6] = append(out[setAddrs6], nftables.SetElement{Key: append(ifKey(p.Index), EUI64LinkLocal(p.MAC)...)})
	}
	return out
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

// Install adds p's elements to the filter in one transaction. The common
// ADD sends only them (about 0.1 ms): no read of the chain. When that
// fails (the first pod of the node, the table or a set deleted), the
// transaction is sent again with the table, its counters and sets (kept
// when they exist) and the chain flushed and written again. A rule
// someone deleted or edited while the table stayed is put back by Repair,
// which podnet-routed runs at every resync (and CHECK reports it): reading
// the chain on every ADD cost about 0.45 ms of its 0.6.
func (g Guard) Install(p Port) error {
	c, err := newNFT()
	if err != nil {
		return err
	}
	defer c.CloseLasting()
	if err = g.flushInstall(c, p, false); err != nil {
		err = g.flushInstall(c, p, true)
	}
	if err != nil {
		hint := ""
		if isNFTNotFound(err) {
			hint = " (the kernel lacks a part of nf_tables the filter needs: the " + familyName(g.family) + " family, or the modules nft_objref, nft_counter)"
		}
		return fmt.Errorf("write nftables table %s %s for host veth index %d%s: %w", familyName(g.family), contract.PodFilterTable, p.Index, hint, err)
	}
	return nil
}

// String names the guard's table ("inet podnet-pods").
func (g Guard) String() string { return familyName(g.family) + " " + contract.PodFilterTable }

// Repair writes the filter's table, counters, sets and chain again when
// the table exists and its chain is not exactly the filter's rules (a rule
// deleted, inserted or edited, the chain deleted); the sets and their
// elements are kept. A node with no pod of this mode has no table:
// nothing to repair. It reports whether it wrote.
func (g Guard) Repair() (bool, error) {
	c, err := newNFT()
	if err != nil {
		return false, err
	}
	defer c.CloseLasting()
	tables, err := c.ListTablesOfFamily(g.family)
	if err != nil {
		return false, fmt.Errorf("list nftables tables: %w", err)
	}
	if !slices.ContainsFunc(tables, func(t *nftables.Table) bool { return t.Name == contract.PodFilterTable }) {
		return false, nil
	}
	intact, err := g.intact(c)
	if err != nil || intact {
		return false, err
	}
	if err := g.flushInstall(c, Port{}, true); err != nil {
		return false, fmt.Errorf("repair nftables table %s %s: %w", familyName(g.family), contract.PodFilterTable, err)
	}
	return true, nil
}

// flushInstall sends one batch: the filter itself when whole, then p's
// elements.
func (g Guard) flushInstall(c *nftables.Conn, p Port, whole bool) error {
	t := g.table()
	sets := g.sets(t)
	if whole {
		c.AddTable(t)
		for _, name := range []string{contract.PodFilterSpoofedCounter, contract.PodFilterRAGuardCounter} {
			c.AddObj(&nftables.NamedObj{Table: t, Name: name, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}})
		}
		for _, s := range sets {
			if err := c.AddSet(s, nil); err != nil {
				return fmt.Errorf("nftables set %s: %w", s.Name, err)
			}
		}
		ch := c.AddChain(g.chain(t))
		c.FlushChain(ch)
		for _, r := range g.rules() {
			c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: r.exprs, UserData: r.userData()})
		}
	}
	if p.Index == 0 { // Repair: the filter alone
		return c.Flush()
	}
	elems := g.elements(p)
	for _, s := range sets {
		if len(elems[s.Name]) == 0 {
			continue
		}
		if err := c.SetAddElements(s, elems[s.Name]); err != nil {
			return fmt.Errorf("nftables set %s: %w", s.Name, err)
		}
	}
	return c.Flush()
}

// intact reports whether the chain holds exactly the filter's rules, in
// order (a missing table or chain is not intact).
func (g Guard) intact(c *nftables.Conn) (bool, error) {
	t := g.table()
	got, err := c.GetRules(t, g.chain(t))
	if err != nil {
		if isNFTNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("list nftables chain %s %s/%s: %w", familyName(g.family), contract.PodFilterTable, guardChain, err)
	}
	want := g.rules()
	if len(got) != len(want) {
		return false, nil
	}
	for i, r := range want {
		if !bytes.Equal(got[i].UserData, r.userData()) || !reflect.DeepEqual(got[i].Exprs, r.exprs) {
			return false, nil
		}
	}
	return true, nil
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
	if n == 0 {
		return 0, nil
	}
	if err := g.drop(gone); err != nil && !errors.Is(err, errNotAllThere) {
		return 0, err // errNotAllThere: someone else removed some meanwhile
	}
	return n, nil
}

// removePort removes the elements of the host veth index.
func (g Guard) RemovePort(index int) error {
	_, err := g.remove(func(i int) bool { return i == index })
	return err
}

// removeExact removes p's elements without listing the sets. When they
// are not all there (a pod of an older podnet, a prevResult that is not
// what ADD wrote) removePort finds what there is.
func (g Guard) RemoveExact(p Port) error {
	err := g.drop(g.elements(p))
	if errors.Is(err, errNotAllThere) {
		return g.RemovePort(p.Index)
	}
	return err
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
	return err
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
	for _, g := range []Guard{Routed, Bridged} {
		c.DelTable(g.table())
		if err := c.Flush(); err != nil && !isNFTNotFound(err) {
			return fmt.Errorf("delete nftables table %s %s: %w", familyName(g.family), contract.PodFilterTable, err)
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
	if f == nftables.TableFamilyBridge {
		return "bridge"
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
// the inet family, meta protocol (the EtherType, VLAN tag removed) in the
// bridge family.
type l3 int

const (
	l3IPv4 l3 = iota
	l3IPv6
	l3ARP
)

func (g Guard) is(p l3) []expr.Any {
	if g.l2() {
		et := map[l3][]byte{l3IPv4: {0x08, 0x00}, l3IPv6: {0x86, 0xdd}, l3ARP: {0x08, 0x06}}[p]
		return []expr.Any{
			&expr.Meta{Key: expr.MetaKeyPROTOCOL, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: et},
		}
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

// isLinkLocal6 matches when the 16 bytes at base+offset are in fe80::/10
// (or, with invert, are not).
func isLinkLocal6(base expr.PayloadBase, offset uint32, invert bool) []expr.Any {
	mask := make([]byte, 16)
	mask[0], mask[1] = 0xff, 0xc0
	ll := make([]byte, 16)
	ll[0], ll[1] = 0xfe, 0x80
	op := expr.CmpOpEq
	if invert {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: base, Offset: offset, Len: 16},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 16, Mask: mask, Xor: make([]byte, 16)},
		&expr.Cmp{Op: op, Register: reg1, Data: ll},
	}
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
	ipv4Src    = 12 // IPv4 source address, network header
	ipv6Src    = 8  // IPv6 source address, network header
	arpSrcIP   = 14 // ARP sender protocol address (Ethernet/IPv4 ARP; the kernel drops any other), network header
	etherSrc   = 6  // Ethernet source, link-layer header
	ndTarget   = 8  // Neighbor Advertisement target address, ICMPv6 header
	icmp6RA    = 134
	icmp6NA    = 136
	icmp6Redir = 137
)

// rules are the chain's rules, in order (see the top of this file).
func (g Guard) rules() []guardRule {
	spoofed, raGuard := contract.PodFilterSpoofedCounter, contract.PodFilterRAGuardCounter
	nh, th, ll := expr.PayloadBaseNetworkHeader, expr.PayloadBaseTransportHeader, expr.PayloadBaseLLHeader
	rules := []guardRule{
		{"not a pod's host veth", join([]expr.Any{
			&expr.Meta{Key: expr.MetaKeyIIF, Register: reg1},
			&expr.Lookup{SourceRegister: reg1, SetName: setPorts, Invert: true},
		}, []expr.Any{accept})},
	}
	if g.l2() {
		rules = append(rules, guardRule{"source MAC is not the pod's",
			join(inSet(setMACs, ll, etherSrc, 6, true), count(spoofed), []expr.Any{drop})})
	}
	// The fast path: a pod's ordinary traffic (IPv4, and IPv6 other than
	// ICMPv6, from its own address) is accepted here, after 2 or 3 rules,
	// not after all the ICMPv6 and ARP rules below. The verdicts are
	// those of the full chain: the ICMPv6 rules match only ICMPv6 and the
	// ARP rules only ARP, so none of them could have matched these
	// packets before the accept further down.
	rules = append(rules,
		guardRule{"IPv4 from the pod's address", join(g.is(l3IPv4), inSet(setAddrs4, nh, ipv4Src, 4, false), []expr.Any{accept})},
		guardRule{"IPv6 other than ICMPv6 from the pod's address", join(g.is(l3IPv6), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: []byte{unix.IPPROTO_ICMPV6}},
		}, inSet(setAddrs6, nh, ipv6Src, 16, false), []expr.Any{accept})},
	)
	rules = append(rules,
		guardRule{"router advertisement from a pod", join(g.is(l3IPv6), icmp6Type(icmp6RA), count(raGuard), []expr.Any{drop})},
		guardRule{"redirect from a pod", join(g.is(l3IPv6), icmp6Type(icmp6Redir), count(raGuard), []expr.Any{drop})},
	)
	if g.l2() {
		// on the bridge every pod shares the link: a pod's NA for another
		// pod's link-local address would take it over in the node's and the
		// other pods' neighbor tables, so link-local targets are checked
		// too (addrs6 holds the pod's own link-local address)
		rules = append(rules, guardRule{"neighbor advertisement for an address not the pod's",
			join(g.is(l3IPv6), icmp6Type(icmp6NA), inSet(setAddrs6, th, ndTarget, 16, true), count(spoofed), []expr.Any{drop})})
	} else {
		// a routed host veth is the pod's only neighbor, with a neighbor
		// table of its own: link-local targets cannot reach another pod's
		rules = append(rules, guardRule{"neighbor advertisement for an address not the pod's",
			join(g.is(l3IPv6), icmp6Type(icmp6NA), isLinkLocal6(th, ndTarget, true), inSet(setAddrs6, th, ndTarget, 16, true), count(spoofed), []expr.Any{drop})})
	}
	if g.l2() {
		rules = append(rules,
			guardRule{"ARP probe", join(g.is(l3ARP), []expr.Any{
				&expr.Payload{DestRegister: reg1, Base: nh, Offset: arpSrcIP, Len: 4},
				&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{0, 0, 0, 0}},
				accept,
			})},
			guardRule{"ARP from the pod's IPv4 address", join(g.is(l3ARP), inSet(setAddrs4, nh, arpSrcIP, 4, false), []expr.Any{accept})},
			guardRule{"ARP from another address", join(g.is(l3ARP), count(spoofed), []expr.Any{drop})},
		)
	}
	rules = append(rules,
		guardRule{"IPv4 from another address", join(g.is(l3IPv4), count(spoofed), []expr.Any{drop})},
		guardRule{"IPv6 from a link-local address", join(g.is(l3IPv6), isLinkLocal6(nh, ipv6Src, false), []expr.Any{accept})},
		guardRule{"ICMPv6 from :: (DAD, MLD)", join(g.is(l3IPv6), []expr.Any{
			&expr.Payload{DestRegister: reg1, Base: nh, Offset: ipv6Src, Len: 16},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: make([]byte, 16)},
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_ICMPV6}},
			accept,
		})},
		guardRule{"ICMPv6 from the pod's address", join(g.is(l3IPv6), inSet(setAddrs6, nh, ipv6Src, 16, false), []expr.Any{accept})},
		guardRule{"IPv6 from another address", join(g.is(l3IPv6), count(spoofed), []expr.Any{drop})},
	)
	return rules
}
