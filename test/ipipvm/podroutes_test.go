package ipipvm

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/routed/dataplane"
	"github.com/podnet/podnet/routed/desired"
	"github.com/podnet/podnet/test/nettest"
)

// TestRoutedLeavesPodRoutes runs on the host (no VM): podnet-routed's route
// reconciliation must neither prune nor count the host routes the podnet
// plugin installs with the same protocol. The VM test found it did: the
// /128 of every dual-stack pod was deleted on each apply, and each /32
// delete (refused by the kernel: scope mismatch) counted as a change.
func TestRoutedLeavesPodRoutes(t *testing.T) {
	node := nettest.NewNode(t)
	dir := t.TempDir()
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"podnet","plugins":[{"type":"podnet","stateDir":%q,
		"ipam":{"type":"podnet-ipam","dataDir":%q,"ranges":[[{"subnet":"10.244.7.0/24"}],[{"subnet":"fd00:244:7::/64"}]]}}]}`,
		filepath.Join(dir, "state"), filepath.Join(dir, "ipam"))
	rt := nettest.NewRuntime(t, node, conf, nettest.BinDir(t, "podnet"))
	podNS := nettest.NewNetNS(t)
	pod := nettest.RuntimeConf("c1", podNS, "eth0")
	if _, err := rt.Add(pod); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	before := protoRoutes(t, node)
	if len(before) != 2 {
		t.Fatalf("pod host routes after ADD: %q, want a /32 and a /128", before)
	}

	want := []desired.Route{
		{Dst: netip.MustParsePrefix("10.244.7.0/24"), Kind: desired.Blackhole},
		{Dst: netip.MustParsePrefix("fd00:244:7::/64"), Kind: desired.Blackhole},
	}
	node.Do(func() error {
		for i, wantChanged := range []int{len(want), 0, 0} {
			changed, _, err := dataplane.ApplyRoutes(want, nil, true)
			if err != nil {
				return fmt.Errorf("apply %d: %w", i+1, err)
			}
			if changed != wantChanged {
				t.Errorf("apply %d changed %d routes, want %d", i+1, changed, wantChanged)
			}
		}
		owned, err := dataplane.OwnedRoutes()
		if err != nil {
			return err
		}
		if !slices.Equal(owned, want) {
			t.Errorf("OwnedRoutes = %v, want only podnet-routed's %v", owned, want)
		}
		return nil
	})
	after := protoRoutes(t, node)
	for _, r := range before {
		if !slices.Contains(after, r) {
			t.Errorf("pod host route %q removed by podnet-routed's apply (routes now %q)", r, after)
		}
	}
	if err := rt.Del(pod); err != nil {
		t.Fatalf("DEL: %v", err)
	}
}

// protoRoutes lists the node's gateway-less routes with podnet's protocol
// (the plugin's pod host routes), as "dst dev".
func protoRoutes(t *testing.T, node *nettest.Node) []string {
	t.Helper()
	var out []string
	node.Do(func() error {
		filter := &netlink.Route{Protocol: contract.RouteProtocol, Table: unix.RT_TABLE_MAIN}
		routes, err := netlinksafe.RouteListFiltered(netlink.FAMILY_ALL, filter, netlink.RT_FILTER_PROTOCOL|netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		for _, r := range routes {
			if r.Type == unix.RTN_UNICAST && r.Gw == nil && r.Dst != nil {
				out = append(out, fmt.Sprintf("%s dev %d", r.Dst, r.LinkIndex))
			}
		}
		return nil
	})
	return out
}
