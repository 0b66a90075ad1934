package main

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/podnet/podnet/routed/desired"
)

// Flags are an operator's input: the ones that would make podnet-routed
// refuse every Node, or route the whole internet, stop it at start with
// what to do, before it touches anything.
func TestRunRefusesBadFlags(t *testing.T) {
	base := []string{"--node-name=n1", "--kubeconfig=/nonexistent"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--cluster-cidr (or CLUSTER_CIDR) is required"},
		{[]string{"--cluster-cidr=0.0.0.0/0"}, "default route"},
		{[]string{"--cluster-cidr=127.0.0.0/16"}, "reserved range"},
		{[]string{"--cluster-cidr=10.244.0.0/16", "--service-cidr=10.0.0.0/8"}, "holds the cluster CIDR 10.244.0.0/16"},
		{[]string{"--cluster-cidr=10.244.0.0/16", "--service-cidr=bogus"}, "--service-cidr"},
		{[]string{"--cluster-cidr=10.244.0.0/16", "--encap=gre"}, "unknown encapsulation"},
		{[]string{"--cluster-cidr=10.244.0.0/16", "--reconcile-interval=-1s"}, "must not be negative"},
		{[]string{"--cluster-cidr=10.244.0.0/16", "--reconcile-grace=-1s"}, "must not be negative"},
		{[]string{"--cluster-cidr=10.244.0.0/16", "--ipam-data-dir=relative/dir"}, "want an absolute path"},
		{[]string{"--cluster-cidr=10.244.0.0/16", "--cri-socket=tcp://10.0.0.1:1234"}, "want unix:///absolute/path"},
		// IPIP is IPv4 in IPv4: an IPv6 pod range would go unrouted
		{[]string{"--cluster-cidr=fd00::/48"}, "--encap=ipip carries IPv4 only; the cluster CIDR fd00::/48 is IPv6: use --encap=vxlan (both families) or --encap=none"},
		{[]string{"--cluster-cidr=10.244.0.0/16,fd00:10:244::/56", "--encap=ipip"}, "the cluster CIDR fd00:10:244::/56 is IPv6"},
		{[]string{"--cluster-cidr=10.244.0.0/16", "--masquerade-ipv6=maybe"}, `--masquerade-ipv6: "maybe": want auto, true or false`},
	} {
		t.Setenv("CLUSTER_CIDR", "")
		t.Setenv("SERVICE_CIDR", "")
		t.Setenv("MASQUERADE_IPV6", "")
		err := run(append(append([]string{}, base...), tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.want)
		}
	}
}

// The families check passes what it must: vxlan and none carry IPv6, ipip
// an IPv4 cluster.
func TestEncapFamilies(t *testing.T) {
	v4, dual := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00::/48")}
	for _, tc := range []struct {
		e     desired.Encap
		cidrs []netip.Prefix
		ok    bool
	}{{desired.IPIP, v4, true}, {desired.IPIP, dual, false}, {desired.VXLAN, dual, true}, {desired.None, dual, true}} {
		if err := checkEncapFamilies(tc.e, tc.cidrs); (err == nil) != tc.ok {
			t.Errorf("%s %v: %v, want ok=%v", tc.e, tc.cidrs, err, tc.ok)
		}
	}
}

// --gc-percent is 50 unless the environment's GOGC says otherwise; the
// flag given wins over both.
func TestGCPercent(t *testing.T) {
	for _, tc := range []struct {
		env  string
		args []string
		want int
		ok   bool
	}{
		{"", nil, 50, true},
		{"", []string{"--gc-percent=100"}, 100, true},
		{"200", nil, 0, false},
		{"off", []string{"--gc-percent=30"}, 30, true},
		{"", []string{"--gc-percent=-1"}, -1, true},
	} {
		t.Setenv("GOGC", tc.env)
		o, err := parseFlags(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := o.gcPercentToSet(); got != tc.want || ok != tc.ok {
			t.Errorf("GOGC=%q %v: %d %v, want %d %v", tc.env, tc.args, got, ok, tc.want, tc.ok)
		}
	}
}

// --policy-nice is -10 unless given, and a nice value or refused.
func TestPolicyNice(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int
		ok   bool
	}{
		{nil, -10, true},
		{[]string{"--policy-nice=0"}, 0, true},
		{[]string{"--policy-nice=-20"}, -20, true},
		{[]string{"--policy-nice=19"}, 19, true},
		{[]string{"--policy-nice=-21"}, 0, false},
		{[]string{"--policy-nice=20"}, 0, false},
		{[]string{"--policy-nice=high"}, 0, false},
	} {
		o, err := parseFlags(tc.args)
		if (err == nil) != tc.ok {
			t.Errorf("%v: %v, want ok=%v", tc.args, err, tc.ok)
			continue
		}
		if err == nil && o.policyNice != tc.want {
			t.Errorf("%v: %d, want %d", tc.args, o.policyNice, tc.want)
		}
	}
}
