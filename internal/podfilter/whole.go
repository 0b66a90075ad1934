package podfilter

// The filter written whole, from the state that should be there.
//
// Where the desired elements come from: a record per guarded port, which
// the plugin writes at ADD before the port's elements and removes at DEL
// (and GC, and Prune once the port is gone), under the node state dir:
//
//	<stateDir>/pod-filter/<mode>/<host veth ifindex>   {"index","name","alias","ips","mac"}
//
// Not the damaged table (a deleted table holds nothing), and not the IPAM
// store's owner records: those exist only with podnet-ipam (a conflist
// may use host-local), and know neither the host veth's index nor the
// pod's MAC. A record is a file on disk, so it is trusted only as far as
// it agrees with the kernel: it counts only while a live host veth (a
// veth named pn…, in service) has its index, its name and its alias; its
// addresses must be unicast and not link-local (the pod's link-local
// address is derived from its MAC, never taken from the file), at most
// maxRecordIPs; a file that is not a regular file of at most
// maxRecordSize bytes, or not exactly a record, is skipped. An address
// two records claim goes to the newer port (the higher ifindex: the
// kernel hands them out counting up). So a forged record can at worst
// widen what a live pod's own port may send as, which only root can
// write (the directory is 0700).
//
// Writers serialise on a lock file in the mode's record directory: ADD
// takes it shared around its record and its elements, a whole write
// (ADD's fallback, podnet-routed's Repair) exclusive around reading the
// records and replacing the table, so a whole write never replaces a
// table with one that lacks the elements of an ADD that ran meanwhile.
// The common ADD pays a flock and a small file on tmpfs (tens of µs).

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/internal/nodestate"
)

const (
	maxRecordSize = 4096
	maxRecordIPs  = 8
	recordsSubdir = "pod-filter"
	lockName      = ".lock"
)

// Record is what a guarded port's record file holds.
type Record struct {
	Index int      `json:"index"`
	Name  string   `json:"name"`
	Alias string   `json:"alias"`
	IPs   []string `json:"ips"`
	MAC   string   `json:"mac"`
}

// At is g with its records under stateDir ("" : nodestate.DefaultDir).
func (g Guard) At(stateDir string) Guard {
	if stateDir == "" {
		stateDir = nodestate.DefaultDir
	}
	g.dir = filepath.Join(stateDir, recordsSubdir, g.Mode())
	return g
}

// Mode is "routed" or "bridge".
func (g Guard) Mode() string {
	if g.l2() {
		return "bridge"
	}
	return "routed"
}

func (g Guard) recordsDir() string {
	if g.dir == "" {
		return g.At("").dir
	}
	return g.dir
}

// lockRecords takes the mode's lock, shared or exclusive; release it with
// the returned func.
func (g Guard) lockRecords(exclusive bool) (func(), error) {
	return g.lockRecordsMaybe(exclusive, true)
}

// lockRecordsMaybe is lockRecords; without create, a records directory
// that does not exist is an error wrapping fs.ErrNotExist, not made.
func (g Guard) lockRecordsMaybe(exclusive, create bool) (func(), error) {
	dir := g.recordsDir()
	open := func() (int, error) {
		return unix.Open(filepath.Join(dir, lockName), unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	}
	fd, err := open()
	if errors.Is(err, unix.ENOENT) && create {
		if err = os.MkdirAll(dir, 0o700); err == nil {
			fd, err = open()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("pod filter lock %s: %w", dir, err)
	}
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	for {
		err = unix.Flock(fd, how)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("pod filter lock %s: %w", dir, err)
	}
	return func() { unix.Close(fd) }, nil
}

// writeRecord writes p's record. One create and write, no temporary file
// and rename (which cost ADD about 0.3 ms more where /run is no tmpfs):
// an index is never handed out again, so the name is new, and a record
// cut short by a crash is refused when read and removed once its port is
// gone.
func (g Guard) writeRecord(p Port) error {
	r := Record{Index: p.Index, Name: p.Name, Alias: p.Alias, MAC: p.MAC.String()}
	for _, ip := range p.IPs {
		r.IPs = append(r.IPs, ip.String())
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	path := filepath.Join(g.recordsDir(), strconv.Itoa(p.Index))
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err == nil {
		_, err = unix.Write(fd, b)
		if cerr := unix.Close(fd); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return fmt.Errorf("pod filter record of host veth index %d: %w", p.Index, err)
	}
	return nil
}

// RemoveRecord removes the record of host veth index (none: fine).
func (g Guard) RemoveRecord(index int) error {
	err := os.Remove(filepath.Join(g.recordsDir(), strconv.Itoa(index)))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("pod filter record of host veth index %d: %w", index, err)
	}
	return nil
}

// readRecord reads one record file, refusing anything but a small regular
// file holding exactly a record.
func readRecord(path string) (Record, error) {
	var r Record
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return r, err
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return r, err
	}
	if !st.Mode().IsRegular() || st.Size() > maxRecordSize {
		return r, fmt.Errorf("not a regular file of at most %d bytes", maxRecordSize)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxRecordSize+1))
	if err != nil {
		return r, err
	}
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return r, fmt.Errorf("not a record: %w", err)
	}
	if dec.More() {
		return r, errors.New("not a record: trailing data")
	}
	return r, nil
}

