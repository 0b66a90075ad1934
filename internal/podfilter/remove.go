package podfilter

// Taking ports' elements out of the filter: DEL, GC (Prune), uninstall
// (Delete).

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
)

// remove removes (see drop) every element of the filter's sets whose
// interface index selects, and returns how many. A missing table or set
// holds nothing to remove. It lists every set: its cost grows with the
// pods of the node.
func (g Guard) remove(selects func(index int) bool) (int, error) {
	s, err := dialSock()
	if err != nil {
		return 0, err
	}
	defer s.close()
	return g.removeAfterList(s, func() (func(int) bool, error) { return selects, nil })
}

// sock is one nftables socket and its netlink side (the raw requests of
// getElement), for every request of a removal: each close of a netfilter
// socket takes the netns's nftables commit lock, and waits there for what
// recent transactions replaced to be freed (an RCU grace period), which
// every writer of the node then waits for.
type sock struct {
	c   *nftables.Conn
	raw *netlink.Conn
}

func dialSock() (sock, error) {
	c, raw, err := nftutil.Dial(nftTimeout, 0, ReceiveBuffer)
	return sock{c, raw}, err
}

func (s sock) close() { s.c.CloseLasting() }

// removeAfterList is remove with the selection made only once every set
// has been read: Prune lists the node's links then, so that an element
// an ADD adds meanwhile (always after its veth exists) is never taken
// for a leftover.
func (g Guard) removeAfterList(s sock, selection func() (func(int) bool, error)) (int, error) {
	c := s.c
	listed := map[string][]nftables.SetElement{}
	for _, set := range g.sets(g.table()) {
		elems, err := c.GetSetElements(set)
		if err != nil {
			if nftutil.IsNotFound(err) {
				continue
			}
			return 0, fmt.Errorf("list nftables set %s %s/%s: %w", familyName(g.family), contract.PodFilterTable, set.Name, err)
		}
		listed[set.Name] = elems
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
		g.dropL2(s.c, selects)
	}
	if n == 0 {
		return 0, nil
	}
	if err := g.drop(s, gone); err != nil && !errors.Is(err, errNotAllThere) {
		return 0, err // errNotAllThere: someone else removed some meanwhile
	}
	return n, nil
}

