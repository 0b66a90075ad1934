package cluster

import (
	"encoding/json"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/podnet/podnet/test/nettest"
)

func familyConfig(clusterCIDR, clusterCIDR6 string) Config {
	return Config{Name: "t", WorkDir: "/w", RepoRoot: "/r", BinDir: "/b", KapiDir: "/k", Encap: "vxlan", ClusterCIDR: clusterCIDR, ClusterCIDR6: clusterCIDR6}
}

// TestIPv6OnlyConfig: an IPv6 ClusterCIDR makes the cluster IPv6-only:
// /64 PodCIDRs by default, carved in order; the API server, the outside
// host, the machines and the underlay subnets all IPv6; dual-stack's,
// IPv4's addressing unchanged; the combinations it cannot be refused.
func TestIPv6OnlyConfig(t *testing.T) {
	cfg := familyConfig("fd00:10:244::/56", "")
	cidrs, cidrs6, err := checkConfig(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.IPv6Only() || cfg.NodeCIDRMaskSize != 64 || cidrs6 != nil {
		t.Errorf("IPv6Only %v, node mask /%d, second allocator %v: want true, /64, none", cfg.IPv6Only(), cfg.NodeCIDRMaskSize, cidrs6)
	}
	for _, want := range []string{"fd00:10:244::/64", "fd00:10:244:1::/64"} {
		if p, err := cidrs.allocate(); err != nil || p != netip.MustParsePrefix(want) {
			t.Errorf("PodCIDR %s (%v), want %s", p, err, want)
		}
	}

	for _, tc := range []struct {
		cidr, cidr6 string
		api         string
		outside     []string
		machine     string // host 3 on subnet 0
		subnets     []string
	}{
		{"", "", "172.30.0.250:6443", []string{"172.30.0.200"}, "172.30.0.3/24", []string{"172.30.0.0/24"}},
		{"", "fd00:10:244::/56", "172.30.0.250:6443", []string{"172.30.0.200", "fd00:172:30::c8"}, "172.30.0.3/24", []string{"172.30.0.0/24", "fd00:172:30::/64"}},
		{"fd00:10:244::/56", "", "[fd00:172:30::fa]:6443", []string{"fd00:172:30::c8"}, "fd00:172:30::3/64", []string{"fd00:172:30::/64"}},
	} {
		cfg := familyConfig(tc.cidr, tc.cidr6)
		if _, _, err := checkConfig(&cfg); err != nil {
			t.Fatal(err)
		}
		c := &Cluster{Cfg: cfg}
		if got := c.APIServerAddr().String(); got != tc.api {
			t.Errorf("%q,%q: API server %s, want %s", tc.cidr, tc.cidr6, got, tc.api)
		}
		if got := strs(c.OutsideIPs()); !slices.Equal(got, tc.outside) {
			t.Errorf("%q,%q: outside host %v, want %v", tc.cidr, tc.cidr6, got, tc.outside)
		}
		if got := c.machineAddr(0, 3).String(); got != tc.machine {
			t.Errorf("%q,%q: machine 3 at %s, want %s", tc.cidr, tc.cidr6, got, tc.machine)
		}
		if got := strs(c.UnderlaySubnets()); !slices.Equal(got, tc.subnets) {
			t.Errorf("%q,%q: underlay subnets %v, want %v", tc.cidr, tc.cidr6, got, tc.subnets)
		}
	}

	for _, bad := range []func(*Config){
		func(c *Config) { c.ClusterCIDR6 = "fd00:20::/56" },
		func(c *Config) { c.IPv6First = true },
		func(c *Config) { c.CrossSubnet = true },
		func(c *Config) { c.Encap = "ipip" },
		func(c *Config) { c.NodeCIDRMaskSize = 24 },
	} {
		cfg := familyConfig("fd00:10:244::/56", "")
		bad(&cfg)
		if _, _, err := checkConfig(&cfg); err == nil {
			t.Errorf("IPv6-only config accepted: %+v", cfg)
		}
	}
}

func strs[T interface{ String() string }](xs []T) []string {
	var out []string
	for _, x := range xs {
		out = append(out, x.String())
	}
	return out
}

// TestNodeConflistFamilies: the shipped conflist's ranges per family —
// usePodCidr (IPv4), plus usePodCidrIPv6 (dual-stack), usePodCidrIPv6
// alone (IPv6-only) — and the node's directories.
func TestNodeConflistFamilies(t *testing.T) {
	shipped, err := conflist(filepath.Join(nettest.RepoRoot(t), "conf", "10-podnet.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cidr, cidr6 string
		want        string
	}{
		{"10.244.0.0/16", "", `[[{"subnet":"usePodCidr"}]]`},
		{"10.244.0.0/16", "fd00:10:244::/56", `[[{"subnet":"usePodCidr"}],[{"subnet":"usePodCidrIPv6"}]]`},
		{"fd00:10:244::/56", "", `[[{"subnet":"usePodCidrIPv6"}]]`},
	} {
		n := &Node{c: &Cluster{Cfg: Config{ClusterCIDR: tc.cidr, ClusterCIDR6: tc.cidr6}, conflist: shipped}, StateDir: "/s", DataDir: "/d"}
		data, err := n.NodeConflist()
		if err != nil {
			t.Fatal(err)
		}
		var conf struct {
			Plugins []struct {
				StateDir string `json:"stateDir"`
				IPAM     struct {
					DataDir string          `json:"dataDir"`
					Ranges  json.RawMessage `json:"ranges"`
				} `json:"ipam"`
			} `json:"plugins"`
		}
		if err := json.Unmarshal(data, &conf); err != nil {
			t.Fatal(err)
		}
		p := conf.Plugins[0]
		got := strings.Join(strings.Fields(string(p.IPAM.Ranges)), "")
		if got != tc.want || p.StateDir != "/s" || p.IPAM.DataDir != "/d" {
			t.Errorf("%s,%s: ranges %s stateDir %q dataDir %q; want ranges %s, /s, /d", tc.cidr, tc.cidr6, got, p.StateDir, p.IPAM.DataDir, tc.want)
		}
	}
}
