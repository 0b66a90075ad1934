package daemon

import (
	"fmt"
	"net/netip"
	"testing"
)

// A ServiceCIDR object is input too: one that holds a whole cluster CIDR
// (or 0.0.0.0/0, or garbage) would refuse every Node, so it is ignored;
// a service range beside the pod network, or one overlapping part of it
// (which refuses only the Nodes it overlaps), counts.
func TestServiceRanges(t *testing.T) {
	cluster := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")}
	got, ignored := serviceRanges([]string{
		"10.96.0.0/12", "fd00:10:96::/112", // the usual
		"10.244.8.0/24",   // part of the pod network: counts
		"10.0.0.0/8",      // holds the cluster CIDR
		"10.244.0.0/16",   // is it
		"fd00:10::/32",    // holds the IPv6 one
		"0.0.0.0/0", "x/", // absurd
		"10.97.0.7/16", // host bits: masked
	}, cluster)
	if want := "[10.96.0.0/12 10.97.0.0/16 10.244.8.0/24 fd00:10:96::/112]"; fmt.Sprint(got) != want {
		t.Errorf("service ranges %v, want %s", got, want)
	}
	if want := "[10.0.0.0/8 10.244.0.0/16 fd00:10::/32 0.0.0.0/0 x/]"; fmt.Sprint(ignored) != want {
		t.Errorf("ignored %v, want %s", ignored, want)
	}
}
