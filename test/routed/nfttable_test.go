package routed

// podnet-routed's nft table (routed/dataplane Table) against the real
// kernel, in a throwaway netns, without a daemon: each way of breaking it
// is found by the resync's verify and written back, by content.

import (
	"context"
	"net"
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/routed/dataplane"
	"github.com/podnet/podnet/routed/desired"
	"github.com/podnet/podnet/test/nettest"
)

// nftIn runs the nft CLI in netns.
func nftIn(t *testing.T, netns ns.NetNS, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return nettest.ExecIn(ctx, netns, "nft", args...)
}

// handleOf is the handle of the first rule of chain whose text contains
// match (`nft -a list chain`).
func handleOf(t *testing.T, netns ns.NetNS, chain, match string) string {
	t.Helper()
	out, err := nftIn(t, netns, "-a", "list", "chain", "inet", "podnet", chain)
	if err != nil {
		t.Fatalf("nft list chain %s: %v: %s", chain, err, out)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, match) {
			if m := regexp.MustCompile(`# handle (\d+)`).FindStringSubmatch(l); m != nil {
				return m[1]
			}
		}
	}
	t.Fatalf("no rule %q in chain %s:\n%s", match, chain, out)
	return ""
}

func TestNFTTableRepairByContent(t *testing.T) {
	netns := nettest.NewNetNS(t)
	var table dataplane.Table
	t.Cleanup(table.Close) // its socket would keep the netns alive
	apply := func(spec dataplane.TableSpec, verify bool) bool {
		t.Helper()
		var repaired bool
		nettest.Do(t, netns, func() (err error) {
			repaired, err = table.Apply(spec, verify)
			return err
		})
		return repaired
	}
	// stateless: without the counter's values
	listing := func() string {
		t.Helper()
		out, err := nftIn(t, netns, "-s", "list", "table", "inet", "podnet")
		if err != nil {
			return "no table: " + out
		}
		return out
	}
	nft := func(args ...string) {
		t.Helper()
		if out, err := nftIn(t, netns, args...); err != nil {
			t.Fatalf("nft %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	dropped := func() uint64 {
		t.Helper()
		var v uint64
		nettest.Do(t, netns, func() (err error) {
			v, err = table.TunnelDropped()
			return err
		})
		return v
	}

	spec := dataplane.TableSpec{
		Masquerade:     true,
		LocalPodCIDRs:  []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")},
		ClusterCIDRs:   []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		Encap:          desired.VXLAN,
		VXLANPort:      4789,
		Peers:          []netip.Addr{netip.MustParseAddr("172.30.0.2"), netip.MustParseAddr("172.30.0.3")},
		RemotePodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24"), netip.MustParsePrefix("10.244.3.0/24")},
	}
	if apply(spec, false) {
		t.Fatal("the first write is not a repair")
	}
	written := listing()
	for _, want := range []string{
		"type filter hook prerouting priority raw; policy accept;",
		"udp dport 4789 jump tunnel_outer",
		`iifname "podnet.vxlan" jump tunnel_inner`,
		"elements = { 172.30.0.2, 172.30.0.3 }",
		"elements = { 10.244.2.0/24, 10.244.3.0/24 }",
		"ip saddr @peers4 accept",
		`counter name "tunnel_dropped" drop`,
		"ip saddr 10.244.1.0/24 masquerade",
	} {
		if !strings.Contains(written, want) {
			t.Errorf("table lacks %q:\n%s", want, written)
		}
	}
	t.Logf("nft list table inet podnet:\n%s", written)
	handles := func() string {
		out, _ := nftIn(t, netns, "-a", "-s", "list", "table", "inet", "podnet")
		return out
	}
	before := handles()
	if apply(spec, true) || handles() != before {
		t.Fatal("verify of an intact table rewrote it")
	}

	// Packets dropped by the filter are counted: UDP to this netns' own
	// address on the VXLAN port, from no peer.
	nettest.Do(t, netns, func() error {
		if err := nettest.LinkUp("lo"); err != nil {
			return err
		}
		c, err := net.Dial("udp4", "127.0.0.1:4789")
		if err != nil {
			return err
		}
		defer c.Close()
		for range 3 {
			if _, err := c.Write([]byte("not a peer")); err != nil {
				return err
			}
		}
		return nil
	})
	if got := dropped(); got != 3 {
		t.Fatalf("tunnel_dropped counts %d packets, want the 3 sent", got)
	}
	// A full rewrite (the spec changed: a Node came, or went) keeps the
	// count: podnet_tunnel_dropped_total does not go back.
	withPeer := spec
	withPeer.Peers = append(withPeer.Peers, netip.MustParseAddr("172.30.0.4"))
	withPeer.RemotePodCIDRs = append(withPeer.RemotePodCIDRs, netip.MustParsePrefix("10.244.4.0/24"))
	apply(withPeer, false)
	apply(spec, false)
	if got := dropped(); got != 3 {
		t.Errorf("tunnel_dropped %d after two full rewrites, was 3", got)
	}
	if got := listing(); got != written {
		t.Fatalf("after two full rewrites:\n%s\nwant:\n%s", got, written)
	}

	for _, tc := range []struct {
		name    string
		breakIt func()
	}{
		{"table deleted", func() { nft("delete", "table", "inet", "podnet") }},
		{"table made dormant", func() { nft("add", "table", "inet", "podnet", "{ flags dormant; }") }},
		{"filter rule deleted", func() {
			nft("delete", "rule", "inet", "podnet", "tunnel_outer", "handle", handleOf(t, netns, "tunnel_outer", "ip saddr @cluster4"))
		}},
		{"final drop replaced by accept", func() {
			nft("replace", "rule", "inet", "podnet", "tunnel_outer", "handle", handleOf(t, netns, "tunnel_outer", `counter name "tunnel_dropped" drop`),
				"counter", "name", "tunnel_dropped", "accept")
		}},
		{"peer rule widened", func() {
			nft("replace", "rule", "inet", "podnet", "tunnel_outer", "handle", handleOf(t, netns, "tunnel_outer", "ip saddr @peers4 accept"),
				"ip", "saddr", "@remote4", "accept")
		}},
		{"rule inserted", func() { nft("insert", "rule", "inet", "podnet", "tunnel_inner", "accept") }},
		{"masquerade rule deleted", func() {
			nft("delete", "rule", "inet", "podnet", "postrouting", "handle", handleOf(t, netns, "postrouting", "masquerade"))
		}},
		{"base chain policy drop", func() {
			nft("add", "chain", "inet", "podnet", "prerouting", "{ type filter hook prerouting priority raw; policy drop; }")
		}},
		{"chain added", func() { nft("add", "chain", "inet", "podnet", "extra") }},
		{"set added", func() { nft("add", "set", "inet", "podnet", "extra", "{ type ipv4_addr; }") }},
		{"peer element deleted", func() { nft("delete", "element", "inet", "podnet", "peers4", "{ 172.30.0.2 }") }},
		{"peer element added", func() { nft("add", "element", "inet", "podnet", "peers4", "{ 172.30.0.200 }") }},
		{"interval element added", func() { nft("add", "element", "inet", "podnet", "remote4", "{ 192.168.0.0/16 }") }},
		{"set flushed", func() { nft("flush", "set", "inet", "podnet", "local4") }},
	} {
		tc.breakIt()
		broken := listing()
		if broken == written {
			t.Fatalf("%s: the table did not change (the test breaks nothing)", tc.name)
		}
		if apply(spec, false) {
			t.Errorf("%s: an apply without verify reported a repair", tc.name)
		}
		if !apply(spec, true) {
			t.Errorf("%s: verify did not see it:\n%s", tc.name, broken)
		}
		if got := listing(); got != written {
			t.Fatalf("%s: after the repair:\n%s\nwant:\n%s", tc.name, got, written)
		}
		if apply(spec, true) {
			t.Errorf("%s: a second verify repaired again", tc.name)
		}
		t.Logf("%s: found and repaired", tc.name)
	}

	// Node events change elements only: the rest of the table stays as
	// written (same handles), and verify is content with it.
	nettest.Do(t, netns, func() error {
		return table.AddPeers([]netip.Addr{netip.MustParseAddr("172.30.0.4")}, []netip.Prefix{netip.MustParsePrefix("10.244.4.0/24")})
	})
	out := listing()
	if flat := strings.Join(strings.Fields(out), " "); !strings.Contains(flat, "{ 172.30.0.2, 172.30.0.3, 172.30.0.4 }") ||
		!strings.Contains(flat, "{ 10.244.2.0/24, 10.244.3.0/24, 10.244.4.0/24 }") {
		t.Fatalf("after AddPeers:\n%s", out)
	}
	before = handles()
	if apply(withPeer, true) {
		t.Error("verify after AddPeers repaired")
	}
	if h := handles(); h != before {
		t.Errorf("the full apply with the peers AddPeers wrote rewrote the table:\n%s\nwas:\n%s", h, before)
	}
	nettest.Do(t, netns, func() error {
		return table.RemovePeers([]netip.Addr{netip.MustParseAddr("172.30.0.4")}, []netip.Prefix{netip.MustParsePrefix("10.244.4.0/24")})
	})
	if got := listing(); got != written {
		t.Fatalf("after RemovePeers:\n%s\nwant:\n%s", got, written)
	}
	if apply(spec, true) {
		t.Error("verify after RemovePeers repaired")
	}

	// Overlapping PodCIDRs (the validation refuses them; the table must
	// still take them): an interval set holds the outer one only.
	inner, outer := netip.MustParsePrefix("10.244.2.128/25"), netip.MustParsePrefix("10.244.2.0/24")
	peersDo := func(add bool, p netip.Prefix) {
		t.Helper()
		nettest.Do(t, netns, func() error {
			if add {
				return table.AddPeers(nil, []netip.Prefix{p})
			}
			return table.RemovePeers(nil, []netip.Prefix{p})
		})
	}
	peersDo(true, inner)
	if got := listing(); got != written {
		t.Fatalf("after AddPeers of %s inside %s:\n%s", inner, outer, got)
	}
	peersDo(false, outer)
	if flat := strings.Join(strings.Fields(listing()), " "); !strings.Contains(flat, "{ 10.244.2.128/25, 10.244.3.0/24 }") {
		t.Fatalf("after RemovePeers of %s, %s must be in remote4:\n%s", outer, inner, listing())
	}
	peersDo(true, outer)
	peersDo(false, inner)
	if got := listing(); got != written {
		t.Fatalf("after the overlapping PodCIDRs are gone:\n%s\nwant:\n%s", got, written)
	}
	if apply(spec, true) {
		t.Error("verify after overlapping PodCIDRs repaired")
	}

	// Nothing to do (no masquerade, no tunnel): no table at all, and one
	// made by someone else goes at the next verify.
	apply(dataplane.TableSpec{Encap: desired.None}, false)
	if got := listing(); !strings.HasPrefix(got, "no table") {
		t.Fatalf("nothing to do, yet:\n%s", got)
	}
	nft("add", "table", "inet", "podnet")
	if !apply(dataplane.TableSpec{Encap: desired.None}, true) || !strings.HasPrefix(listing(), "no table") {
		t.Fatalf("a table nobody wants was not deleted: %s", listing())
	}
	if got := dropped(); got != 0 {
		t.Errorf("no table, tunnel_dropped %d", got)
	}
}
