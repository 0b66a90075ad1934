package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/test/nettest"
)

// Snapshot is the state of a netns: what `ip -d link`, `ip addr`, `ip
// route show table all`, `ip neigh show nud permanent` and `nft list
// ruleset` would show, one sorted line per item.
type Snapshot struct {
	Links, Addrs, Routes, Neighs, NFT []string
}

// Diff lists what differs, "-" for lines only in s and "+" for lines only
// in o ("" when equal).
func (s Snapshot) Diff(o Snapshot) string {
	var b strings.Builder
	diffLines(&b, "link", s.Links, o.Links)
	diffLines(&b, "addr", s.Addrs, o.Addrs)
	diffLines(&b, "route", s.Routes, o.Routes)
	diffLines(&b, "neigh", s.Neighs, o.Neighs)
	diffLines(&b, "nft", s.NFT, o.NFT)
	return b.String()
}

func diffLines(b *strings.Builder, what string, x, y []string) {
	for _, l := range x {
		if !slices.Contains(y, l) {
			fmt.Fprintf(b, "  %s -%s\n", what, l)
		}
	}
	for _, l := range y {
		if !slices.Contains(x, l) {
			fmt.Fprintf(b, "  %s +%s\n", what, l)
		}
	}
}

// Snapshot records the node netns' state.
func (n *Node) Snapshot() (Snapshot, error) { return TakeSnapshot(n.NS) }

// TakeSnapshot records a netns' state.
func TakeSnapshot(netns *NetNS) (Snapshot, error) {
	var s Snapshot
	err := netns.Do(func() error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		names := map[int]string{}
		for _, l := range links {
			names[l.Attrs().Index] = l.Attrs().Name
		}
		for _, l := range links {
			a := l.Attrs()
			state := "down"
			if a.Flags&net.FlagUp != 0 {
				state = "up"
			}
			line := fmt.Sprintf("%s type %s mtu %d %s mac %s", a.Name, l.Type(), a.MTU, state, a.HardwareAddr)
			if a.MasterIndex > 0 {
				line += " master " + names[a.MasterIndex]
			}
			if v, ok := l.(*netlink.Vxlan); ok {
				line += fmt.Sprintf(" vni %d port %d", v.VxlanId, v.Port)
			}
			s.Links = append(s.Links, line)
		}
		addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			s.Addrs = append(s.Addrs, fmt.Sprintf("%s %s scope %d", names[a.LinkIndex], a.IPNet, a.Scope))
		}
		routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, r := range routes {
			s.Routes = append(s.Routes, fmtRoute(r, names))
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			neighs, err := netlink.NeighList(0, fam)
			if err != nil {
				return err
			}
			for _, nb := range neighs {
				if nb.State&netlink.NUD_PERMANENT != 0 {
					s.Neighs = append(s.Neighs, fmt.Sprintf("%s dev %s lladdr %s permanent", nb.IP, names[nb.LinkIndex], nb.HardwareAddr))
				}
			}
		}
		// VXLAN forwarding entries (bridge fdb) count as neighbours here.
		for _, l := range links {
			if _, ok := l.(*netlink.Vxlan); !ok {
				continue
			}
			fdb, err := netlink.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
			if err != nil {
				return err
			}
			for _, f := range fdb {
				s.Neighs = append(s.Neighs, fmt.Sprintf("fdb %s dst %s dev %s", f.HardwareAddr, f.IP, names[f.LinkIndex]))
			}
		}
		return nil
	})
	if err != nil {
		return s, fmt.Errorf("snapshot of %s: %w", netns.Name, err)
	}
	nft, err := nftables.New(nftables.WithNetNSFd(int(netns.Fd())))
	if err != nil {
		return s, err
	}
	if s.NFT, err = nftLines(nft); err != nil {
		return s, fmt.Errorf("nft in %s: %w", netns.Name, err)
	}
	for _, l := range [][]string{s.Links, s.Addrs, s.Routes, s.Neighs} {
		slices.Sort(l)
	}
	return s, nil
}

// StableSnapshot waits until two snapshots 200 ms apart agree (carrier
// and IPv6 link-local addresses settle after a link comes up).
func (n *Node) StableSnapshot() (Snapshot, error) {
	prev, err := n.Snapshot()
	if err != nil {
		return prev, err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		time.Sleep(200 * time.Millisecond)
		cur, err := n.Snapshot()
		if err != nil {
			return cur, err
		}
		d := prev.Diff(cur)
		if d == "" {
			return cur, nil
		}
		if time.Now().After(deadline) {
			return cur, fmt.Errorf("%s: netns state does not settle:\n%s", n.Name, d)
		}
		prev = cur
	}
}