// portOf validates r against the live link of its index.
func portOf(r Record, name string, links map[int]vnl.Link) (Port, error) {
	if strconv.Itoa(r.Index) != name || r.Index <= 0 {
		return Port{}, fmt.Errorf("index %d in a file named %q", r.Index, name)
	}
	l, ok := links[r.Index]
	if !ok {
		return Port{}, errGone
	}
	a := l.Attrs()
	if a.Name != r.Name || a.Alias != r.Alias || !contract.IsHostVeth(a.Name) || l.Type() != "veth" {
		return Port{}, errGone // another link by now (or detached by DEL)
	}
	if _, detached, ok := contract.ParseVethAlias(a.Alias); !ok || detached {
		return Port{}, errGone
	}
	mac, err := net.ParseMAC(r.MAC)
	if err != nil || len(mac) != 6 || mac[0]&1 != 0 || slices.Equal([]byte(mac), make([]byte, 6)) {
		return Port{}, fmt.Errorf("MAC %q is not a unicast Ethernet address", r.MAC)
	}
	if len(r.IPs) == 0 || len(r.IPs) > maxRecordIPs {
		return Port{}, fmt.Errorf("%d addresses (1 to %d)", len(r.IPs), maxRecordIPs)
	}
	p := Port{Index: r.Index, Name: r.Name, Alias: r.Alias, MAC: mac}
	for _, s := range r.IPs {
		ip := net.ParseIP(s)
		if ip == nil || ip.IsUnspecified() || ip.IsLoopback() || ip.IsMulticast() || ip.IsLinkLocalUnicast() || ip.Equal(net.IPv4bcast) {
			return Port{}, fmt.Errorf("address %q is not a pod's", s)
		}
		p.IPs = append(p.IPs, ip)
	}
	return p, nil
}

var errGone = errors.New("no live host veth of this index, name and alias")

// Desired reads the mode's records and returns the ports they describe
// that are live, by index, and what was refused (records of ports that
// are gone are not refusals: Prune removes them).
func (g Guard) Desired() (ports []Port, refused []string, err error) {
	dir := g.recordsDir()
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("pod filter records: %w", err)
	}
	links, err := liveLinks()
	if err != nil {
		return nil, nil, err
	}
	owner := map[string]int{} // address -> index of the port it goes to
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		r, err := readRecord(filepath.Join(dir, e.Name()))
		var p Port
		if err == nil {
			p, err = portOf(r, e.Name(), links)
		}
		if errors.Is(err, errGone) {
			continue
		}
		if err != nil {
			refused = append(refused, fmt.Sprintf("record %s: %v", filepath.Join(dir, e.Name()), err))
			continue
		}
		ports = append(ports, p)
		for _, ip := range p.IPs {
			if other, ok := owner[ip.String()]; !ok || other < p.Index {
				owner[ip.String()] = p.Index
			}
		}
	}
	sort.Slice(ports, func(i, j int) bool { return ports[i].Index < ports[j].Index })
	for i := range ports {
		kept := ports[i].IPs[:0:0]
		for _, ip := range ports[i].IPs {
			if owner[ip.String()] == ports[i].Index {
				kept = append(kept, ip)
			} else {
				refused = append(refused, fmt.Sprintf("address %s of host veth %s (index %d): a newer port's record claims it", ip, ports[i].Name, ports[i].Index))
			}
		}
		ports[i].IPs = kept
	}
	return ports, refused, nil
}

