package store_test

import (
	"bytes"
	"errors"
	"io/fs"
	"math/rand"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/ipam/allocator"
	"github.com/podnet/podnet/ipam/store"
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

var (
	alice = allocator.Owner{ContainerID: "alice", IfName: "eth0"}
	bob   = allocator.Owner{ContainerID: "bob-1.x_y", IfName: "net1"}
)

func openDisk(t *testing.T, dataDir, network string) *store.Disk {
	t.Helper()
	d, err := store.OpenDisk(dataDir, network)
	if err != nil {
		t.Fatalf("OpenDisk(%s, %s): %v", dataDir, network, err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func sortAddrs(ips []netip.Addr) []netip.Addr {
	c := slices.Clone(ips)
	slices.SortFunc(c, netip.Addr.Compare)
	return c
}

func TestDiskReserveRelease(t *testing.T) {
	d := openDisk(t, t.TempDir(), "net")
	ip := addr("10.0.0.2")
	if ok, err := d.Reserve(ip, alice); !ok || err != nil {
		t.Fatalf("first Reserve = %v, %v", ok, err)
	}
	for _, o := range []allocator.Owner{alice, bob} {
		if ok, err := d.Reserve(ip, o); ok || err != nil {
			t.Errorf("second Reserve for %v = %v, %v; want false, nil", o, ok, err)
		}
	}
	if o, ok, err := d.OwnerOf(ip); o != alice || !ok || err != nil {
		t.Errorf("OwnerOf = %v, %v, %v; want alice (the first reservation wins)", o, ok, err)
	}
	if o, ok, err := d.OwnerOf(addr("10.0.0.3")); ok || err != nil || o != (allocator.Owner{}) {
		t.Errorf("OwnerOf(free) = %v, %v, %v", o, ok, err)
	}
	if err := d.Release(ip); err != nil {
		t.Fatal(err)
	}
	if err := d.Release(ip); err != nil {
		t.Errorf("Release of a missing reservation: %v", err)
	}
	if err := d.Release(addr("fd00::1")); err != nil {
		t.Errorf("Release of a never reserved address: %v", err)
	}
	if ok, err := d.Reserve(ip, bob); !ok || err != nil {
		t.Errorf("Reserve after Release = %v, %v", ok, err)
	}
	if ok, err := d.Reserve(addr("fd00::2"), bob); !ok || err != nil {
		t.Errorf("Reserve IPv6 = %v, %v", ok, err)
	}
	if _, err := os.Stat(filepath.Join(d.Dir(), "ips", "fd00::2")); err != nil {
		t.Errorf("IPv6 reservation file: %v", err)
	}
	// Reservations leave no temp files behind.
	entries, _ := os.ReadDir(d.Dir())
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			t.Errorf("temp file left behind: %s", e.Name())
		}
	}
}

func TestDiskOwnerIndex(t *testing.T) {
	d := openDisk(t, t.TempDir(), "net")
	if ips, err := d.IPsOf(alice); ips != nil || err != nil {
		t.Errorf("IPsOf(unknown) = %v, %v", ips, err)
	}
	want := []netip.Addr{addr("10.0.0.2"), addr("fd00::2")}
	if err := d.SetIPsOf(alice, want); err != nil {
		t.Fatal(err)
	}
	if got, err := d.IPsOf(alice); err != nil || !slices.Equal(got, want) {
		t.Errorf("IPsOf = %v, %v; want %v", got, err, want)
	}
	// Replacing works, and so does deleting with an empty list.
	if err := d.SetIPsOf(alice, want[:1]); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.IPsOf(alice); !slices.Equal(got, want[:1]) {
		t.Errorf("IPsOf after replace = %v", got)
	}
	if err := d.SetIPsOf(alice, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := d.IPsOf(alice); got != nil || err != nil {
		t.Errorf("IPsOf after delete = %v, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(d.Dir(), "owners", "alice:eth0")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("owner file after delete: %v", err)
	}
	if err := d.SetIPsOf(alice, []netip.Addr{}); err != nil {
		t.Errorf("deleting a missing entry: %v", err)
	}
}

func TestDiskAllOwners(t *testing.T) {
	d := openDisk(t, t.TempDir(), "net")
	res := map[netip.Addr]allocator.Owner{
		addr("10.0.0.2"): alice,
		addr("fd00::2"):  alice,
		addr("10.0.0.3"): bob,
	}
	for ip, o := range res {
		if ok, err := d.Reserve(ip, o); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if err := d.SetIPsOf(alice, []netip.Addr{addr("10.0.0.2"), addr("fd00::2")}); err != nil {
		t.Fatal(err)
	}
	if err := d.SetIPsOf(bob, []netip.Addr{addr("10.0.0.3")}); err != nil {
		t.Fatal(err)
	}
	// Junk in the directories is skipped; an unreadable reservation
	// shows up with the zero Owner (GC releases it).
	must(t, os.WriteFile(filepath.Join(d.Dir(), "ips", "not-an-ip"), []byte("x\ny\n"), 0o600))
	must(t, os.WriteFile(filepath.Join(d.Dir(), "ips", "10.0.0.9"), []byte("garbage"), 0o600))
	must(t, os.WriteFile(filepath.Join(d.Dir(), "owners", "no-colon"), []byte("10.0.0.4\n"), 0o600))
	must(t, os.WriteFile(filepath.Join(d.Dir(), "owners", "carol:eth0"), []byte("not an address\n"), 0o600))

	all, err := d.All()
	if err != nil {
		t.Fatal(err)
	}
	res[addr("10.0.0.9")] = allocator.Owner{}
	if len(all) != len(res) {
		t.Errorf("All = %v, want %v", all, res)
	}
	for ip, o := range res {
		if all[ip] != o {
			t.Errorf("All()[%s] = %v, want %v", ip, all[ip], o)
		}
	}
	if o, ok, err := d.OwnerOf(addr("10.0.0.9")); !ok || err != nil || o != (allocator.Owner{}) {
		t.Errorf("OwnerOf(corrupt) = %v, %v, %v; want reserved by nobody", o, ok, err)
	}
	owners, err := d.Owners()
	if err != nil {
		t.Fatal(err)
	}
	carol := allocator.Owner{ContainerID: "carol", IfName: "eth0"}
	if len(owners) != 3 || len(owners[alice]) != 2 || len(owners[bob]) != 1 || owners[carol] != nil {
		t.Errorf("Owners = %v", owners)
	}
	if _, err := d.IPsOf(carol); err == nil {
		t.Error("IPsOf of a corrupt owner entry: no error")
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestDiskPermissions(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data", "ipam") // created by OpenDisk
	d := openDisk(t, dataDir, "net")
	r, err := allocator.NewRange(netip.MustParsePrefix("10.0.0.0/24"), netip.Addr{}, netip.Addr{}, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	a := &allocator.Allocator{Sets: []allocator.RangeSet{{r}}, Store: d}
	if _, err := a.Allocate(alice, nil); err != nil {
		t.Fatal(err)
	}
	checkMode := func(p string, want fs.FileMode) {
		t.Helper()
		st, err := os.Stat(p)
		if err != nil {
			t.Error(err)
			return
		}
		if st.Mode().Perm() != want {
			t.Errorf("%s: mode %o, want %o", p, st.Mode().Perm(), want)
		}
	}
	for _, sub := range []string{"", "ips", "owners", "hints"} {
		checkMode(filepath.Join(d.Dir(), sub), 0o700)
	}
	checkMode(dataDir, 0o700)
	checkMode(filepath.Join(d.Dir(), "lock"), 0o600)
	checkMode(filepath.Join(d.Dir(), "ips", "10.0.0.2"), 0o600)
	checkMode(filepath.Join(d.Dir(), "owners", "alice:eth0"), 0o600)
	hints, _ := os.ReadDir(filepath.Join(d.Dir(), "hints"))
	if len(hints) != 1 {
		t.Errorf("hints: %v, want one file", hints)
	}
	for _, h := range hints {
		checkMode(filepath.Join(d.Dir(), "hints", h.Name()), 0o600)
	}
	if d.Dir() != filepath.Join(dataDir, "net") {
		t.Errorf("Dir = %s", d.Dir())
	}
}

func TestValidateOwner(t *testing.T) {
	good := []allocator.Owner{
		{ContainerID: "a", IfName: "eth0"},
		{ContainerID: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef", IfName: "net1"},
		{ContainerID: "a.b-c_d", IfName: "123456789012345"}, // 15 chars
		{ContainerID: "a..b", IfName: "..."},
	}
	for _, o := range good {
		if err := store.ValidateOwner(o); err != nil {
			t.Errorf("ValidateOwner(%q) = %v", o, err)
		}
	}
	bad := []allocator.Owner{
		{ContainerID: "../x", IfName: "eth0"},
		{ContainerID: "../../etc", IfName: "eth0"},
		{ContainerID: "a/b", IfName: "eth0"},
		{ContainerID: "", IfName: "eth0"},
		{ContainerID: ".", IfName: "eth0"},
		{ContainerID: "..", IfName: "eth0"},
		{ContainerID: "-a", IfName: "eth0"},
		{ContainerID: "a:b", IfName: "eth0"},
		{ContainerID: "a\nb", IfName: "eth0"},
		{ContainerID: "a b", IfName: "eth0"},
		{ContainerID: "a", IfName: ""},
		{ContainerID: "a", IfName: "."},
		{ContainerID: "a", IfName: ".."},
		{ContainerID: "a", IfName: "a/b"},
		{ContainerID: "a", IfName: "../x"},
		{ContainerID: "a", IfName: "a:b"},
		{ContainerID: "a", IfName: "a\nb"},
		{ContainerID: "a", IfName: "a b"},
		{ContainerID: "a", IfName: "1234567890123456"}, // 16 chars
	}
	d := openDisk(t, t.TempDir(), "net")
	for _, o := range bad {
		if err := store.ValidateOwner(o); err == nil {
			t.Errorf("ValidateOwner(%q) accepted it", o)
		}
		// Every store entry point that names a file checks it.
		if ok, err := d.Reserve(addr("10.0.0.2"), o); ok || err == nil {
			t.Errorf("Reserve for %q = %v, %v", o, ok, err)
		}
		if _, err := d.IPsOf(o); err == nil {
			t.Errorf("IPsOf(%q): no error", o)
		}
		if err := d.SetIPsOf(o, []netip.Addr{addr("10.0.0.2")}); err == nil {
			t.Errorf("SetIPsOf(%q): no error", o)
		}
	}
	// Nothing was written anywhere.
	var files []string
	_ = filepath.WalkDir(filepath.Dir(d.Dir()), func(p string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if len(files) != 1 || filepath.Base(files[0]) != "lock" {
		t.Errorf("files after rejected owners: %v", files)
	}
}

func TestOpenDiskNetworkName(t *testing.T) {
	parent := t.TempDir()
	dataDir := filepath.Join(parent, "data")
	for _, name := range []string{"", ".", "..", "../x", "a/b", "/abs", "a/../../b", ".hidden", "-x", "a b", "a\nb"} {
		if d, err := store.OpenDisk(dataDir, name); err == nil {
			d.Close()
			t.Errorf("OpenDisk accepted network name %q (dir %s)", name, d.Dir())
		}
	}
	// Nothing was created, inside dataDir or next to it.
	entries, _ := os.ReadDir(parent)
	if len(entries) != 0 {
		t.Errorf("rejected names created %v", entries)
	}
	for _, name := range []string{"podnet", "k8s-pod-network", "a.b_c-1", "a..b"} {
		d, err := store.OpenDisk(dataDir, name)
		if err != nil {
			t.Errorf("OpenDisk(%q): %v", name, err)
			continue
		}
		if filepath.Dir(d.Dir()) != dataDir {
			t.Errorf("OpenDisk(%q).Dir() = %s, outside %s", name, d.Dir(), dataDir)
		}
		d.Close()
	}
}

func TestRemoveTemp(t *testing.T) {
	d := openDisk(t, t.TempDir(), "net")
	for _, n := range []string{".tmp-123", ".tmp-abc"} {
		must(t, os.WriteFile(filepath.Join(d.Dir(), n), []byte("half"), 0o600))
	}
	must(t, os.WriteFile(filepath.Join(d.Dir(), "keep"), nil, 0o600))
	if ok, err := d.Reserve(addr("10.0.0.2"), alice); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if err := d.RemoveTemp(); err != nil {
		t.Fatal(err)
	}
	var names []string
	entries, _ := os.ReadDir(d.Dir())
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"hints", "ips", "keep", "lock", "owners"}; !slices.Equal(names, want) {
		t.Errorf("after RemoveTemp: %v, want %v", names, want)
	}
	if _, ok, _ := d.OwnerOf(addr("10.0.0.2")); !ok {
		t.Error("RemoveTemp removed a reservation")
	}
	if err := d.RemoveTemp(); err != nil {
		t.Errorf("RemoveTemp with nothing to remove: %v", err)
	}
}

func TestDiskLockSerializes(t *testing.T) {
	dataDir := t.TempDir()
	d1, err := store.OpenDisk(dataDir, "net")
	if err != nil {
		t.Fatal(err)
	}
	type opened struct {
		d   *store.Disk
		err error
	}
	ch := make(chan opened, 1)
	go func() {
		d, err := store.OpenDisk(dataDir, "net")
		ch <- opened{d, err}
	}()
	select {
	case o := <-ch:
		if o.d != nil {
			o.d.Close()
		}
		d1.Close()
		t.Fatalf("second OpenDisk returned (%v) while the first handle holds the lock", o.err)
	case <-time.After(300 * time.Millisecond):
	}
	// Another network is not blocked.
	other, err := store.OpenDisk(dataDir, "other")
	if err != nil {
		t.Fatal(err)
	}
	other.Close()
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case o := <-ch:
		if o.err != nil {
			t.Fatalf("second OpenDisk after Close: %v", o.err)
		}
		o.d.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("second OpenDisk still blocked 10s after the first handle was closed")
	}
}

// TestDiskConcurrentAllocators: many handles allocating in parallel (each
// one verb under the lock) never hand out an address twice.
func TestDiskConcurrentAllocators(t *testing.T) {
	dataDir := t.TempDir()
	r, _ := allocator.NewRange(netip.MustParsePrefix("10.0.0.0/26"), netip.Addr{}, netip.Addr{}, netip.Addr{})
	const workers, each = 8, 7 // 56 of the 61 addresses
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func() {
			for i := 0; i < each; i++ {
				d, err := store.OpenDisk(dataDir, "net")
				if err != nil {
					errs <- err
					return
				}
				a := &allocator.Allocator{Sets: []allocator.RangeSet{{r}}, Store: d}
				_, err = a.Allocate(allocator.Owner{ContainerID: "c" + string(rune('a'+w)) + string(rune('a'+i)), IfName: "eth0"}, nil)
				d.Close()
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for w := 0; w < workers; w++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	d := openDisk(t, dataDir, "net")
	all, _ := d.All()
	owners, _ := d.Owners()
	if len(all) != workers*each || len(owners) != workers*each {
		t.Fatalf("%d reservations, %d owners; want %d", len(all), len(owners), workers*each)
	}
	for o, ips := range owners {
		if len(ips) != 1 || all[ips[0]] != o {
			t.Errorf("owner %v: index %v, reservation owner %v", o, ips, all[ips[0]])
		}
	}
}

// TestDiskHintPersists: the cursor survives across invocations, so an
// address freed by one DEL is not handed out by the next ADD.
func TestDiskHintPersists(t *testing.T) {
	dataDir := t.TempDir()
	r, _ := allocator.NewRange(netip.MustParsePrefix("10.0.0.0/24"), netip.Addr{}, netip.Addr{}, netip.Addr{})
	verb := func(f func(a *allocator.Allocator)) {
		d, err := store.OpenDisk(dataDir, "net")
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		f(&allocator.Allocator{Sets: []allocator.RangeSet{{r}}, Store: d})
	}
	var first, second []netip.Prefix
	verb(func(a *allocator.Allocator) { first, _ = a.Allocate(alice, nil) })
	verb(func(a *allocator.Allocator) { must(t, a.Release(alice)) })
	verb(func(a *allocator.Allocator) { second, _ = a.Allocate(bob, nil) })
	if len(first) != 1 || len(second) != 1 || first[0].Addr() != addr("10.0.0.2") || second[0].Addr() != addr("10.0.0.3") {
		t.Errorf("ADD, DEL, ADD in three invocations: %v then %v; want 10.0.0.2 then 10.0.0.3", first, second)
	}
}

// TestDiskCorruptHint: whatever the hint file holds (torn, truncated,
// garbage, claiming all free or all taken, a wild cursor), allocation
// through the Disk store never hands out an address twice and finds the
// free ones.
func TestDiskCorruptHint(t *testing.T) {
	r, err := allocator.NewRange(netip.MustParsePrefix("10.0.0.0/27"), netip.Addr{}, netip.Addr{}, netip.Addr{})
	if err != nil {
		t.Fatal(err)
	}
	usable := int(r.Size()) - 1 // the gateway
	rng := rand.New(rand.NewSource(1))
	corruptions := map[string]func(old []byte) []byte{
		"truncated to 0":    func([]byte) []byte { return nil },
		"truncated to 10":   func(old []byte) []byte { return old[:10] },
		"torn (one short)":  func(old []byte) []byte { return old[:len(old)-1] },
		"too long":          func(old []byte) []byte { return append(old, 0xff) },
		"text garbage":      func([]byte) []byte { return []byte("this is not a bitmap\n") },
		"random same size":  func(old []byte) []byte { b := make([]byte, len(old)); rng.Read(b); return b },
		"random body":       func(old []byte) []byte { b := slices.Clone(old); rng.Read(b[8:]); return b },
		"all free":          func(old []byte) []byte { b := slices.Clone(old); clear(b[16:]); return b },
		"all taken":         func(old []byte) []byte { b := slices.Clone(old); fill(b[16:], 0xff); return b },
		"all taken, cursor": func(old []byte) []byte { b := slices.Clone(old); fill(b[8:], 0xff); return b },
	}
	for name, corrupt := range corruptions {
		t.Run(name, func(t *testing.T) {
			dataDir := t.TempDir()
			n := 0
			allocate := func(count int) {
				t.Helper()
				d, err := store.OpenDisk(dataDir, "net")
				if err != nil {
					t.Fatal(err)
				}
				defer d.Close()
				a := &allocator.Allocator{Sets: []allocator.RangeSet{{r}}, Store: d}
				for i := 0; i < count; i++ {
					o := allocator.Owner{ContainerID: "c" + strings.Repeat("x", n), IfName: "eth0"}
					n++
					if _, err := a.Allocate(o, nil); err != nil {
						t.Fatalf("ADD %d: %v", n, err)
					}
				}
			}
			allocate(10)
			// Free a few so the hint's "taken" marks are stale too.
			d, err := store.OpenDisk(dataDir, "net")
			if err != nil {
				t.Fatal(err)
			}
			a := &allocator.Allocator{Sets: []allocator.RangeSet{{r}}, Store: d}
			must(t, a.Release(allocator.Owner{ContainerID: "cxx", IfName: "eth0"}))
			must(t, a.Release(allocator.Owner{ContainerID: "cxxxxx", IfName: "eth0"}))
			d.Close()

			hints, _ := filepath.Glob(filepath.Join(dataDir, "net", "hints", "*"))
			if len(hints) != 1 {
				t.Fatalf("hint files: %v", hints)
			}
			old, err := os.ReadFile(hints[0])
			if err != nil {
				t.Fatal(err)
			}
			must(t, os.WriteFile(hints[0], corrupt(old), 0o600))

			allocate(usable - 8) // exactly fills the range
			d = openDisk(t, dataDir, "net")
			all, _ := d.All()
			if len(all) != usable {
				t.Errorf("%d reservations, want %d", len(all), usable)
			}
			owners := make(map[allocator.Owner]bool)
			for ip, o := range all {
				if !r.Contains(ip) || ip == r.Gateway {
					t.Errorf("handed out %s", ip)
				}
				if owners[o] {
					t.Errorf("%v holds two addresses", o)
				}
				owners[o] = true
				if held, _ := d.IPsOf(o); !slices.Equal(held, []netip.Addr{ip}) {
					t.Errorf("%v: index %v, reservation %s", o, held, ip)
				}
			}
			a = &allocator.Allocator{Sets: []allocator.RangeSet{{r}}, Store: d}
			if _, err := a.Allocate(allocator.Owner{ContainerID: "one-too-many", IfName: "eth0"}, nil); !errors.Is(err, allocator.ErrExhausted) {
				t.Errorf("ADD on a full range: %v", err)
			}
			if err := a.Usable(); !errors.Is(err, allocator.ErrExhausted) {
				t.Errorf("Usable on a full range: %v", err)
			}
		})
	}
}

func fill(b []byte, v byte) {
	for i := range b {
		b[i] = v
	}
}

func TestFormatParseOwner(t *testing.T) {
	for _, o := range []allocator.Owner{alice, bob} {
		got, err := store.ParseOwner(store.FormatOwner(o))
		if err != nil || got != o {
			t.Errorf("ParseOwner(FormatOwner(%v)) = %v, %v", o, got, err)
		}
	}
	for _, s := range []string{"", "a\n", "a\neth0", "a\neth0\n\n", "../x\neth0\n", "a\n\n", "a\neth0\nextra\n"} {
		if o, err := store.ParseOwner([]byte(s)); err == nil {
			t.Errorf("ParseOwner(%q) = %v", s, o)
		}
	}
}

func FuzzParseOwner(f *testing.F) {
	for _, s := range []string{"a\neth0\n", "alice\neth0\n", "../x\neth0\n", "a\n..\n", "a\na/b\n", "", "\n\n", "a\neth0", "a\x00\neth0\n", "a\n\xff\xfe\n", "a\n123456789012345\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		o, err := store.ParseOwner(data)
		if err != nil {
			return
		}
		if err := store.ValidateOwner(o); err != nil {
			t.Fatalf("ParseOwner(%q) = %q, which ValidateOwner rejects: %v", data, o, err)
		}
		if strings.ContainsRune(o.ContainerID, '/') || strings.ContainsRune(o.IfName, '/') {
			t.Fatalf("ParseOwner(%q) = %q: contains '/'", data, o)
		}
		if o.ContainerID == "" || o.IfName == "" || o.ContainerID == ".." || o.IfName == ".." || o.IfName == "." {
			t.Fatalf("ParseOwner(%q) = %q: empty or dot name", data, o)
		}
		if !bytes.Equal(store.FormatOwner(o), data) {
			t.Fatalf("FormatOwner(ParseOwner(%q)) = %q", data, store.FormatOwner(o))
		}
		if o2, err := store.ParseOwner(store.FormatOwner(o)); err != nil || o2 != o {
			t.Fatalf("round trip of %q: %q, %v", o, o2, err)
		}
	})
}

func FuzzParseIPList(f *testing.F) {
	for _, s := range []string{"", "\n", "10.0.0.2\n", "10.0.0.2\nfd00::2\n", "10.0.0.2", "::ffff:10.0.0.1\n", "fe80::1%eth0\n", "10.0.0.256\n", "\n\n10.0.0.1\n\n", "x\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		ips, err := store.ParseIPList(data)
		if err != nil {
			if ips != nil {
				t.Fatalf("ParseIPList(%q) = %v with error %v", data, ips, err)
			}
			return
		}
		var b bytes.Buffer
		for _, ip := range ips {
			if !ip.IsValid() {
				t.Fatalf("ParseIPList(%q) returned an invalid address", data)
			}
			b.WriteString(ip.String() + "\n")
		}
		again, err := store.ParseIPList(b.Bytes())
		if err != nil || !slices.Equal(again, ips) {
			t.Fatalf("round trip of %q: %v -> %q -> %v, %v", data, ips, b.Bytes(), again, err)
		}
	})
}
