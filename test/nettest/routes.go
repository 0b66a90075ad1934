package nettest

import (
	"fmt"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// FormatRoute renders a route like `ip route`: type, destination, gateway,
// device (names maps link indexes to names), protocol and onlink; full
// adds scope, table, metric and source, else only a table other than main
// is named.
func FormatRoute(r netlink.Route, names map[int]string, full bool) string {
	var b strings.Builder
	switch r.Type {
	case unix.RTN_UNICAST:
	case unix.RTN_BLACKHOLE:
		b.WriteString("blackhole ")
	case unix.RTN_LOCAL:
		b.WriteString("local ")
	case unix.RTN_BROADCAST:
		b.WriteString("broadcast ")
	case unix.RTN_MULTICAST:
		b.WriteString("multicast ")
	default:
		fmt.Fprintf(&b, "type%d ", r.Type)
	}
	if r.Dst == nil {
		b.WriteString("default")
	} else {
		b.WriteString(r.Dst.String())
	}
	if r.Gw != nil {
		b.WriteString(" via " + r.Gw.String())
	}
	if r.LinkIndex > 0 {
		name, ok := names[r.LinkIndex]
		if !ok {
			name = fmt.Sprintf("if%d", r.LinkIndex)
		}
		b.WriteString(" dev " + name)
	}
	fmt.Fprintf(&b, " proto %d", r.Protocol)
	if r.Flags&int(netlink.FLAG_ONLINK) != 0 {
		b.WriteString(" onlink")
	}
	if full {
		fmt.Fprintf(&b, " scope %d table %d metric %d", r.Scope, r.Table, r.Priority)
		if r.Src != nil {
			b.WriteString(" src " + r.Src.String())
		}
	} else if r.Table != unix.RT_TABLE_MAIN {
		fmt.Fprintf(&b, " table %d", r.Table)
	}
	return b.String()
}

// LinkIndexNames maps the link indexes of the calling thread's netns to names.
func LinkIndexNames() (map[int]string, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	names := map[int]string{}
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	return names, nil
}