// liveLinks are the node's links by index (a dump the kernel marks
// interrupted is retried).
func liveLinks() (map[int]vnl.Link, error) {
	links, err := vnl.LinkList()
	for try := 0; errors.Is(err, vnl.ErrDumpInterrupted) && try < 8; try++ {
		links, err = vnl.LinkList()
	}
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	out := make(map[int]vnl.Link, len(links))
	for _, l := range links {
		out[l.Attrs().Index] = l
	}
	return out, nil
}

// installWhole replaces the filter's table(s) with the whole filter and
// the elements of every port the records describe, p included (its
// record was written just before), and of live ports without a record
// whose elements the table holds. Counters keep their values. The
// caller holds the exclusive lock.
func (g Guard) installWhole(c *nftables.Conn, p Port) error {
	ports, _, err := g.Desired()
	if err != nil {
		return err
	}
	if p.Index != 0 && !slices.ContainsFunc(ports, func(q Port) bool { return q.Index == p.Index }) {
		ports = append(ports, p)
	}
	// the pods of a podnet before records (an upgrade): what the table
	// still holds of them stays
	ports = append(ports, g.unrecorded(c, ports)...)
	return g.writeWhole(c, ports)
}

// writeWhole replaces the table(s) with the filter and ports' elements in
// one transaction (and, routed, deletes an older podnet's one L2 table).
// Counters keep their values.
func (g Guard) writeWhole(c *nftables.Conn, ports []Port) error {
	var legacy map[string]expr.Counter // what an older podnet's L2 table counted
	if !g.l2() {
		if ok, _ := nftutil.TableExists(c, legacyL2Table()); ok {
			legacy, _ = nftutil.ReadCounters(c, legacyL2Table())
			c.DelTable(legacyL2Table())
		}
	}
	for i, t := range g.tables() {
		kept, _ := nftutil.ReadCounters(c, t)
		if isL2Table(t) && i == 1 && len(legacy) > 0 {
			if kept == nil {
				kept = map[string]expr.Counter{}
			}
			for name, v := range legacy {
				k := kept[name]
				k.Packets += v.Packets
				k.Bytes += v.Bytes
				kept[name] = k
			}
		}
		if err := g.spec(t).QueueWhole(c, kept, setElementsPerMessage); err != nil {
			return err
		}
	}
	for _, p := range ports {
		if err := g.queuePort(c, p); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("write nftables table %s whole (%d ports): %w", g, len(ports), err)
	}
	return nil
}

// spec is table t of the filter as data, without elements.
func (g Guard) spec(t *nftables.Table) *nftutil.Table {
	spec := &nftutil.Table{Family: t.Family, Name: t.Name, Counters: g.counterNames(t)}
	for _, s := range g.setsOf(t) {
		spec.Sets = append(spec.Sets, nftutil.Set{Def: *s})
	}
	ch := nftutil.Chain{Def: *g.chainOf(t)}
	for _, r := range g.rulesOf(t) {
		ch.Rules = append(ch.Rules, r.exprs)
		ch.UserData = append(ch.UserData, r.userData())
	}
	spec.Chains = []nftutil.Chain{ch}
	return spec
}

// setElementsPerMessage bounds the elements of one message of a whole
// write (their list is one netlink attribute, whose length is 16 bits).
const setElementsPerMessage = 1000

