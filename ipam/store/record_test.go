package store

import (
	"errors"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/ipam/allocator"
)

func TestRecordRoundTrip(t *testing.T) {
	r := Record{
		IPs: []netip.Addr{netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fd00::2")},
		Meta: Meta{Netns: "/run/netns/with \"quotes\"\nand newline=x", NetnsIno: 4026532000, PodNamespace: "default", PodName: "web-0",
			PodUID: "6c8e3f1a", Created: time.Date(2026, 11, 25, 16, 0, 0, 123456789, time.UTC), BootID: "b1"},
	}
	data := FormatRecord(r)
	got, err := ParseRecord(data)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.IPs, r.IPs) || got.Meta != r.Meta {
		t.Errorf("round trip:\n got %+v\nwant %+v\nfile %q", got, r, data)
	}
	// The addresses come first, one per line, as older podnet wrote and
	// reads them.
	if !strings.HasPrefix(string(data), "10.0.0.2\nfd00::2\n") {
		t.Errorf("file %q does not start with the address lines", data)
	}
}

func TestParseRecordOlderAndNewer(t *testing.T) {
	// An entry of an older podnet: addresses only, no Meta.
	r, err := ParseRecord([]byte("10.0.0.5\n"))
	if err != nil || len(r.IPs) != 1 || !r.Meta.IsZero() {
		t.Errorf("older entry: %+v, %v", r, err)
	}
	// A newer podnet's key is skipped.
	r, err = ParseRecord([]byte("10.0.0.5\nsomething-new=\"x\"\nnetns=\"/run/netns/a\"\n"))
	if err != nil || r.Netns != "/run/netns/a" {
		t.Errorf("newer entry: %+v, %v", r, err)
	}
	for _, bad := range []string{
		"10.0.0.5\nnetns=/unquoted\n",
		"10.0.0.5\nnetns-ino=-1\n",
		"10.0.0.5\ncreated=yesterday\n",
		"not-an-address\n",
		"10.0.0.5\nnetns=" + `"` + strings.Repeat("a", maxMetaValue+1) + `"` + "\n",
	} {
		if _, err := ParseRecord([]byte(bad)); err == nil {
			t.Errorf("ParseRecord(%.60q) = nil error", bad)
		}
	}
}

func TestSetIPsOfRecordsAndKeepsMeta(t *testing.T) {
	dir := t.TempDir()
	d, err := OpenDisk(dir, "net1")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	o := allocator.Owner{ContainerID: "c1", IfName: "eth0"}
	m := Meta{Netns: "/run/netns/x", PodName: "p", Created: time.Unix(1700000000, 0).UTC(), BootID: "b"}
	d.SetMeta(m)
	ip := netip.MustParseAddr("10.0.0.2")
	if err := d.SetIPsOf(o, []netip.Addr{ip}); err != nil {
		t.Fatal(err)
	}
	// A second session without SetMeta (GC rewriting the entry) keeps it.
	d.Close()
	d, err = OpenDisk(dir, "net1")
	if err != nil {
		t.Fatal(err)
	}
	if err := d.SetIPsOf(o, []netip.Addr{ip, netip.MustParseAddr("fd00::2")}); err != nil {
		t.Fatal(err)
	}
	r, ok, err := d.Record(o)
	if err != nil || !ok || r.Meta != m || len(r.IPs) != 2 {
		t.Errorf("Record = %+v, %v, %v; want meta %+v and 2 addresses", r, ok, err, m)
	}
	if ips, err := d.IPsOf(o); err != nil || len(ips) != 2 {
		t.Errorf("IPsOf = %v, %v", ips, err)
	}
}

func TestReadSnapshot(t *testing.T) {
	dir := t.TempDir()
	if _, err := ReadSnapshot(dir, "none"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing network: %v, want not-exist", err)
	}
	d, err := OpenDisk(dir, "net1")
	if err != nil {
		t.Fatal(err)
	}
	a, b := allocator.Owner{ContainerID: "a", IfName: "eth0"}, allocator.Owner{ContainerID: "b", IfName: "eth0"}
	ipA, ipB, ipOrphan := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("10.0.0.4")
	for _, x := range []struct {
		o  allocator.Owner
		ip netip.Addr
	}{{a, ipA}, {b, ipB}, {b, ipOrphan}} {
		if ok, err := d.Reserve(x.ip, x.o); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	d.SetMeta(Meta{PodName: "pa"})
	must(t, d.SetIPsOf(a, []netip.Addr{ipA}))
	must(t, d.SetIPsOf(b, []netip.Addr{ipB}))
	d.Close()
	// a corrupt entry
	must(t, os.WriteFile(filepath.Join(dir, "net1", "owners", "c:eth0"), []byte("garbage\n"), 0o600))
	s, err := ReadSnapshot(dir, "net1")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Records) != 2 || s.Records[a].PodName != "pa" || len(s.Reservations) != 3 || s.Reservations[ipOrphan].Owner != b {
		t.Errorf("snapshot: %+v", s)
	}
	if len(s.Corrupt) != 1 || s.Corrupt[0].ContainerID != "c" {
		t.Errorf("corrupt: %v", s.Corrupt)
	}
	if time.Since(s.Reservations[ipA].Changed) > time.Minute {
		t.Errorf("reservation time %v", s.Reservations[ipA].Changed)
	}
	nets, err := Networks(dir)
	if err != nil || !slices.Equal(nets, []string{"net1"}) {
		t.Errorf("Networks = %v, %v", nets, err)
	}
	// A symlink for owners/ is refused, not followed.
	must(t, os.Rename(filepath.Join(dir, "net1", "owners"), filepath.Join(dir, "owners-elsewhere")))
	must(t, os.Symlink(filepath.Join(dir, "owners-elsewhere"), filepath.Join(dir, "net1", "owners")))
	if _, err := ReadSnapshot(dir, "net1"); err == nil {
		t.Error("ReadSnapshot followed a symlinked owners/")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
