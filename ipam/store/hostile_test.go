package store_test

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/ipam/allocator"
	"github.com/podnet/podnet/ipam/store"
	"github.com/podnet/podnet/test/nettest"
)

var hostileRange = func() allocator.Range {
	r, err := allocator.NewRange(netip.MustParsePrefix("10.0.0.0/24"), netip.Addr{}, netip.Addr{}, netip.Addr{})
	if err != nil {
		panic(err)
	}
	return r
}()

// withAllocator opens the store and runs f on an allocator over it.
func withAllocator(dataDir string, f func(d *store.Disk, a *allocator.Allocator) error) error {
	d, err := store.OpenDisk(dataDir, "net")
	if err != nil {
		return err
	}
	defer d.Close()
	return f(d, &allocator.Allocator{Sets: []allocator.RangeSet{{hostileRange}}, Store: d})
}

// hostileStore is a store of network "net" holding bob's reservation of
// 10.0.0.2 (so ips/, owners/, hints/ and the lock exist), plus a directory
// outside it that planted symlinks point into.
type hostileStore struct {
	dataDir, outside string
	hint             string // name of the range's hint file
}

func newHostileStore(t *testing.T) *hostileStore {
	t.Helper()
	h := &hostileStore{dataDir: t.TempDir(), outside: t.TempDir()}
	err := withAllocator(h.dataDir, func(_ *store.Disk, a *allocator.Allocator) error {
		got, err := a.Allocate(bob, nil)
		if err == nil && got[0].Addr() != addr("10.0.0.2") {
			err = fmt.Errorf("bob got %v", got)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	hints, _ := os.ReadDir(filepath.Join(h.dataDir, "net", "hints"))
	if len(hints) != 1 {
		t.Fatalf("hints: %v", hints)
	}
	h.hint = hints[0].Name()
	return h
}

func (h *hostileStore) path(rel string) string { return filepath.Join(h.dataDir, "net", rel) }

// replaceWithSymlink removes the store entry rel (if any) and puts a
// symlink to target in its place.
func (h *hostileStore) replaceWithSymlink(t *testing.T, rel, target string) {
	t.Helper()
	must(t, os.RemoveAll(h.path(rel)))
	must(t, os.Symlink(target, h.path(rel)))
}

// runBounded runs f, failing the test if it does not return in time (an
// open of a planted FIFO would block forever).
func runBounded(t *testing.T, f func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f() }()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("store operation still blocked after 10s")
		return nil
	}
}

func addAlice(dataDir string) error {
	return withAllocator(dataDir, func(_ *store.Disk, a *allocator.Allocator) error {
		_, err := a.Allocate(alice, nil)
		return err
	})
}

func delBob(dataDir string) error {
	return withAllocator(dataDir, func(_ *store.Disk, a *allocator.Allocator) error { return a.Release(bob) })
}

// hostileVerbs are what the tests run on a store with something planted.
var hostileVerbs = map[string]func(dataDir string) error{"ADD": addAlice, "DEL": delBob, "GC": gcAll}

func gcAll(dataDir string) error {
	return withAllocator(dataDir, func(d *store.Disk, a *allocator.Allocator) error {
		if err := d.RemoveTemp(); err != nil {
			return err
		}
		_, err := a.GC(nil)
		return err
	})
}

// TestDiskRefusesSymlinks plants a symlink pointing outside the data
// directory at each entry of the store (dangling, so a create would make
// the target, or at an existing file or directory, so a write would land
// there) and runs a verb: it must fail with an ErrUnsafeEntry error that
// names the entry, create or change nothing outside, and leave the store
// as it was.
func TestDiskRefusesSymlinks(t *testing.T) {
	type tc struct {
		entry  string // under <dataDir>/net ("" is the network directory)
		target string // "dir", "file" (a copy of the entry's content, or junk) or "dangling"
		verb   string
	}
	var cases []tc
	for _, target := range []string{"dir", "dangling"} {
		for _, entry := range []string{"", "ips", "owners", "hints"} {
			cases = append(cases, tc{entry, target, "ADD"})
		}
	}
	for _, target := range []string{"file", "dangling"} {
		cases = append(cases,
			tc{"lock", target, "ADD"},
			tc{"ips/10.0.0.3", target, "ADD"}, // what alice would get
			tc{"owners/alice:eth0", target, "ADD"},
			tc{"hints/HINT", target, "ADD"},
			tc{"owners/bob-1.x_y:net1", target, "DEL"},
			tc{"ips/10.0.0.2", target, "GC"},
			tc{"owners/bob-1.x_y:net1", target, "GC"},
		)
	}
	for _, c := range cases {
		name := c.entry
		if name == "" {
			name = "network dir"
		}
		t.Run(c.verb+"/"+strings.ReplaceAll(name, "/", "_")+"/"+c.target, func(t *testing.T) {
			h := newHostileStore(t)
			entry := strings.ReplaceAll(c.entry, "HINT", h.hint)
			victim := filepath.Join(h.outside, "victim")
			switch c.target {
			case "dir":
				must(t, os.Mkdir(victim, 0o700))
			case "file":
				// The entry's own content where there is one, so that
				// following the link would find a valid file and write
				// through it.
				data, err := os.ReadFile(h.path(entry))
				if err != nil {
					data = []byte("10.0.0.7\n")
				}
				must(t, os.WriteFile(victim, data, 0o600))
			}
			h.replaceWithSymlink(t, entry, victim)
			storeBefore, outsideBefore := nettest.Tree(t, h.dataDir), nettest.Tree(t, h.outside)

			err := runBounded(t, func() error { return hostileVerbs[c.verb](h.dataDir) })
			if d := nettest.TreeChanges(outsideBefore, nettest.Tree(t, h.outside)); len(d) > 0 {
				t.Errorf("written outside the data directory: %v", d)
			}
			if d := nettest.TreeChanges(storeBefore, nettest.Tree(t, h.dataDir)); len(d) > 0 {
				t.Errorf("store changed: %v", d)
			}
			if !errors.Is(err, store.ErrUnsafeEntry) {
				t.Fatalf("got %v, want an error wrapping ErrUnsafeEntry", err)
			}
			for _, want := range []string{h.path(entry), "is a symbolic link"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

// TestDiskRefusesSpecialFiles: a FIFO or a directory where the store keeps
// a regular file is refused too (and a FIFO does not hang the verb).
func TestDiskRefusesSpecialFiles(t *testing.T) {
	for _, c := range []struct {
		entry, kind, verb string
	}{
		{"lock", "fifo", "ADD"},
		{"owners/alice:eth0", "fifo", "ADD"},
		{"ips/10.0.0.3", "fifo", "ADD"},
		{"hints/HINT", "fifo", "ADD"},
		{"ips/10.0.0.2", "fifo", "GC"},
		{"owners/alice:eth0", "dir", "ADD"},
		{"ips", "file", "ADD"},
	} {
		t.Run(c.verb+"/"+strings.ReplaceAll(c.entry, "/", "_")+"/"+c.kind, func(t *testing.T) {
			h := newHostileStore(t)
			entry := strings.ReplaceAll(c.entry, "HINT", h.hint)
			p := h.path(entry)
			must(t, os.RemoveAll(p))
			switch c.kind {
			case "fifo":
				must(t, unix.Mkfifo(p, 0o600))
			case "dir":
				must(t, os.Mkdir(p, 0o700))
			case "file":
				must(t, os.WriteFile(p, nil, 0o600))
			}
			before := nettest.Tree(t, h.dataDir)
			err := runBounded(t, func() error { return hostileVerbs[c.verb](h.dataDir) })
			if !errors.Is(err, store.ErrUnsafeEntry) || !strings.Contains(err.Error(), p) {
				t.Fatalf("got %v, want an ErrUnsafeEntry error naming %s", err, p)
			}
			if d := nettest.TreeChanges(before, nettest.Tree(t, h.dataDir)); len(d) > 0 {
				t.Errorf("store changed: %v", d)
			}
		})
	}
}

// TestDiskHintTempNotFollowed: the hint file is rewritten through a temp
// file; a symlink planted where an older version put that temp file
// (hints/<hash>.new) is never written through, and GC removes it (the
// symlink, not its target).
func TestDiskHintTempNotFollowed(t *testing.T) {
	h := newHostileStore(t)
	victim := filepath.Join(h.outside, "victim")
	must(t, os.WriteFile(victim, []byte("precious"), 0o600))
	// A missing hint makes the next verb write a whole new one.
	must(t, os.Remove(h.path("hints/"+h.hint)))
	must(t, os.Symlink(victim, h.path("hints/"+h.hint+".new")))
	// And a symlink with the temp prefix, as a killed writer would leave.
	must(t, os.Symlink(victim, h.path(".tmp-planted")))
	outsideBefore := nettest.Tree(t, h.outside)

	if err := addAlice(h.dataDir); err != nil {
		t.Fatal(err)
	}
	if err := gcAll(h.dataDir); err != nil {
		t.Fatal(err)
	}
	if d := nettest.TreeChanges(outsideBefore, nettest.Tree(t, h.outside)); len(d) > 0 {
		t.Errorf("written outside the data directory: %v", d)
	}
	for _, p := range []string{h.path("hints/" + h.hint + ".new"), h.path(".tmp-planted")} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s after GC: %v, want it removed", p, err)
		}
	}
	fi, err := os.Lstat(h.path("hints/" + h.hint))
	if err != nil || !fi.Mode().IsRegular() {
		t.Errorf("hint file after ADD: %v, %v; want a regular file", fi, err)
	}
}

// TestDiskDataDirSymlinkAllowed: the configured dataDir itself may be
// reached through a symlink (the admin's choice); only the store's own
// entries may not.
func TestDiskDataDirSymlinkAllowed(t *testing.T) {
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "data")
	must(t, os.Symlink(real, link))
	if err := addAlice(link); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(real, "net", "owners", "alice:eth0")); err != nil {
		t.Errorf("owner entry not in the symlinked data directory: %v", err)
	}
}

// TestDiskCursorCommittedWithOwner: the cursor moved by a reservation is
// persisted only when the owner entry is written, so an ADD that fails in
// between leaves the next ADD the same address (see TestIPAMDiskFull for
// the real thing).
func TestDiskCursorCommittedWithOwner(t *testing.T) {
	dataDir := t.TempDir()
	err := withAllocator(dataDir, func(d *store.Disk, _ *allocator.Allocator) error {
		h, err := d.Hint(hostileRange)
		if err != nil {
			return err
		}
		off := hostileRange.Offset(addr("10.0.0.2"))
		ok, err := d.Reserve(hostileRange.At(off), alice)
		if !ok || err != nil {
			return fmt.Errorf("Reserve = %v, %v", ok, err)
		}
		must(t, h.Mark(off, true))
		must(t, h.SetCursor(off+1))
		// The ADD fails here: what it reserved is released.
		must(t, d.Release(hostileRange.At(off)))
		return h.Mark(off, false)
	})
	must(t, err)
	var got []netip.Prefix
	must(t, withAllocator(dataDir, func(_ *store.Disk, a *allocator.Allocator) (err error) {
		got, err = a.Allocate(bob, nil)
		return err
	}))
	if len(got) != 1 || got[0].Addr() != addr("10.0.0.2") {
		t.Errorf("after an ADD that failed before its owner entry: %v, want 10.0.0.2", got)
	}
	// A committed ADD does move it.
	must(t, withAllocator(dataDir, func(_ *store.Disk, a *allocator.Allocator) (err error) {
		got, err = a.Allocate(alice, nil)
		return err
	}))
	if len(got) != 1 || got[0].Addr() != addr("10.0.0.3") {
		t.Errorf("after a committed ADD: %v, want 10.0.0.3", got)
	}
}

// TestDiskCloseTwice: a second Close is harmless (and closes nothing that
// is not the store's).
func TestDiskCloseTwice(t *testing.T) {
	d, err := store.OpenDisk(t.TempDir(), "net")
	must(t, err)
	must(t, d.Close())
	f, err := os.Open(os.DevNull) // may get one of the store's old descriptors
	must(t, err)
	defer f.Close()
	if err := d.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := f.Stat(); err != nil {
		t.Errorf("second Close closed an unrelated file: %v", err)
	}
}

// TestDiskRefusesHugeEntries: a reservation or owner index entry bigger
// than podnet-ipam ever writes (1 TiB, sparse, so it takes no disk; and
// one byte over the 1 MiB bound) is refused with an ErrUnsafeEntry error
// naming it, unread: reading it whole would take all the memory of the
// verb or of podnet-routed's reconcile (ReadSnapshot), which died of it.
// Nothing in the store changes.
func TestDiskRefusesHugeEntries(t *testing.T) {
	// ReadSnapshot reads on past the entry, and says why it skipped it.
	snapshot := func(dataDir string) error {
		s, err := store.ReadSnapshot(dataDir, "net")
		if err != nil {
			return fmt.Errorf("ReadSnapshot stopped: %w", err)
		}
		if len(s.Skipped) != 1 {
			return fmt.Errorf("skipped %v, want the one entry", s.Skipped)
		}
		return s.Skipped[0]
	}
	record := func(dataDir string) error {
		d, err := store.OpenDisk(dataDir, "net")
		if err != nil {
			return err
		}
		defer d.Close()
		_, _, err = d.Record(bob)
		return err
	}
	reservation := func(dataDir string) error {
		d, err := store.OpenDisk(dataDir, "net")
		if err != nil {
			return err
		}
		defer d.Close()
		_, _, err = d.Reservation(addr("10.0.0.2"))
		return err
	}
	verbs := map[string]func(string) error{"DEL": delBob, "GC": gcAll, "ReadSnapshot": snapshot, "Record": record, "Reservation": reservation}
	for _, c := range []struct {
		entry string
		size  int64
		verbs []string
	}{
		{"owners/bob-1.x_y:net1", 1 << 40, []string{"DEL", "GC", "ReadSnapshot", "Record"}},
		{"owners/bob-1.x_y:net1", 1<<20 + 1, []string{"DEL", "ReadSnapshot"}},
		{"ips/10.0.0.2", 1 << 40, []string{"GC", "ReadSnapshot", "Reservation"}},
	} {
		for _, verb := range c.verbs {
			t.Run(fmt.Sprintf("%s/%s/%d", verb, strings.ReplaceAll(c.entry, "/", "_"), c.size), func(t *testing.T) {
				h := newHostileStore(t)
				p := h.path(c.entry)
				must(t, os.Truncate(p, c.size))
				names := func() []string {
					var out []string
					for _, sub := range []string{"ips", "owners"} {
						es, err := os.ReadDir(h.path(sub))
						must(t, err)
						for _, e := range es {
							out = append(out, sub+"/"+e.Name())
						}
					}
					return out
				}
				before := names()
				err := runBounded(t, func() error { return verbs[verb](h.dataDir) })
				if !errors.Is(err, store.ErrUnsafeEntry) || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "bytes long") {
					t.Fatalf("got %v, want an ErrUnsafeEntry error naming %s and its size", err, p)
				}
				if after := names(); fmt.Sprint(after) != fmt.Sprint(before) {
					t.Errorf("store entries %v, were %v", after, before)
				}
				if fi, err := os.Stat(p); err != nil || fi.Size() != c.size {
					t.Errorf("%s: %v %v, want %d bytes still", p, fi, err, c.size)
				}
			})
		}
	}
}
