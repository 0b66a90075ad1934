package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/internal/threadprio"
	"github.com/podnet/podnet/ipam/allocator"
)

// The verbs' unit tests run in the netns of "go test", whose addresses may
// fall in their ranges (a machine with fd00::2 would refuse fd00::/120):
// they see a node without addresses unless a test sets some with
// cfgtNodeAddrs. The integration tests use the real nodestate.LocalAddrs.
func init() { nodeAddrs = func(bool, bool) ([]netip.Addr, error) { return nil, nil } }

// cfgtNodeAddrs makes addrs the node's addresses until the test ends.
func cfgtNodeAddrs(t *testing.T, addrs ...string) {
	t.Helper()
	old := nodeAddrs
	t.Cleanup(func() { nodeAddrs = old })
	var list []netip.Addr
	for _, a := range addrs {
		list = append(list, netip.MustParseAddr(a))
	}
	nodeAddrs = func(bool, bool) ([]netip.Addr, error) { return list, nil }
}

// cfgtSource is a fake PodCIDRSource; calls counts its invocations.
func cfgtSource(calls *int, cidrs ...string) PodCIDRSource {
	return func() ([]netip.Prefix, error) {
		if calls != nil {
			*calls++
		}
		var out []netip.Prefix
		for _, c := range cidrs {
			out = append(out, netip.MustParsePrefix(c))
		}
		return out, nil
	}
}

// cfgtNoSource fails the test when called: configs without usePodCidr must
// not read the node state.
func cfgtNoSource(t *testing.T) PodCIDRSource {
	return func() ([]netip.Prefix, error) {
		t.Error("PodCIDRSource called for a config without usePodCidr")
		return nil, errors.New("not expected")
	}
}

// cfgtSets renders range sets as "subnet start-end gw" lines, one set per
// element.
func cfgtSets(sets []allocator.RangeSet) []string {
	var out []string
	for _, set := range sets {
		var rs []string
		for _, r := range set {
			rs = append(rs, fmt.Sprintf("%s %s-%s gw %s", r.Subnet, r.Start, r.End, r.Gateway))
		}
		out = append(out, strings.Join(rs, "; "))
	}
	return out
}

func cfgtStrings[T fmt.Stringer](xs []T) []string {
	out := []string{}
	for _, x := range xs {
		out = append(out, x.String())
	}
	return out
}

// cfgtIPAM wraps an ipam object (JSON text without braces) and extra
// top-level fields into a network config.
func cfgtIPAM(ipam string, extra ...string) []byte {
	s := `{"cniVersion":"1.1.0","name":"podnet","type":"podnet","ipam":{"type":"podnet-ipam"`
	if ipam != "" {
		s += "," + ipam
	}
	s += "}"
	for _, e := range extra {
		s += "," + e
	}
	return []byte(s + "}")
}

