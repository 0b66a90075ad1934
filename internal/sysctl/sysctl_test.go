package sysctl

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// tree makes a /proc/sys stand-in under a temporary directory holding
// files.
func tree(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, value := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestWriter: values are written under Root, and a value that already
// holds is not written (a read-only file is fine then).
func TestWriter(t *testing.T) {
	root := tree(t, map[string]string{"net/ipv4/ip_forward": "0\n", "net/ipv4/conf/tunl0/rp_filter": "2\n"})
	// The kernel refuses writes to a read-only /proc/sys; a read-only
	// file stands in for it (for anyone but root).
	if err := os.Chmod(filepath.Join(root, "net/ipv4/conf/tunl0/rp_filter"), 0o444); err != nil {
		t.Fatal(err)
	}
	s := []Setting{{Name: "net/ipv4/ip_forward", Value: "1"}, {Name: "net/ipv4/conf/tunl0/rp_filter", Value: "2"}}
	if err := (Writer{Root: root}).Write(s); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "net/ipv4/ip_forward")); err != nil || string(b) != "1" {
		t.Errorf("ip_forward = %q (%v), want 1", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "net/ipv4/conf/tunl0/rp_filter")); err != nil || string(b) != "2\n" {
		t.Errorf("rp_filter = %q (%v), want it untouched", b, err)
	}
	if err := (Writer{Root: root}).Write([]Setting{{Name: "net/ipv6/conf/all/forwarding", Value: "1"}}); err == nil {
		t.Error("writing a sysctl that does not exist succeeded")
	}
}

// TestWriterGoesOn: a setting that cannot be set is reported and the
// ones after it are still set; an IPv6-only one holds on a tree without
// net/ipv6 (a kernel without IPv6).
func TestWriterGoesOn(t *testing.T) {
	root := tree(t, map[string]string{"net/ipv4/ip_forward": "0\n", "net/ipv4/conf/podnet.vxlan/rp_filter": "0\n"})
	s := []Setting{
		{Name: "net/ipv4/conf/missing/rp_filter", Value: "2"}, // fails: no such file
		{Name: "net/ipv4/ip_forward", Value: "1"},
		{Name: "net/ipv6/conf/podnet.vxlan/accept_ra", Value: "0", IPv6Only: true},
		{Name: "net/ipv4/conf/podnet.vxlan/rp_filter", Value: "2"},
	}
	changed, failed := Writer{Root: root}.Set(s)
	if len(failed) != 1 || failed[0].Setting != s[0] || !strings.Contains(failed[0].Error(), "net.ipv4.conf.missing.rp_filter=2") {
		t.Errorf("failed = %v, want only %s", failed, s[0].Name)
	}
	if !slices.Equal(changed, []Setting{s[1], s[3]}) {
		t.Errorf("changed = %v, want %v", changed, []Setting{s[1], s[3]})
	}
	for _, name := range []string{"net/ipv4/ip_forward", "net/ipv4/conf/podnet.vxlan/rp_filter"} {
		if b, _ := os.ReadFile(filepath.Join(root, name)); len(b) != 1 {
			t.Errorf("%s = %q, not written", name, b)
		}
	}
	// with net/ipv6 present, the missing IPv6 setting is an error
	if err := os.MkdirAll(filepath.Join(root, "net/ipv6"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, failed := (Writer{Root: root}).Set(s[2:3]); len(failed) != 1 {
		t.Errorf("an IPv6 sysctl missing on a kernel with IPv6: failed = %v, want it reported", failed)
	}
	if err := (Writer{Root: root}).Write(s); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Write = %v, want the failures joined", err)
	}
}