// dropL2 takes the selected ports' elements out of the routed mode's L2
// tables, best effort: they key interface indexes the kernel never hands
// out again, so one left behind matches nothing, and the next Prune
// tries again.
func (g Guard) dropL2(c *nftables.Conn, selects func(int) bool) {
	queued := false
	for _, s := range l2Sets(g) {
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

// l2Sets are the sets of every L2 table of the routed mode.
func l2Sets(g Guard) []*nftables.Set {
	var out []*nftables.Set
	for _, t := range l2Tables() {
		out = append(out, g.setsOf(t)...)
	}
	return out
}

// pruneL2Chains deletes the routed mode's L2 chains of ports that are
// gone (live says which indexes are not).
func pruneL2Chains(c *nftables.Conn, live func(int) bool) error {
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyNetdev)
	if err != nil {
		return nil
	}
	n := 0
	for _, ch := range chains {
		if !contract.IsPodFilterL2Table(ch.Table.Name) || !strings.HasPrefix(ch.Name, "port-") {
			continue
		}
		i, err := strconv.Atoi(strings.TrimPrefix(ch.Name, "port-"))
		if err != nil || live(i) {
			continue
		}
		c.DelChain(&nftables.Chain{Name: ch.Name, Table: &nftables.Table{Family: nftables.TableFamilyNetdev, Name: ch.Table.Name}})
		n++
	}
	if n == 0 {
		return nil
	}
	if err := c.Flush(); err != nil && !nftutil.IsNotFound(err) {
		return fmt.Errorf("delete %d L2 chains of gone ports from the nftables tables netdev %s-*: %w", n, contract.PodFilterTable, err)
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

// RemovePort removes the elements of the host veth index, and its record.
// Both under the records' shared lock (see removing).
func (g Guard) RemovePort(index int) error {
	unlock, err := g.removing()
	if err != nil {
		return err
	}
	defer unlock()
	return g.removePort(index)
}

func (g Guard) removePort(index int) error {
	s, err := dialSock()
	if err != nil {
		return err
	}
	defer s.close()
	return g.removePortOn(s, index)
}

func (g Guard) removePortOn(s sock, index int) error {
	_, err := g.removeAfterList(s, func() (func(int) bool, error) { return func(i int) bool { return i == index }, nil })
	if err != nil {
		return err
	}
	return g.RemoveRecord(index)
}

// RemoveExact removes p's elements without listing the sets, and its
// record. When they are not all there (a pod of an older podnet, a
// prevResult that is not what ADD wrote) RemovePort finds what there is.
// Both under the records' shared lock (see removing).
func (g Guard) RemoveExact(p Port) error {
	unlock, err := g.removing()
	if err != nil {
		return err
	}
	defer unlock()
	s, err := dialSock()
	if err != nil {
		return err
	}
	defer s.close()
	return g.removeExactOn(s, p)
}

// removeExactOn removes p's elements and record on s; callers hold the
// records' shared lock (removing).
func (g Guard) removeExactOn(s sock, p Port) error {
	err := g.drop(s, g.elements(p))
	if errors.Is(err, errNotAllThere) {
		return g.removePortOn(s, p.Index)
	}
	if err != nil {
		return err
	}
	return g.RemoveRecord(p.Index)
}

// RemoveExactOn is RemoveExact on c (raw: its netlink side), a socket
// the caller keeps: podnet-routed takes a DEL's port out for the plugin
// on its own socket, as it puts ADD's in, so that no plugin process
// closes an nftables socket after a removal (see the daemon's
// GuardPort). With no IPs it is RemovePort on c.
func (g Guard) RemoveExactOn(c *nftables.Conn, raw *netlink.Conn, p Port) error {
	unlock, err := g.removing()
	if err != nil {
		return err
	}
	defer unlock()
	s := sock{c, raw}
	if len(p.IPs) == 0 {
		return g.removePortOn(s, p.Index)
	}
	return g.removeExactOn(s, p)
}

// removing takes the records' lock, shared, for a removal of a port's
// elements and record: a whole write (exclusive) rebuilds the filter from
// the records, and one between the two would put the port's elements
// back from its record just before the record goes, for good. Without a
// records directory there is nothing such a write could restore, and
// none is made.
func (g Guard) removing() (func(), error) {
	unlock, err := g.lockRecordsMaybe(false, false)
	if errors.Is(err, fs.ErrNotExist) {
		return func() {}, nil
	}
	return unlock, err
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
func (g Guard) drop(sk sock, elems map[string][]nftables.SetElement) error {
	c := sk.c
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
	case err != nil && nftutil.IsNotFound(err):
		return nil // no table or set: nothing to remove
	case err == nil && len(elems[setPorts]) > 0:
		found, timed, err := getElement(sk.raw, g.family, setPorts, elems[setPorts][0].Key)
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
		if nftutil.IsNotFound(err) {
			return errNotAllThere
		}
		return fmt.Errorf("delete elements from nftables table %s: %w", where, err)
	}
	return nil
}

// getElement looks key up in set of the filter (one request, no dump):
// found is false when it is not there (or has expired), timed when it has
// a timeout.
func getElement(conn *netlink.Conn, fam nftables.TableFamily, set string, key []byte) (found, timed bool, err error) {
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
		if nftutil.IsNotFound(err) {
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
	s, err := dialSock()
	if err != nil {
		return err
	}
	defer s.close()
	return PruneOn(g, s.c, s.raw)
}

// PruneOn is Prune on an open socket (podnet-routed's lasting one; see
// sock) and its netlink side.
func PruneOn(g Guard, c *nftables.Conn, raw *netlink.Conn) error {
	s := sock{c, raw}
	_, err := g.removeAfterList(s, func() (func(int) bool, error) {
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
		return pruneL2Chains(s.c, func(i int) bool { _, ok := byIndex[i]; return ok })
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
	for _, t := range append(append(Routed.tables(), legacyL2Table()), Bridged.table()) {
		if err := nftutil.DeleteTable(c, t); err != nil {
			return fmt.Errorf("%s: %w", familyName(t.Family), err)
		}
	}
	return nil
}