// Repair checks the filter against the records and, when anything is
// missing or changed (a table, chain, rule, set, counter or element
// deleted, a rule inserted or edited: `nft delete table`, `nft flush
// ruleset`, a firewall reload), writes it whole: the filter and the
// elements of every live port the records describe, and of live ports an
// older podnet guarded without a record. Nothing to guard (no record, no
// table) is nothing to repair. why says what it found ("" when it did
// not write); refused lists the records it would not trust.
func (g Guard) Repair() (why string, refused []string, err error) {
	c, err := newNFT()
	if err != nil {
		return "", nil, err
	}
	defer c.CloseLasting()
	return g.RepairOn(c)
}

// RepairOn is Repair on an open socket (podnet-routed's lasting one: the
// kernel takes the netns's nftables commit lock at every close of a
// netfilter socket, and waits there for what recent transactions
// replaced to be freed, which every writer on the node then waits for).
// The socket needs a receive buffer of ReceiveBuffer for a whole write.
func (g Guard) RepairOn(c *nftables.Conn) (why string, refused []string, err error) {
	// checked under the shared lock, so that ADDs go on meanwhile; an ADD
	// between its record and its elements looks like a missing element:
	// checked again under the exclusive lock before anything is written
	why, refused, err = g.repair(c, false)
	if err != nil || why == "" {
		return why, refused, err
	}
	return g.repair(c, true)
}

// repair checks the filter under the lock (exclusive: and writes it whole
// when it differs).
func (g Guard) repair(c *nftables.Conn, exclusive bool) (why string, refused []string, err error) {
	unlock, err := g.lockRecords(exclusive)
	if err != nil {
		return "", nil, err
	}
	defer unlock()
	ports, refused, err := g.Desired()
	if err != nil {
		return "", refused, err
	}
	exists, err := nftutil.TableExists(c, g.table())
	if err != nil {
		return "", refused, err
	}
	if !exists && len(ports) == 0 {
		return "", refused, nil
	}
	why, err = g.differs(c, ports)
	if err != nil || why == "" || !exclusive {
		return why, refused, err
	}
	ports = append(ports, g.unrecorded(c, ports)...)
	if err := g.writeWhole(c, ports); err != nil {
		return "", refused, fmt.Errorf("repair nftables table %s (%s): %w", g, why, err)
	}
	return why, refused, nil
}

// unrecorded are the live podnet host veths with elements in the main
// table but no record (attached by a podnet before records): a whole
// write keeps exactly what the table holds of them.
func (g Guard) unrecorded(c *nftables.Conn, recorded []Port) []Port {
	links, err := liveLinks()
	if err != nil {
		return nil
	}
	byIndex := map[int]*Port{}
	for _, s := range g.sets(g.table()) {
		elems, err := c.GetSetElements(s)
		if err != nil {
			continue
		}
		for _, e := range elems {
			i, ok := keyIndex(e.Key)
			if !ok || slices.ContainsFunc(recorded, func(p Port) bool { return p.Index == i }) {
				continue
			}
			l, live := links[i]
			if !live {
				continue
			}
			if _, detached, ok := contract.ParseVethAlias(l.Attrs().Alias); !ok || detached {
				continue
			}
			p := byIndex[i]
			if p == nil {
				p = &Port{Index: i, Name: l.Attrs().Name, Alias: l.Attrs().Alias}
				byIndex[i] = p
			}
			switch s.Name {
			case setAddrs4, setAddrs6:
				p.IPs = append(p.IPs, slices.Clone(net.IP(e.Key[4:])))
			case setMACs:
				p.MAC = slices.Clone(net.HardwareAddr(e.Key[4:10]))
			}
		}
	}
	var out []Port
	for _, p := range byIndex {
		if len(p.MAC) == 6 { // elements() adds its link-local address
			ll := EUI64LinkLocal(p.MAC)
			p.IPs = slices.DeleteFunc(p.IPs, func(ip net.IP) bool { return ip.Equal(ll) })
		}
		out = append(out, *p)
	}
	return out
}

// ByMode is the pod filter of a mode as Mode names it ("routed",
// "bridge"); false for any other name.
func ByMode(mode string) (Guard, bool) {
	switch mode {
	case Routed.Mode():
		return Routed, true
	case Bridged.Mode():
		return Bridged, true
	}
	return Guard{}, false
}
