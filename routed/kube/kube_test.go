package kube

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
)

// Every node names the Event about one refusal alike, a valid object
// name whatever the policy's name; another reason or message is another
// Event.
func TestPolicyEventName(t *testing.T) {
	a := PolicyEventName("deny-all", "u1", "PolicyRefused", "m")
	if a != PolicyEventName("deny-all", "u1", "PolicyRefused", "m") || !strings.HasPrefix(a, "deny-all.podnet-policyrefused-") {
		t.Errorf("name %q", a)
	}
	if a == PolicyEventName("deny-all", "u1", "PolicyRefused", "m2") || a == PolicyEventName("deny-all", "u1", "PolicyAccepted", "m") {
		t.Errorf("another message or reason, the same name %q", a)
	}
	if long := PolicyEventName(strings.Repeat("a.", 200), "u1", "PolicyRefused", "m"); len(long) > 253 || strings.Contains(long, "..") {
		t.Errorf("long name %q (%d)", long, len(long))
	}
}

// The API server's address: the host of the URL, an address as it is.
func TestAPIServerAddrs(t *testing.T) {
	for host, want := range map[string][]netip.Addr{
		"https://10.96.0.1:443":     {netip.MustParseAddr("10.96.0.1")},
		"https://[fd00::1]:6443":    {netip.MustParseAddr("fd00::1")},
		"10.0.0.1:6443":             {netip.MustParseAddr("10.0.0.1")},
		"https://[::ffff:10.0.0.2]": {netip.MustParseAddr("10.0.0.2")},
	} {
		if got := APIServerAddrs(context.Background(), &rest.Config{Host: host}); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", host, got, want)
		}
	}
}