func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		name      string
		stdin     []byte
		args      string
		cidrs     []string // nil: the source must not be called
		sets      []string
		exclude   []string
		requested []string
		routes    []string
		dataDir   string
	}{
		{
			name:  "shorthand subnet",
			stdin: cfgtIPAM(`"subnet":"10.1.0.0/16"`),
			sets:  []string{"10.1.0.0/16 10.1.0.1-10.1.255.254 gw 10.1.0.1"},
		},
		{
			name:  "ranges dual-stack",
			stdin: cfgtIPAM(`"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]`),
			sets: []string{
				"10.0.0.0/24 10.0.0.1-10.0.0.254 gw 10.0.0.1",
				"fd00::/64 fd00::1-fd00::8000:0:0:0 gw fd00::1", // capped at 2^63 addresses
			},
		},
		{
			name:  "shorthand and ranges: shorthand first",
			stdin: cfgtIPAM(`"subnet":"10.0.0.0/24","ranges":[[{"subnet":"fd00::/120"}]]`),
			sets:  []string{"10.0.0.0/24 10.0.0.1-10.0.0.254 gw 10.0.0.1", "fd00::/120 fd00::1-fd00::ff gw fd00::1"},
		},
		{
			name:  "rangeStart rangeEnd gateway",
			stdin: cfgtIPAM(`"ranges":[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.100","rangeEnd":"10.0.0.200","gateway":"10.0.0.254"}]]`),
			sets:  []string{"10.0.0.0/24 10.0.0.100-10.0.0.200 gw 10.0.0.254"},
		},
		{
			name:  "shorthand with rangeStart and gateway",
			stdin: cfgtIPAM(`"subnet":"10.0.0.0/24","rangeStart":"10.0.0.50","gateway":"10.0.0.1"`),
			sets:  []string{"10.0.0.0/24 10.0.0.50-10.0.0.254 gw 10.0.0.1"},
		},
		{
			name:  "IPv4-mapped addresses are unmapped",
			stdin: cfgtIPAM(`"subnet":"10.0.0.0/24","rangeStart":"::ffff:10.0.0.10","gateway":"::ffff:10.0.0.9"`),
			sets:  []string{"10.0.0.0/24 10.0.0.10-10.0.0.254 gw 10.0.0.9"},
		},
		{
			name:  "unmasked subnet",
			stdin: cfgtIPAM(`"subnet":"10.0.0.77/24"`),
			sets:  []string{"10.0.0.0/24 10.0.0.1-10.0.0.254 gw 10.0.0.1"},
		},
		{
			name:  "two ranges in a set",
			stdin: cfgtIPAM(`"ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"10.0.1.0/24","gateway":"10.0.1.254"}]]`),
			sets:  []string{"10.0.0.0/24 10.0.0.1-10.0.0.254 gw 10.0.0.1; 10.0.1.0/24 10.0.1.1-10.0.1.254 gw 10.0.1.254"},
		},
		{
			name:    "exclude addresses and CIDRs",
			stdin:   cfgtIPAM(`"subnet":"10.0.0.0/24","exclude":["10.0.0.5","10.0.0.64/26","10.0.0.130/30","fd00::1"]`),
			sets:    []string{"10.0.0.0/24 10.0.0.1-10.0.0.254 gw 10.0.0.1"},
			exclude: []string{"10.0.0.5/32", "10.0.0.64/26", "10.0.0.128/30", "fd00::1/128"},
		},
		{
			name:   "routes pass through",
			stdin:  cfgtIPAM(`"subnet":"10.0.0.0/24","routes":[{"dst":"0.0.0.0/0"},{"dst":"192.168.0.0/16","gw":"10.0.0.1"}]`),
			sets:   []string{"10.0.0.0/24 10.0.0.1-10.0.0.254 gw 10.0.0.1"},
			routes: []string{"0.0.0.0/0 via <nil>", "192.168.0.0/16 via 10.0.0.1"},
		},
		{
			name:    "dataDir",
			stdin:   cfgtIPAM(`"subnet":"10.0.0.0/24","dataDir":"/var/lib/x"`),
			sets:    []string{"10.0.0.0/24 10.0.0.1-10.0.0.254 gw 10.0.0.1"},
			dataDir: "/var/lib/x",
		},
		{
			name:      "runtimeConfig.ips",
			stdin:     cfgtIPAM(`"subnet":"10.0.0.0/24"`, `"runtimeConfig":{"ips":["10.0.0.5/24"]}`),
			sets:      []string{"10.0.0.0/24 10.0.0.1-10.0.0.254 gw 10.0.0.1"},
			requested: []string{"10.0.0.5"},
		},
		{
			name:      "args.cni.ips",
			stdin:     cfgtIPAM(`"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]`, `"args":{"cni":{"ips":["10.0.0.6","fd00::6/64"]}}`),
			sets:      []string{"10.0.0.0/24 10.0.0.1-10.0.0.254 gw 10.0.0.1", "fd00::/64 fd00::1-fd00::8000:0:0:0 gw fd00::1"},
			requested: []string{"10.0.0.6", "fd00::6"},
		},
		{
			name:      "CNI_ARGS IP=",
			stdin:     cfgtIPAM(`"subnet":"10.0.0.0/24"`),
			args:      "IP=10.0.0.5",
			sets:      []string{"10.0.0.0/24 10.0.0.1-10.0.0.254 gw 10.0.0.1"},
			requested: []string{"10.0.0.5"},
		},
		{
			name:      "CNI_ARGS IP= with prefix length among other args",
			stdin:     cfgtIPAM(`"subnet":"10.0.0.0/24"`),
			args:      "IgnoreUnknown=1;K8S_POD_NAME=p;IP=10.0.0.5/24;K8S_POD_NAMESPACE=ns",
			sets:      []string{"10.0.0.0/24 10.0.0.1-10.0.0.254 gw 10.0.0.1"},
			requested: []string{"10.0.0.5"},
		},
		{
			name:      "CNI_ARGS IP= list, IPv4-mapped",
			stdin:     cfgtIPAM(`"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]`),
			args:      "IP=::ffff:10.0.0.7, fd00::7/64",
			sets:      []string{"10.0.0.0/24 10.0.0.1-10.0.0.254 gw 10.0.0.1", "fd00::/64 fd00::1-fd00::8000:0:0:0 gw fd00::1"},
			requested: []string{"10.0.0.7", "fd00::7"},
		},
		{
			name:      "all three request sources",
			stdin:     cfgtIPAM(`"subnet":"10.0.0.0/24"`, `"runtimeConfig":{"ips":["10.0.0.1"]}`, `"args":{"cni":{"ips":["10.0.0.2"]}}`),
			args:      "IP=10.0.0.3",
			sets:      []string{"10.0.0.0/24 10.0.0.1-10.0.0.254 gw 10.0.0.1"},
			requested: []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"},
		},
		{
			name:      "empty CNI_ARGS IP=",
			stdin:     cfgtIPAM(`"subnet":"10.0.0.0/24"`),
			args:      "IP=",
			sets:      []string{"10.0.0.0/24 10.0.0.1-10.0.0.254 gw 10.0.0.1"},
			requested: []string{},
		},
		{
			name:  "usePodCidr",
			stdin: cfgtIPAM(`"ranges":[[{"subnet":"usePodCidr"}]]`),
			cidrs: []string{"10.244.1.0/24", "fd00:1::/120"},
			sets:  []string{"10.244.1.0/24 10.244.1.1-10.244.1.254 gw 10.244.1.1"},
		},
		{
			name:  "usePodCidr and usePodCidrIPv6",
			stdin: cfgtIPAM(`"ranges":[[{"subnet":"usePodCidr","rangeStart":"10.244.1.10"}],[{"subnet":"usePodCidrIPv6"}]]`),
			cidrs: []string{"fd00:1::/120", "10.244.1.0/24"},
			sets:  []string{"10.244.1.0/24 10.244.1.10-10.244.1.254 gw 10.244.1.1", "fd00:1::/120 fd00:1::1-fd00:1::ff gw fd00:1::1"},
		},
		{
			name:  "usePodCidr shorthand",
			stdin: cfgtIPAM(`"subnet":"usePodCidr"`),
			cidrs: []string{"10.244.1.0/24"},
			sets:  []string{"10.244.1.0/24 10.244.1.1-10.244.1.254 gw 10.244.1.1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := cfgtNoSource(t)
			calls := 0
			if tc.cidrs != nil {
				src = cfgtSource(&calls, tc.cidrs...)
			}
			plan, err := ParseConfig(tc.stdin, tc.args, src)
			if err != nil {
				t.Fatalf("ParseConfig(%s, %q): %v", tc.stdin, tc.args, err)
			}
			if tc.cidrs != nil && calls != 1 {
				t.Errorf("PodCIDRSource called %d times, want once", calls)
			}
			if got := cfgtSets(plan.Sets); !slices.Equal(got, tc.sets) {
				t.Errorf("sets:\n got %q\nwant %q", got, tc.sets)
			}
			if got := cfgtStrings(plan.Exclude); !slices.Equal(got, append([]string{}, tc.exclude...)) {
				t.Errorf("exclude = %q, want %q", got, tc.exclude)
			}
			if got := cfgtStrings(plan.Requested); !slices.Equal(got, append([]string{}, tc.requested...)) {
				t.Errorf("requested = %q, want %q", got, tc.requested)
			}
			var routes []string
			for _, r := range plan.Conf.IPAM.Routes {
				routes = append(routes, fmt.Sprintf("%s via %v", &r.Dst, r.GW))
			}
			if !slices.Equal(routes, tc.routes) {
				t.Errorf("routes:\n got %q\nwant %q", routes, tc.routes)
			}
			wantDir := tc.dataDir
			if wantDir == "" {
				wantDir = DefaultDataDir
			}
			if plan.DataDir != wantDir {
				t.Errorf("DataDir = %q, want %q", plan.DataDir, wantDir)
			}
			if plan.Conf.Name != "podnet" || plan.Conf.IPAM.Type != PluginType {
				t.Errorf("Conf = %+v", plan.Conf)
			}
			if err := allocator.Validate(plan.Sets); err != nil {
				t.Errorf("Validate(plan.Sets): %v", err)
			}
		})
	}
}