// fmtRoute renders a route with every field that matters for equality.
func fmtRoute(r netlink.Route, names map[int]string) string { return FormatRoute(r, names, true) }

// FormatRoute renders a route like `ip route` (nettest.FormatRoute).
func FormatRoute(r netlink.Route, names map[int]string, full bool) string {
	return nettest.FormatRoute(r, names, full)
}

// LinkNames maps the link indexes of the calling thread's netns to names.
func LinkNames() (map[int]string, error) { return nettest.LinkIndexNames() }

// nftLines renders every table, set, chain and rule of an nftables
// connection, in kernel order.
func nftLines(nft *nftables.Conn) ([]string, error) {
	tables, err := nft.ListTables()
	if err != nil {
		return nil, err
	}
	chains, err := nft.ListChains()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, t := range tables {
		out = append(out, fmt.Sprintf("table %s %s", nftFamily(t.Family), t.Name))
		sets, err := nft.GetSets(t)
		if err != nil {
			return nil, err
		}
		for _, s := range sets {
			out = append(out, fmt.Sprintf("  set %s", s.Name))
		}
		for _, ch := range chains {
			if ch.Table.Name != t.Name || ch.Table.Family != t.Family {
				continue
			}
			line := "  chain " + ch.Name
			if ch.Hooknum != nil {
				line += fmt.Sprintf(" hook %d", *ch.Hooknum)
			}
			if ch.Priority != nil {
				line += fmt.Sprintf(" priority %d", *ch.Priority)
			}
			out = append(out, line)
			rules, err := nft.GetRules(t, ch)
			if err != nil {
				return nil, err
			}
			for _, r := range rules {
				var ex []string
				for _, e := range r.Exprs {
					v := reflect.Indirect(reflect.ValueOf(e))
					ex = append(ex, fmt.Sprintf("%s%+v", v.Type().Name(), v.Interface()))
				}
				out = append(out, "    rule "+strings.Join(ex, " "))
			}
		}
	}
	return out, nil
}

func nftFamily(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return fmt.Sprintf("family%d", f)
}

// HostState is what the before/after check compares in the
// machine's own netns: `ip netns`, `ip link` and the nft ruleset (`nft
// list ruleset` when nft is installed, else the same listing read over
// netlink).
type HostState struct {
	NetNS, Links, NFT []string
	// NFTSource says how NFT was read.
	NFTSource string
}

// TakeHostState reads the machine's netns state; it only reads.
func TakeHostState(ctx context.Context) (HostState, error) {
	var h HostState
	var errs []error
	names, err := NetNSNames("")
	errs = append(errs, err)
	h.NetNS = names
	out, err := exec.CommandContext(ctx, "ip", "-o", "link", "show").Output()
	errs = append(errs, err)
	h.Links = strings.Split(strings.TrimSpace(string(out)), "\n")
	if path, err := exec.LookPath("nft"); err == nil {
		out, err := exec.CommandContext(ctx, path, "list", "ruleset").Output()
		errs = append(errs, err)
		h.NFT = strings.Split(strings.TrimSpace(string(out)), "\n")
		h.NFTSource = "nft list ruleset"
	} else {
		h.NFTSource = "the nft ruleset read over netlink (nft is not installed)"
		nft, err := nftables.New()
		if err != nil {
			errs = append(errs, err)
		} else {
			h.NFT, err = nftLines(nft)
			errs = append(errs, err)
		}
	}
	return h, errors.Join(errs...)
}

// Diff compares two host states; only netns named with prefix count (other
// programs may create and delete their own meanwhile; "" compares all).
func (h HostState) Diff(o HostState, netnsPrefix string) string {
	var b strings.Builder
	keep := func(l []string) []string {
		return slices.DeleteFunc(slices.Clone(l), func(s string) bool { return !strings.HasPrefix(s, netnsPrefix) })
	}
	diffLines(&b, "ip netns", keep(h.NetNS), keep(o.NetNS))
	diffLines(&b, "ip link", h.Links, o.Links)
	diffLines(&b, "nft", h.NFT, o.NFT)
	return b.String()
}
