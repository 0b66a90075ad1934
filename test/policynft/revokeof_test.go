package policynft

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"

	vnl "github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/routed/policy/nft"
	"github.com/podnet/podnet/test/nettest"
)

// ctFlow is one conntrack entry to create: orig src → orig dst:dport, and
// the reply's source (the destination after DNAT; dst when zero).
type ctFlow struct {
	src, dst, natDst string
	sport, dport     uint16
	natPort          uint16
}

func (f ctFlow) create() error {
	src, dst := net.ParseIP(f.src), net.ParseIP(f.dst)
	rsrc, rport := dst, f.dport
	if f.natDst != "" {
		rsrc, rport = net.ParseIP(f.natDst), f.natPort
	}
	fam := vnl.InetFamily(unix.AF_INET)
	if src.To4() == nil {
		fam = unix.AF_INET6
	} else { // the kernel reads 4 bytes
		src, dst, rsrc = src.To4(), dst.To4(), rsrc.To4()
	}
	c := &vnl.ConntrackFlow{FamilyType: uint8(fam), TimeOut: 600,
		Forward:   vnl.IPTuple{Protocol: unix.IPPROTO_TCP, SrcIP: src, DstIP: dst, SrcPort: f.sport, DstPort: f.dport},
		Reverse:   vnl.IPTuple{Protocol: unix.IPPROTO_TCP, SrcIP: rsrc, DstIP: src, SrcPort: rport, DstPort: f.sport},
		ProtoInfo: &vnl.ProtoInfoTCP{State: 3}}
	if err := vnl.ConntrackCreate(vnl.ConntrackTable, fam, c); err != nil {
		return fmt.Errorf("create %+v: %w", f, err)
	}
	return nil
}

// ctEntries lists the table's connections as "src>dst:dport" (original
// tuple), sorted.
func ctEntries(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, fam := range []vnl.InetFamily{unix.AF_INET, unix.AF_INET6} {
		flows, err := vnl.ConntrackTableList(vnl.ConntrackTable, fam)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range flows {
			out = append(out, fmt.Sprintf("%s>%s:%d", f.Forward.SrcIP, f.Forward.DstIP, f.Forward.DstPort))
		}
	}
	slices.Sort(out)
	return out
}

// TestRevokeOf: only the connections of the addresses given are judged
// (as source, or as destination after DNAT), each revoked one is deleted
// and counted once, and every other entry stays even when the rules
// refuse it; addresses without entries change nothing.
func TestRevokeOf(t *testing.T) {
	flows := []ctFlow{
		{src: "10.0.0.1", dst: "10.0.0.9", sport: 1001, dport: 80},                                      // gone as source: refused
		{src: "10.0.0.2", dst: "10.0.0.1", sport: 1002, dport: 80},                                      // gone as destination: refused
		{src: "10.0.0.2", dst: "10.96.0.10", natDst: "10.0.0.1", sport: 1003, dport: 80, natPort: 8080}, // gone behind a Service: refused
		{src: "10.0.0.1", dst: "10.0.0.7", sport: 1004, dport: 80},                                      // both ends gone: once
		{src: "10.0.0.1", dst: "10.0.0.5", sport: 1005, dport: 443},                                     // gone, but allowed: kept
		{src: "10.0.0.2", dst: "10.0.0.3", sport: 1006, dport: 80},                                      // refused, not of a gone address: kept
		{src: "10.0.0.3", dst: "10.96.0.11", natDst: "10.0.0.4", sport: 1007, dport: 80, natPort: 80},   // refused, not gone: kept
		{src: "fd00::1", dst: "fd00::9", sport: 1008, dport: 80},                                        // gone (IPv6): refused
		{src: "fd00::2", dst: "fd00::3", sport: 1009, dport: 80},                                        // refused, not gone: kept
	}
	// the rules: only port 443 is allowed
	allowed := func(src, dst netip.Addr, proto uint8, dport uint16) bool { return dport == 443 }
	want := []string{"10.0.0.1>10.0.0.5:443", "10.0.0.2>10.0.0.3:80", "10.0.0.3>10.96.0.11:80", "fd00::2>fd00::3:80"}
	gone := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("fd00::1")}
	many := slices.Clone(gone)
	for i := range 20 {
		many = append(many, netip.AddrFrom4([4]byte{10, 1, 0, byte(i)}))
	}
	for name, addrs := range map[string][]netip.Addr{"gone": gone, "and 20 without entries": many} {
		t.Run(name, func(t *testing.T) {
			node := nettest.NewNetNS(t)
			nettest.Do(t, node, func() error {
				for _, f := range flows {
					if err := f.create(); err != nil {
						return err
					}
				}
				if got := ctEntries(t); len(got) != len(flows) {
					t.Fatalf("%d entries created, want %d: %v", len(got), len(flows), got)
				}
				n, err := nft.RevokeOf(addrs, allowed)
				if err != nil {
					t.Fatalf("RevokeOf: %v", err)
				}
				if n != 5 {
					t.Errorf("RevokeOf deleted %d entries, want 5", n)
				}
				if got := ctEntries(t); !slices.Equal(got, want) {
					t.Errorf("entries left %v, want %v", got, want)
				}
				// nothing of theirs is left: a second call deletes nothing
				if n, err := nft.RevokeOf(addrs, allowed); n != 0 || err != nil {
					t.Errorf("second RevokeOf: %d, %v; want 0, nil", n, err)
				}
				if n, err := nft.RevokeOf(nil, allowed); n != 0 || err != nil {
					t.Errorf("RevokeOf of no address: %d, %v; want 0, nil", n, err)
				}
				return nil
			})
		})
	}
}