func TestParseConfigPodCIDRUnknown(t *testing.T) {
	notReady := func() ([]netip.Prefix, error) {
		return nil, fmt.Errorf("%w: /run/podnet/node.json: no such file", ErrPodCIDRUnknown)
	}
	for _, tc := range []struct {
		name  string
		stdin []byte
		src   PodCIDRSource
		want  string
	}{
		{"source not ready", cfgtIPAM(`"ranges":[[{"subnet":"usePodCidr"}]]`), notReady, "no such file"},
		{"no IPv6 PodCIDR", cfgtIPAM(`"ranges":[[{"subnet":"usePodCidr"}],[{"subnet":"usePodCidrIPv6"}]]`), cfgtSource(nil, "10.244.1.0/24"), "no IPv6 PodCIDR"},
		{"no IPv4 PodCIDR", cfgtIPAM(`"subnet":"usePodCidr"`), cfgtSource(nil, "fd00:1::/64"), "no IPv4 PodCIDR"},
		{"no PodCIDR at all", cfgtIPAM(`"subnet":"usePodCidrIPv6"`), cfgtSource(nil), "no IPv6 PodCIDR"},
	} {
		plan, err := ParseConfig(tc.stdin, "", tc.src)
		if !errors.Is(err, ErrPodCIDRUnknown) {
			t.Errorf("%s: ParseConfig = %v, %v; want an error wrapping ErrPodCIDRUnknown", tc.name, plan, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %q does not contain %q", tc.name, err, tc.want)
		}
	}
	// Other source errors come back as they are.
	boom := errors.New("node.json: bad podCIDR")
	_, err := ParseConfig(cfgtIPAM(`"subnet":"usePodCidr"`), "", func() ([]netip.Prefix, error) { return nil, boom })
	if !errors.Is(err, boom) || errors.Is(err, ErrPodCIDRUnknown) {
		t.Errorf("source error: %v", err)
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		stdin string
		args  string
		want  string
	}{
		{"invalid JSON", `{"name":`, "", "invalid config"},
		{"not an object", `[]`, "", "invalid config"},
		{"wrong type", `{"name":"n","ipam":{"subnet":42}}`, "", "invalid config"},
		{"no ranges", string(cfgtIPAM("")), "", "no ranges"},
		{"empty ranges", string(cfgtIPAM(`"ranges":[]`)), "", "no ranges"},
		{"empty range set", string(cfgtIPAM(`"ranges":[[]]`)), "", "range set 0 is empty"},
		{"bad subnet text", string(cfgtIPAM(`"subnet":"ten.0.0.0/8"`)), "", `subnet "ten.0.0.0/8"`},
		{"subnet without length", string(cfgtIPAM(`"subnet":"10.0.0.0"`)), "", `subnet "10.0.0.0"`},
		{"subnet length out of range", string(cfgtIPAM(`"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"10.1.0.0/33"}]]`)), "", `range set 1: subnet "10.1.0.0/33"`},
		{"subnet too small", string(cfgtIPAM(`"subnet":"10.0.0.0/31"`)), "", "too small"},
		{"subnet 0.0.0.0/0", string(cfgtIPAM(`"ranges":[[{"subnet":"0.0.0.0/0"}]]`)), "", `range set 0: subnet "0.0.0.0/0": not usable as a node's pod range: 0.0.0.0/0 is far too large`},
		{"subnet 0.0.0.0/4", string(cfgtIPAM(`"ranges":[[{"subnet":"0.0.0.0/4"}]]`)), "", `subnet "0.0.0.0/4"`},
		{"subnet /7", string(cfgtIPAM(`"subnet":"10.0.0.0/7"`)), "", "/8 or longer"},
		{"subnet ::/0", string(cfgtIPAM(`"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"::/0","rangeEnd":"ffff::"}]]`)), "", `range set 1: subnet "::/0"`},
		{"IPv6 subnet shorter than /48", string(cfgtIPAM(`"subnet":"fd00::/47"`)), "", "/48 or longer"},
		{"loopback subnet", string(cfgtIPAM(`"ranges":[[{"subnet":"127.0.0.0/24"}]]`)), "", `subnet "127.0.0.0/24": not usable as a node's pod range: 127.0.0.0/24 overlaps the loopback range 127.0.0.0/8`},
		{"link-local subnet", string(cfgtIPAM(`"ranges":[[{"subnet":"169.254.0.0/24"}]]`)), "", "169.254.0.0/24 overlaps the link-local range"},
		{"multicast subnet", string(cfgtIPAM(`"ranges":[[{"subnet":"224.0.0.0/24"}]]`)), "", "224.0.0.0/24 overlaps the multicast range"},
		{"reserved subnet", string(cfgtIPAM(`"subnet":"255.255.255.0/24"`)), "", "reserved range"},
		{"IPv6 link-local subnet", string(cfgtIPAM(`"subnet":"fe80::/64"`)), "", "link-local"},
		{"IPv6 multicast subnet", string(cfgtIPAM(`"subnet":"ff02::/64"`)), "", "multicast"},
		{"IPv6 unspecified subnet", string(cfgtIPAM(`"subnet":"::/64"`)), "", "unspecified address"},
		{"IPv4-mapped subnet", string(cfgtIPAM(`"subnet":"::ffff:10.0.0.0/120"`)), "", "IPv4-mapped"},
		{"overlapping ranges", string(cfgtIPAM(`"ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"10.0.0.0/25"}]]`)), "", "overlap"},
		{"overlapping ranges across sets", string(cfgtIPAM(`"subnet":"10.0.0.0/16","ranges":[[{"subnet":"10.0.5.0/24"}]]`)), "", "overlap"},
		{"mixed families in a set", string(cfgtIPAM(`"ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"fd00::/64"}]]`)), "", "mixes IPv4 and IPv6"},
		{"gateway outside subnet", string(cfgtIPAM(`"subnet":"10.0.0.0/24","gateway":"10.0.1.1"`)), "", "gateway 10.0.1.1 is outside subnet 10.0.0.0/24"},
		{"bad gateway", string(cfgtIPAM(`"subnet":"10.0.0.0/24","gateway":"router"`)), "", `bad address "router"`},
		{"rangeStart after rangeEnd", string(cfgtIPAM(`"subnet":"10.0.0.0/24","rangeStart":"10.0.0.200","rangeEnd":"10.0.0.100"`)), "", "rangeStart 10.0.0.200 is after rangeEnd 10.0.0.100"},
		{"rangeStart outside subnet", string(cfgtIPAM(`"subnet":"10.0.0.0/24","rangeStart":"10.0.1.1"`)), "", "rangeStart 10.0.1.1 is outside subnet"},
		{"rangeEnd of the other family", string(cfgtIPAM(`"subnet":"10.0.0.0/24","rangeEnd":"fd00::1"`)), "", "rangeEnd fd00::1 is outside subnet"},
		{"bad exclude", string(cfgtIPAM(`"subnet":"10.0.0.0/24","exclude":["10.0.0.300"]`)), "", `exclude "10.0.0.300"`},
		{"bad exclude CIDR", string(cfgtIPAM(`"subnet":"10.0.0.0/24","exclude":["10.0.0.0/40"]`)), "", `exclude "10.0.0.0/40"`},
		{"requested IP not an IP (runtimeConfig)", string(cfgtIPAM(`"subnet":"10.0.0.0/24"`, `"runtimeConfig":{"ips":["bogus"]}`)), "", `requested address "bogus" is not an IP address`},
		{"requested IP not an IP (args)", string(cfgtIPAM(`"subnet":"10.0.0.0/24"`, `"args":{"cni":{"ips":["10.0.0.1/99"]}}`)), "", `requested address "10.0.0.1/99"`},
		{"requested IP not an IP (CNI_ARGS)", string(cfgtIPAM(`"subnet":"10.0.0.0/24"`)), "IP=10.0.0.5,nope", `requested address "nope" is not an IP address`},
	} {
		plan, err := ParseConfig([]byte(tc.stdin), tc.args, cfgtNoSource(t))
		var te *types.Error
		if !errors.As(err, &te) {
			t.Errorf("%s: ParseConfig = %v, %v; want a *types.Error", tc.name, plan, err)
			continue
		}
		if te.Code != types.ErrInvalidNetworkConfig {
			t.Errorf("%s: code %d, want %d (%v)", tc.name, te.Code, types.ErrInvalidNetworkConfig, te)
		}
		if !strings.Contains(te.Msg, tc.want) {
			t.Errorf("%s: message %q does not contain %q", tc.name, te.Msg, tc.want)
		}
		if plan != nil {
			t.Errorf("%s: a plan with the error", tc.name)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	for _, s := range [][]byte{
		cfgtIPAM(`"subnet":"10.1.0.0/16"`),
		cfgtIPAM(`"ranges":[[{"subnet":"10.0.0.0/24"}],[{"subnet":"fd00::/64"}]]`),
		cfgtIPAM(`"ranges":[[{"subnet":"10.0.0.0/24","rangeStart":"10.0.0.100","rangeEnd":"10.0.0.200","gateway":"10.0.0.254"}]]`),
		cfgtIPAM(`"ranges":[[{"subnet":"10.0.0.0/24"},{"subnet":"10.0.1.0/24","gateway":"10.0.1.254"}]]`),
		cfgtIPAM(`"subnet":"10.0.0.0/24","exclude":["10.0.0.5","10.0.0.64/26","fd00::1"]`),
		cfgtIPAM(`"subnet":"10.0.0.0/24","routes":[{"dst":"0.0.0.0/0"}]`, `"runtimeConfig":{"ips":["10.0.0.5/24"]}`),
		cfgtIPAM(`"ranges":[[{"subnet":"usePodCidr"}],[{"subnet":"usePodCidrIPv6"}]]`),
		cfgtIPAM(`"subnet":"usePodCidr","rangeStart":"10.244.0.10"`),
		cfgtIPAM(`"subnet":"0.0.0.0/0"`),
		cfgtIPAM(`"subnet":"::/0","rangeEnd":"ffff::"`),
		cfgtIPAM(`"subnet":"::ffff:10.0.0.0/120","gateway":"::ffff:10.0.0.1"`),
		cfgtIPAM(`"subnet":"fe80::/64","rangeStart":"fe80::1%eth0"`),
		cfgtIPAM(`"subnet":"10.0.0.0/30","rangeStart":"10.0.0.3"`),
		cfgtIPAM(`"ranges":[[{"subnet":"127.0.0.0/24"}],[{"subnet":"fd00::/47"}]]`),
		cfgtIPAM(`"ranges":[[{"subnet":"224.0.0.0/24"}],[{"subnet":"ff02::/64"}]]`),
		cfgtIPAM(`"ranges":[[{"subnet":"169.254.0.0/24"},{"subnet":"0.0.0.0/4"}]]`),
		[]byte(`{"name":`),
		[]byte(`null`),
	} {
		f.Add(s, "")
	}
	f.Add(cfgtIPAM(`"subnet":"10.0.0.0/24"`), "IP=10.0.0.5/24;IgnoreUnknown=1")
	f.Add(cfgtIPAM(`"subnet":"10.0.0.0/24"`), "IP=::ffff:10.0.0.7,fd00::1")
	src := cfgtSource(nil, "10.244.0.0/24") // no IPv6 PodCIDR
	f.Fuzz(func(t *testing.T, stdin []byte, args string) {
		plan, err := ParseConfig(stdin, args, src)
		if err != nil {
			var te *types.Error
			if !errors.Is(err, ErrPodCIDRUnknown) && (!errors.As(err, &te) || te.Code != types.ErrInvalidNetworkConfig) {
				t.Fatalf("ParseConfig(%q, %q): %v: neither code 7 nor ErrPodCIDRUnknown", stdin, args, err)
			}
			if plan != nil {
				t.Fatalf("ParseConfig(%q, %q): a plan with the error %v", stdin, args, err)
			}
			return
		}
		if len(plan.Sets) == 0 {
			t.Fatalf("ParseConfig(%q): no range sets", stdin)
		}
		for _, set := range plan.Sets {
			for _, r := range set {
				bits := r.Subnet.Addr().BitLen()
				if !r.Subnet.IsValid() || r.Subnet != r.Subnet.Masked() {
					t.Fatalf("ParseConfig(%q): range %v: bad subnet", stdin, r)
				}
				if err := nodestate.CheckPodCIDR(r.Subnet); err != nil {
					t.Fatalf("ParseConfig(%q): range %v: %v", stdin, r, err)
				}
				if r.Start.BitLen() != bits || r.End.BitLen() != bits || r.Start.Compare(r.End) > 0 {
					t.Fatalf("ParseConfig(%q): range %v: start after end or wrong family", stdin, r)
				}
				if !r.Subnet.Contains(r.Start) || !r.Subnet.Contains(r.End) {
					t.Fatalf("ParseConfig(%q): range %v outside its subnet", stdin, r)
				}
				if r.Contains(r.Subnet.Addr()) {
					t.Fatalf("ParseConfig(%q): range %v holds the network address", stdin, r)
				}
				if r.Gateway.IsValid() && !r.Subnet.Contains(r.Gateway) {
					t.Fatalf("ParseConfig(%q): range %v: gateway outside the subnet", stdin, r)
				}
				if r.Size() == 0 || r.At(r.Size()-1) != r.End || r.Offset(r.End) != r.Size()-1 {
					t.Fatalf("ParseConfig(%q): range %v: size %d inconsistent", stdin, r, r.Size())
				}
			}
		}
		if err := allocator.Validate(plan.Sets); err != nil {
			t.Fatalf("ParseConfig(%q) returned sets Validate rejects: %v", stdin, err)
		}
		for _, ip := range plan.Requested {
			if !ip.IsValid() || ip.Is4In6() {
				t.Fatalf("ParseConfig(%q, %q): requested %v", stdin, args, ip)
			}
		}
		for _, p := range plan.Exclude {
			if !p.IsValid() {
				t.Fatalf("ParseConfig(%q): exclude %v", stdin, p)
			}
		}
		if plan.DataDir == "" {
			t.Fatalf("ParseConfig(%q): empty DataDir", stdin)
		}
	})
}

// ---- verbs ----

type cfgtEnv struct {
	t        *testing.T
	dataDir  string
	stateDir string
}

func newCfgtEnv(t *testing.T) *cfgtEnv {
	d := t.TempDir()
	return &cfgtEnv{t: t, dataDir: filepath.Join(d, "data"), stateDir: filepath.Join(d, "state")}
}

// conf is a network config over the env's directories; ipam is extra
// ipam fields, extra extra top-level fields.
func (e *cfgtEnv) conf(ipam string, extra ...string) []byte {
	return cfgtIPAM(fmt.Sprintf(`"dataDir":%q,"stateDir":%q,%s`, e.dataDir, e.stateDir, ipam), extra...)
}

func (e *cfgtEnv) writeNode(content string) {
	e.t.Helper()
	if err := os.MkdirAll(e.stateDir, 0o755); err != nil {
		e.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.stateDir, "node.json"), []byte(content), 0o644); err != nil {
		e.t.Fatal(err)
	}
}

func cfgtCode(t *testing.T, what string, err error, code uint, msg string) {
	t.Helper()
	var te *types.Error
	if !errors.As(err, &te) {
		t.Errorf("%s: %v, want CNI error %d", what, err, code)
		return
	}
	if te.Code != code {
		t.Errorf("%s: code %d (%s), want %d", what, te.Code, te.Msg, code)
	}
	if !strings.Contains(te.Msg, msg) {
		t.Errorf("%s: message %q does not contain %q", what, te.Msg, msg)
	}
}

func TestVerbsBadContainerID(t *testing.T) {
	e := newCfgtEnv(t)
	req := Request{Stdin: e.conf(`"subnet":"10.0.0.0/24"`), ContainerID: "../../x", IfName: "eth0"}
	_, err := Add(req)
	cfgtCode(t, "ADD", err, types.ErrInvalidEnvironmentVariables, "../../x")
	cfgtCode(t, "DEL", Del(req), types.ErrInvalidEnvironmentVariables, "../../x")
	cfgtCode(t, "CHECK", Check(req), types.ErrInvalidEnvironmentVariables, "../../x")
	req = Request{Stdin: req.Stdin, ContainerID: "c1", IfName: "../x"}
	_, err = Add(req)
	cfgtCode(t, "ADD with ifname ../x", err, types.ErrInvalidEnvironmentVariables, "../x")
	// Nothing written outside (nor inside) the data directory.
	if _, err := os.Stat(filepath.Join(filepath.Dir(e.dataDir), "x")); err == nil {
		t.Error("../../x created a file")
	}
	if _, err := os.Stat(e.dataDir); err == nil {
		t.Error("a rejected ADD created the data directory")
	}
}

func TestVerbsLifecycle(t *testing.T) {
	e := newCfgtEnv(t)
	stdin := e.conf(`"ranges":[[{"subnet":"10.0.0.0/29"}],[{"subnet":"fd00::/120"}]],"routes":[{"dst":"0.0.0.0/0"}]`)
	req := func(id string) Request { return Request{Stdin: stdin, ContainerID: id, IfName: "eth0"} }

	res, err := Add(req("c1"))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IPs) != 2 || res.IPs[0].Address.String() != "10.0.0.2/29" || res.IPs[0].Gateway.String() != "10.0.0.1" ||
		res.IPs[1].Address.String() != "fd00::2/120" || res.IPs[1].Gateway.String() != "fd00::1" {
		t.Errorf("ADD result IPs: %v", res.IPs)
	}
	if len(res.Routes) != 1 || res.Routes[0].Dst.String() != "0.0.0.0/0" {
		t.Errorf("ADD result routes: %v", res.Routes)
	}
	again, err := Add(req("c1"))
	if err != nil || again.IPs[0].Address.String() != "10.0.0.2/29" || again.IPs[1].Address.String() != "fd00::2/120" {
		t.Errorf("repeated ADD: %v, %v", again, err)
	}
	if err := Check(req("c1")); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	cfgtCode(t, "CHECK of an unknown container", Check(req("c2")), types.ErrInternal, "no reservation")
	if err := Status(req("")); err != nil {
		t.Errorf("STATUS: %v", err)
	}

	// A requested address that is taken: code 7 naming the holder.
	taken := req("c2")
	taken.Args = "IP=10.0.0.2"
	_, err = Add(taken)
	cfgtCode(t, "ADD IP=10.0.0.2 (taken)", err, types.ErrInvalidNetworkConfig, "already reserved by container c1")
	free := req("c2")
	free.Args = "IP=10.0.0.6"
	if res, err := Add(free); err != nil || res.IPs[0].Address.String() != "10.0.0.6/29" {
		t.Errorf("ADD IP=10.0.0.6: %v, %v", res, err)
	}

	// Fill the /29 (.2-.6): c1 .2, c2 .6, then .3 .4 .5.
	for _, id := range []string{"c3", "c4", "c5"} {
		if _, err := Add(req(id)); err != nil {
			t.Fatalf("ADD %s: %v", id, err)
		}
	}
	_, err = Add(req("c6"))
	cfgtCode(t, "ADD on a full range", err, types.ErrTryAgainLater, "no free address")
	cfgtCode(t, "STATUS on a full range", Status(req("")), types.ErrPluginNotAvailable, "no free address")

	if err := Del(req("c3")); err != nil {
		t.Fatal(err)
	}
	if err := Del(req("c3")); err != nil {
		t.Errorf("repeated DEL: %v", err)
	}
	if err := Del(req("never-added")); err != nil {
		t.Errorf("DEL of an unknown container: %v", err)
	}
	cfgtCode(t, "CHECK after DEL", Check(req("c3")), types.ErrInternal, "no reservation")
	if err := Status(req("")); err != nil {
		t.Errorf("STATUS after DEL: %v", err)
	}

	// GC keeps the valid attachments only.
	gcConf := e.conf(`"ranges":[[{"subnet":"10.0.0.0/29"}],[{"subnet":"fd00::/120"}]]`,
		`"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"},{"containerID":"c5","ifname":"eth0"}]`)
	// A leftover temp file of a killed invocation goes too.
	tmp := filepath.Join(e.dataDir, "podnet", ".tmp-killed")
	if err := os.WriteFile(tmp, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := GC(Request{Stdin: gcConf}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if _, err := os.Stat(tmp); err == nil {
		t.Error("GC left a temp file")
	}
	for id, want := range map[string]bool{"c1": true, "c2": false, "c4": false, "c5": true} {
		if err := Check(req(id)); (err == nil) != want {
			t.Errorf("CHECK %s after GC: %v, want held=%v", id, err, want)
		}
	}
}

func TestVerbsStatusFullSlash30(t *testing.T) {
	e := newCfgtEnv(t)
	stdin := e.conf(`"subnet":"10.0.0.0/30"`)
	if err := Status(Request{Stdin: stdin}); err != nil {
		t.Errorf("STATUS on an empty /30: %v", err)
	}
	res, err := Add(Request{Stdin: stdin, ContainerID: "c1", IfName: "eth0"})
	if err != nil || res.IPs[0].Address.String() != "10.0.0.2/30" {
		t.Fatalf("ADD on a /30: %v, %v", res, err)
	}
	cfgtCode(t, "STATUS on a full /30", Status(Request{Stdin: stdin}), types.ErrPluginNotAvailable, "10.0.0.0/30")
}

func TestVerbsPodCIDR(t *testing.T) {
	e := newCfgtEnv(t)
	stdin := e.conf(`"ranges":[[{"subnet":"usePodCidr"}]]`)
	req := Request{Stdin: stdin, ContainerID: "c1", IfName: "eth0"}

	// No node.json yet.
	cfgtCode(t, "STATUS without node.json", Status(Request{Stdin: stdin}), types.ErrPluginNotAvailable, "node PodCIDR not known yet")
	_, err := Add(req)
	cfgtCode(t, "ADD without node.json", err, types.ErrTryAgainLater, "node PodCIDR not known yet")
	if err := Del(req); err != nil {
		t.Errorf("DEL without node.json: %v", err)
	}

	// A node.json without the family asked for.
	e.writeNode(`{"podCIDRs":["fd00:9::/64"]}`)
	_, err = Add(req)
	cfgtCode(t, "ADD with an IPv6-only node", err, types.ErrTryAgainLater, "no IPv4 PodCIDR")

	e.writeNode(`{"podCIDRs":["10.9.0.0/24"]}`)
	if err := Status(Request{Stdin: stdin}); err != nil {
		t.Errorf("STATUS with node.json: %v", err)
	}
	res, err := Add(req)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.IPs) != 1 || res.IPs[0].Address.String() != "10.9.0.2/24" || res.IPs[0].Gateway.String() != "10.9.0.1" {
		t.Errorf("ADD with PodCIDR 10.9.0.0/24: %v", res.IPs)
	}
	if err := Check(req); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := Del(req); err != nil {
		t.Errorf("DEL: %v", err)
	}

	// The top-level stateDir is used when ipam.stateDir is not set.
	e2 := newCfgtEnv(t)
	e2.writeNode(`{"podCIDRs":["10.8.0.0/24"]}`)
	stdin2 := cfgtIPAM(fmt.Sprintf(`"dataDir":%q,"subnet":"usePodCidr"`, e2.dataDir), fmt.Sprintf(`"stateDir":%q`, e2.stateDir))
	if res, err := Add(Request{Stdin: stdin2, ContainerID: "c1", IfName: "eth0"}); err != nil || res.IPs[0].Address.String() != "10.8.0.2/24" {
		t.Errorf("ADD with top-level stateDir: %v, %v", res, err)
	}

	// A node.json that does not parse is not "not known yet": try again
	// later, with the parse error.
	e.writeNode(`{"podCIDRs":["not a cidr"]}`)
	_, err = Add(Request{Stdin: stdin, ContainerID: "c2", IfName: "eth0"})
	cfgtCode(t, "ADD with a bad node.json", err, types.ErrTryAgainLater, "not a cidr")
}

func TestVerbsBadConfig(t *testing.T) {
	e := newCfgtEnv(t)
	for _, tc := range []struct {
		stdin []byte
		cause string
	}{
		{[]byte(`{"name":`), "invalid config"},
		{e.conf(`"subnet":"10.0.0.0/33"`), `subnet "10.0.0.0/33"`},
		{e.conf(`"subnet":"0.0.0.0/0"`), `subnet "0.0.0.0/0": not usable as a node's pod range`},
		{cfgtIPAM(`"subnet":"10.0.0.0/24"`, `"name":"../../etc"`), "invalid characters"},
	} {
		req := Request{Stdin: tc.stdin, ContainerID: "c1", IfName: "eth0"}
		_, err := Add(req)
		cfgtCode(t, fmt.Sprintf("ADD %s", tc.stdin), err, types.ErrInvalidNetworkConfig, tc.cause)
		// STATUS answers 50 (cannot serve ADD), the code the CNI spec
		// defines for STATUS, with the cause.
		cfgtCode(t, fmt.Sprintf("STATUS %s", tc.stdin), Status(req), types.ErrPluginNotAvailable, tc.cause)
		cfgtCode(t, fmt.Sprintf("DEL %s", tc.stdin), Del(req), types.ErrInvalidNetworkConfig, tc.cause)
	}
	if _, err := os.Stat(e.dataDir); err == nil {
		t.Error("a rejected config created the data directory")
	}
}

// TestParseConfigNodePodCIDRChecked: a PodCIDR from the node is checked
// like a configured subnet, but refused as a node state problem (the
// caller's code for those), not as a config error.
func TestParseConfigNodePodCIDRChecked(t *testing.T) {
	for _, tc := range []struct{ subnet, cidr string }{
		{"usePodCidr", "0.0.0.0/0"},
		{"usePodCidr", "127.0.0.0/24"},
		{"usePodCidrIPv6", "fd00::/32"},
	} {
		plan, err := ParseConfig(cfgtIPAM(fmt.Sprintf(`"subnet":%q`, tc.subnet)), "", cfgtSource(nil, tc.cidr))
		var te *types.Error
		if plan != nil || !errors.Is(err, nodestate.ErrBadPodCIDR) || errors.As(err, &te) || errors.Is(err, ErrPodCIDRUnknown) || !strings.Contains(err.Error(), tc.cidr) {
			t.Errorf("%s with PodCIDR %s: %v, %v; want a plain error wrapping ErrBadPodCIDR naming it", tc.subnet, tc.cidr, plan, err)
		}
	}
	plan, err := ParseConfig(cfgtIPAM(`"ranges":[[{"subnet":"usePodCidr"}],[{"subnet":"10.9.0.0/24"}]]`), "", cfgtSource(nil, "10.244.1.77/24"))
	if err != nil || !slices.Equal(cfgtStrings(plan.NodePodCIDRs), []string{"10.244.1.0/24"}) {
		t.Errorf("NodePodCIDRs = %v, %v; want the masked PodCIDR only", plan, err)
	}
}

// TestVerbsNodeStateBadPodCIDR: a node.json whose PodCIDR is absurd is
// refused with the node state's code (11 for ADD, 50 for STATUS), naming the
// file and the value; nothing is reserved, not even the data directory.
func TestVerbsNodeStateBadPodCIDR(t *testing.T) {
	for _, cidr := range []string{"0.0.0.0/0", "0.0.0.0/4", "127.0.0.0/24", "169.254.0.0/24", "224.0.0.0/24", "10.0.0.0/31", "not a cidr"} {
		t.Run(cidr, func(t *testing.T) {
			e := newCfgtEnv(t)
			e.writeNode(fmt.Sprintf(`{"podCIDRs":[%q],"mtu":1400}`, cidr))
			stdin := e.conf(`"ranges":[[{"subnet":"usePodCidr"}]]`)
			req := Request{Stdin: stdin, ContainerID: "c1", IfName: "eth0"}
			file := filepath.Join(e.stateDir, "node.json")
			res, err := Add(req)
			if res != nil {
				t.Errorf("ADD handed out %v", res.IPs)
			}
			cfgtCode(t, "ADD", err, types.ErrTryAgainLater, fmt.Sprintf("node state %s: podCIDR %q", file, cidr))
			cfgtCode(t, "STATUS", Status(Request{Stdin: stdin}), types.ErrPluginNotAvailable, fmt.Sprintf("node state %s: podCIDR %q", file, cidr))
			cfgtCode(t, "CHECK", Check(req), types.ErrTryAgainLater, file)
			if _, err := os.Stat(e.dataDir); err == nil {
				t.Error("ADD created the data directory")
			}
		})
	}
}

// TestVerbsNodeAddrs: a range that could hand out an address of the node
// itself is refused: code 7 for a configured subnet, the node state's code
// for the node's PodCIDR. The network address and the gateway, which
// podnet-routed (VXLAN VTEP) and podnet-bridge (bridge) put on the node,
// are never handed out and do not count; neither do excluded addresses.
func TestVerbsNodeAddrs(t *testing.T) {
	cfgtNodeAddrs(t, "192.168.77.1", "fd77::1", "10.9.0.0", "10.9.0.1", "fd09::", "fd09::1")
	e := newCfgtEnv(t)
	file := filepath.Join(e.stateDir, "node.json")

	// The node's PodCIDR covers its address.
	e.writeNode(`{"podCIDRs":["192.168.0.0/16","fd77::/64"]}`)
	podCIDR := e.conf(`"ranges":[[{"subnet":"usePodCidr"}]]`)
	_, err := Add(Request{Stdin: podCIDR, ContainerID: "c1", IfName: "eth0"})
	cfgtCode(t, "ADD usePodCidr 192.168.0.0/16", err, types.ErrTryAgainLater, fmt.Sprintf("node state %s: podCIDR 192.168.0.0/16", file))
	cfgtCode(t, "ADD usePodCidr 192.168.0.0/16", err, types.ErrTryAgainLater, "holds 192.168.77.1, an address of this node")
	cfgtCode(t, "STATUS usePodCidr 192.168.0.0/16", Status(Request{Stdin: podCIDR}), types.ErrPluginNotAvailable, "holds 192.168.77.1")
	// fd77::1 is the gateway of fd77::/64: not handed out.
	v6 := e.conf(`"ranges":[[{"subnet":"usePodCidrIPv6"}]]`)
	if res, err := Add(Request{Stdin: v6, ContainerID: "c1", IfName: "eth0"}); err != nil || res.IPs[0].Address.String() != "fd77::2/64" {
		t.Errorf("ADD usePodCidrIPv6 fd77::/64 (node address = gateway): %v, %v", res, err)
	}
	// DEL, CHECK and GC hand nothing out: they work on such a range.
	if err := Del(Request{Stdin: podCIDR, ContainerID: "c1", IfName: "eth0"}); err != nil {
		t.Errorf("DEL: %v", err)
	}

	// The same subnet configured: code 7.
	conf := e.conf(`"ranges":[[{"subnet":"10.1.0.0/24"}],[{"subnet":"192.168.0.0/16"}]]`)
	_, err = Add(Request{Stdin: conf, ContainerID: "c2", IfName: "eth0"})
	cfgtCode(t, "ADD ranges 192.168.0.0/16", err, types.ErrInvalidNetworkConfig, "range set 1: subnet 192.168.0.0/16 holds 192.168.77.1, an address of this node")
	cfgtCode(t, "STATUS ranges 192.168.0.0/16", Status(Request{Stdin: conf}), types.ErrPluginNotAvailable, "holds 192.168.77.1")

	// Kept out by exclude or by the range bounds: fine.
	for _, ok := range []string{
		`"subnet":"192.168.0.0/16","exclude":["192.168.77.0/24"]`,
		`"subnet":"192.168.0.0/16","rangeStart":"192.168.78.1"`,
		`"subnet":"192.168.0.0/16","gateway":"192.168.77.1"`,
	} {
		if err := Status(Request{Stdin: e.conf(ok)}); err != nil {
			t.Errorf("STATUS %s: %v", ok, err)
		}
	}

	// podnet's own addresses in the PodCIDR: network address and gateway.
	e.writeNode(`{"podCIDRs":["10.9.0.0/24","fd09::/64"]}`)
	dual := e.conf(`"ranges":[[{"subnet":"usePodCidr"}],[{"subnet":"usePodCidrIPv6"}]]`)
	res, err := Add(Request{Stdin: dual, ContainerID: "c3", IfName: "eth0"})
	if err != nil || res.IPs[0].Address.String() != "10.9.0.2/24" || res.IPs[1].Address.String() != "fd09::2/64" {
		t.Errorf("ADD with the VTEP and gateway addresses on the node: %v, %v", res, err)
	}

	// An address listing failure is not a pass.
	nodeAddrs = func(bool, bool) ([]netip.Addr, error) { return nil, errors.New("netlink: boom") }
	_, err = Add(Request{Stdin: dual, ContainerID: "c4", IfName: "eth0"})
	cfgtCode(t, "ADD when the node's addresses cannot be listed", err, types.ErrTryAgainLater, "netlink: boom")
}

// TestVerbsStatusUnusable: STATUS answers 50 with the cause whatever keeps
// ADD from working, also where ADD would answer 5 or 11.
func TestVerbsStatusUnusable(t *testing.T) {
	// A data directory below a regular file.
	e := newCfgtEnv(t)
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	stdin := cfgtIPAM(fmt.Sprintf(`"dataDir":%q,"subnet":"10.0.0.0/24"`, filepath.Join(file, "ipam")))
	_, err := Add(Request{Stdin: stdin, ContainerID: "c1", IfName: "eth0"})
	cfgtCode(t, "ADD with a file in the dataDir path", err, types.ErrIOFailure, file)
	cfgtCode(t, "STATUS with a file in the dataDir path", Status(Request{Stdin: stdin}), types.ErrPluginNotAvailable, file)

	// A corrupt node.json.
	e.writeNode(`{"podCIDRs":["10.9.0.0/24"`)
	stdin = e.conf(`"subnet":"usePodCidr"`)
	_, err = Add(Request{Stdin: stdin, ContainerID: "c1", IfName: "eth0"})
	nodeFile := filepath.Join(e.stateDir, "node.json")
	cfgtCode(t, "ADD with a corrupt node.json", err, types.ErrTryAgainLater, "parse node state "+nodeFile)
	cfgtCode(t, "STATUS with a corrupt node.json", Status(Request{Stdin: stdin}), types.ErrPluginNotAvailable, "parse node state "+nodeFile)

	// node.json is a directory.
	if err := os.Remove(nodeFile); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(nodeFile, 0o755); err != nil {
		t.Fatal(err)
	}
	cfgtCode(t, "STATUS with node.json a directory", Status(Request{Stdin: stdin}), types.ErrPluginNotAvailable, "read node state "+nodeFile)
}

// TestVerbsNodeAddrFamilies: ADD lists only the node addresses of the
// families its ranges hand out. A node with many pods has an IPv6
// link-local address per host veth; listing them on every IPv4 ADD made
// ADD grow with the pod count (2.0× from pod 1 to pod 1,000 in make bench).
func TestVerbsNodeAddrFamilies(t *testing.T) {
	old := nodeAddrs
	t.Cleanup(func() { nodeAddrs = old })
	var asked [][2]bool
	nodeAddrs = func(v4, v6 bool) ([]netip.Addr, error) {
		asked = append(asked, [2]bool{v4, v6})
		return nil, nil
	}
	e := newCfgtEnv(t)
	for _, c := range []struct {
		ranges string
		want   [2]bool
	}{
		{`"ranges":[[{"subnet":"10.1.0.0/24"}]]`, [2]bool{true, false}},
		{`"ranges":[[{"subnet":"fd01::/120"}]]`, [2]bool{false, true}},
		{`"ranges":[[{"subnet":"10.1.0.0/24"}],[{"subnet":"fd01::/120"}]]`, [2]bool{true, true}},
	} {
		asked = nil
		if _, err := Add(Request{Stdin: e.conf(c.ranges), ContainerID: "fam", IfName: "eth0"}); err != nil {
			t.Fatalf("ADD %s: %v", c.ranges, err)
		}
		if len(asked) != 1 || asked[0] != c.want {
			t.Errorf("ADD %s asked for node addresses (v4, v6) %v, want one call %v", c.ranges, asked, c.want)
		}
		if err := Del(Request{Stdin: e.conf(c.ranges), ContainerID: "fam", IfName: "eth0"}); err != nil {
			t.Fatal(err)
		}
	}
}

// A node.json in which podnet-routed says the node cannot host new pods
// (its Node deleted or refused) refuses ADD with its reason, while DEL,
// CHECK and GC still find the PodCIDRs its pods' addresses come from.
func TestNodeStateUnusable(t *testing.T) {
	dir := t.TempDir()
	st := &nodestate.State{NodeName: "n1", PodCIDRs: []string{"10.244.1.0/24"}, Error: `this node's Node object "n1" does not exist`}
	if err := nodestate.Write(dir, st); err != nil {
		t.Fatal(err)
	}
	if _, err := NodeStatePodCIDRs(dir)(); !errors.Is(err, nodestate.ErrNodeUnusable) || errors.Is(err, ErrPodCIDRUnknown) ||
		!strings.Contains(err.Error(), "does not exist") {
		t.Errorf("ADD's PodCIDRs: %v, want the unusable node's reason (and not 'unknown', which DEL takes for nothing allocated)", err)
	}
	got, err := NodeStatePodCIDRsToRelease(dir)()
	if err != nil || len(got) != 1 || got[0] != netip.MustParsePrefix("10.244.1.0/24") {
		t.Errorf("DEL's PodCIDRs: %v, %v; want 10.244.1.0/24", got, err)
	}
}

// TestAddHoldsTheLockAtAddNice: ADD's work under the store's lock runs
// at addNice (as root, which the CI and the runtime's plugins are), and
// the caller's thread has its own nice value back afterwards.
func TestAddHoldsTheLockAtAddNice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (CAP_SYS_NICE), as the CNI runtime runs the plugins")
	}
	old := nodeAddrs
	t.Cleanup(func() { nodeAddrs = old })
	var during []int
	nodeAddrs = func(bool, bool) ([]netip.Addr, error) {
		n, err := threadprio.Nice()
		if err != nil {
			return nil, err
		}
		during = append(during, n)
		return nil, nil
	}
	e := newCfgtEnv(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := threadprio.Nice()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Add(Request{Stdin: e.conf(`"ranges":[[{"subnet":"10.1.0.0/24"}]]`), ContainerID: "nice", IfName: "eth0"}); err != nil {
		t.Fatal(err)
	}
	if len(during) != 1 || during[0] != addNice {
		t.Errorf("ADD ran at nice %v, want %d", during, addNice)
	}
	if after, err := threadprio.Nice(); err != nil || after != before {
		t.Errorf("the caller's thread is at nice %d after ADD (%v), want its own %d back", after, err, before)
	}
}
