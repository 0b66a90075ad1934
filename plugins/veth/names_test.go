package veth

import (
	"strings"
	"testing"
)

func TestHostVethName(t *testing.T) {
	base := HostVethName("default", "web", "ctr1", "eth0")

	t.Run("deterministic", func(t *testing.T) {
		for range 3 {
			if got := HostVethName("default", "web", "ctr1", "eth0"); got != base {
				t.Fatalf("HostVethName changed between calls: %q then %q", base, got)
			}
		}
	})

	t.Run("shape", func(t *testing.T) {
		for _, name := range []string{
			base,
			HostVethName("", "", "ctr1", "eth0"),
			HostVethName(strings.Repeat("n", 63), strings.Repeat("p", 253), strings.Repeat("c", 64), "net15"),
		} {
			if len(name) > 15 {
				t.Errorf("%q is %d characters, over the 15-character interface name limit", name, len(name))
			}
			rest, ok := strings.CutPrefix(name, "pn")
			if !ok {
				t.Errorf("%q does not start with \"pn\"", name)
			}
			if len(rest) != 11 || strings.Trim(rest, "0123456789abcdef") != "" {
				t.Errorf("%q: want \"pn\" + 11 hex characters", name)
			}
		}
	})

	t.Run("differs", func(t *testing.T) {
		for _, c := range []struct {
			what string
			name string
		}{
			{"by ifname", HostVethName("default", "web", "ctr1", "net1")},
			{"by pod name", HostVethName("default", "api", "ctr1", "eth0")},
			{"by pod namespace", HostVethName("prod", "web", "ctr1", "eth0")},
			{"by container (no pod names)", HostVethName("", "", "ctr2", "eth0")},
		} {
			if c.name == base {
				t.Errorf("name does not differ %s: both %q", c.what, base)
			}
		}
		if a, b := HostVethName("", "", "ctr1", "eth0"), HostVethName("", "", "ctr2", "eth0"); a == b {
			t.Errorf("containers ctr1 and ctr2 share name %q", a)
		}
		if a, b := HostVethName("", "", "ctr1", "eth0"), HostVethName("", "", "ctr1", "net1"); a == b {
			t.Errorf("ifnames eth0 and net1 of one container share name %q", a)
		}
	})

	t.Run("uses pod namespace and name when both given", func(t *testing.T) {
		// A new sandbox (container ID) of the same pod gets the same name,
		// so its ADD finds and replaces the previous sandbox's leftover veth.
		if got := HostVethName("default", "web", "ctr2", "eth0"); got != base {
			t.Errorf("same pod, other container: %q, want %q", got, base)
		}
		if got := HostVethName("default", "web", "", "eth0"); got != base {
			t.Errorf("same pod, no container ID: %q, want %q", got, base)
		}
	})

	t.Run("falls back to container ID when a pod name part is missing", func(t *testing.T) {
		byID := HostVethName("", "", "ctr1", "eth0")
		for _, c := range [][2]string{{"default", ""}, {"", "web"}} {
			if got := HostVethName(c[0], c[1], "ctr1", "eth0"); got != byID {
				t.Errorf("HostVethName(%q, %q, ctr1, eth0) = %q, want the container-ID name %q", c[0], c[1], got, byID)
			}
		}
	})
}

// TestParseAlias: ParseAlias accepts the alias of a veth in service only
// (the alias format itself is tested in internal/contract).
func TestParseAlias(t *testing.T) {
	o := Owner{Network: "podnet", ContainerID: "c1", IfName: "eth0"}
	if got, ok := ParseAlias(o.Alias()); !ok || got != o {
		t.Errorf("ParseAlias(%q) = %+v, %v; want %+v, true", o.Alias(), got, ok, o)
	}
	for _, alias := range []string{"", "calico:a:b:c", "podnet:a:b", o.DetachedAlias()} {
		if got, ok := ParseAlias(alias); ok || got != (Owner{}) {
			t.Errorf("ParseAlias(%q) = %+v, %v; want the zero Owner, false", alias, got, ok)
		}
	}
}

func TestDetachedName(t *testing.T) {
	if a, b := DetachedName("eth0"), DetachedName("net1"); a == b || len(a) > 15 || a == HostVethName("", "", "x", "eth0") || !strings.HasPrefix(a, "pnd") {
		t.Errorf("DetachedName: %q %q", a, b)
	}
}
