package store

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/ipam/allocator"
)

// Disk is the on-disk store of one network:
//
//	<dataDir>/<network>/lock              flock held for a whole verb
//	<dataDir>/<network>/ips/<ip>          "containerID\nifname\n": the reservation
//	<dataDir>/<network>/owners/<cid>:<if> one address per line, then Meta
//	                                      lines (record.go): the owner index
//	<dataDir>/<network>/hints/<hash>      free-space bitmap + cursor of a range
//	<dataDir>/<network>/.tmp-*            temp files (made exclusively, O_EXCL)
//
// A reservation is made by writing a temp file, fsyncing it and hard-linking
// it to its ips/ name: link fails if the address is taken, and the file
// appears whole or not at all, so a kill -9 at any instant leaves no
// half-written reservation. The owner index is replaced by rename. A crash
// between the two leaves a reservation without index entry; GC (which scans)
// repairs that. Hints are only hints: a stale one costs a retry, never a
// duplicate.
//
// Every entry is opened relative to a descriptor of its directory, taken
// once by OpenDisk, and never through a symbolic link: the network
// directory, lock, ips/, owners/ and hints/ are opened with O_NOFOLLOW, as
// is every file in them. podnet-ipam creates no symlinks, so one in the
// store (or a device, FIFO, ...) is refused with an error wrapping
// ErrUnsafeEntry that names it, and nothing is written. Only the dataDir
// path itself, which the admin configures, may go through symlinks.
//
// A failed operation undoes what it wrote: a reservation whose directory
// entry could not be made durable is unlinked again, an owner index entry
// likewise, temp files are removed. A range's cursor (which address the
// next ADD tries first) is persisted only when an owner index entry is
// written, the commit point of an ADD, so an ADD that fails after
// reserving leaves the cursor where it was and its address goes to the
// next ADD.
type Disk struct {
	dir    string // path of the network directory, for messages
	dirFd  int    // the network directory: temp files, lock
	ipsFd  int
	ownFd  int
	hintFd int
	lockFd int
	hints  map[string]allocator.Hint
	files  []*hintFile // opened by Hint, closed by Close
	meta   *Meta       // what the next SetIPsOf records (SetMeta)
}

var networkName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`)

const tempPrefix = ".tmp-"

// ErrUnsafeEntry is wrapped by the error about a store entry that is a
// symbolic link, or otherwise not the kind of file podnet-ipam keeps there
// (a regular file, or a directory for the network, ips/, owners/, hints/).
var ErrUnsafeEntry = errors.New("unsafe IPAM store entry")

// OpenDisk opens (creating, mode 0700) the store of network under dataDir
// and takes its lock. Close releases it.
func OpenDisk(dataDir, network string) (_ *Disk, err error) {
	if !networkName.MatchString(network) {
		return nil, fmt.Errorf("invalid network name %q", network)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create IPAM data directory %s: %w", dataDir, err)
	}
	dataFd, err := unix.Open(dataDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open IPAM data directory %s: %w", dataDir, err)
	}
	defer unix.Close(dataFd)
	d := &Disk{dir: filepath.Join(dataDir, network), dirFd: -1, ipsFd: -1, ownFd: -1, hintFd: -1, lockFd: -1, hints: make(map[string]allocator.Hint)}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if d.dirFd, err = openDir(dataFd, network, d.dir); err != nil {
		return nil, err
	}
	for _, sub := range []struct {
		name string
		fd   *int
	}{{"ips", &d.ipsFd}, {"owners", &d.ownFd}, {"hints", &d.hintFd}} {
		if *sub.fd, err = openDir(d.dirFd, sub.name, filepath.Join(d.dir, sub.name)); err != nil {
			return nil, err
		}
	}
	lockPath := filepath.Join(d.dir, "lock")
	if d.lockFd, err = openFile(d.dirFd, "lock", lockPath, unix.O_RDWR|unix.O_CREAT); err != nil {
		return nil, fmt.Errorf("open IPAM lock: %w", err)
	}
	for {
		err = unix.Flock(d.lockFd, unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("lock IPAM store %s: %w", d.dir, err)
	}
	return d, nil
}

// Close releases the lock. It may be called more than once.
func (d *Disk) Close() error {
	for _, f := range d.files {
		f.close()
	}
	d.files = nil
	for _, fd := range []*int{&d.ipsFd, &d.ownFd, &d.hintFd, &d.dirFd} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
	if d.lockFd < 0 {
		return nil
	}
	err := unix.Close(d.lockFd) // last: everything above is written by now
	d.lockFd = -1
	if err != nil {
		return fmt.Errorf("close IPAM lock of %s: %w", d.dir, err)
	}
	return nil
}

// Dir is the network's directory.
func (d *Disk) Dir() string { return d.dir }

// Reserve implements allocator.Store.
func (d *Disk) Reserve(ip netip.Addr, o allocator.Owner) (bool, error) {
	if err := ValidateOwner(o); err != nil {
		return false, err
	}
	tmp, err := d.writeTemp(FormatOwner(o), true)
	if err != nil {
		return false, fmt.Errorf("reserve %s: %w", ip, err)
	}
	defer d.removeTemp(tmp)
	name := ip.String()
	// linkat with no flags: neither the temp file nor ips/<ip> is followed
	// if it is a symlink; an existing name (of any kind) is EEXIST.
	err = unix.Linkat(d.dirFd, tmp, d.ipsFd, name, 0)
	if errors.Is(err, unix.EEXIST) {
		var st unix.Stat_t
		if unix.Fstatat(d.ipsFd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			if err := checkKind(d.ipPath(ip), st.Mode, false); err != nil {
				return false, err
			}
		}
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reserve %s: link %s: %w", ip, d.ipPath(ip), err)
	}
	if err := fsyncDir(d.ipsFd, filepath.Join(d.dir, "ips")); err != nil {
		// Not known to be durable: take it back, so the failed ADD
		// leaves no reservation behind.
		_ = unix.Unlinkat(d.ipsFd, name, 0)
		return false, fmt.Errorf("reserve %s: %w", ip, err)
	}
	return true, nil
}

// Release implements allocator.Store. unlinkat removes a symlink itself,
// never what it points to.
func (d *Disk) Release(ip netip.Addr) error {
	if err := unix.Unlinkat(d.ipsFd, ip.String(), 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("release %s: remove %s: %w", ip, d.ipPath(ip), err)
	}
	return nil
}

// OwnerOf implements allocator.Store.
func (d *Disk) OwnerOf(ip netip.Addr) (allocator.Owner, bool, error) {
	data, err := readFile(d.ipsFd, ip.String(), d.ipPath(ip))
	if errors.Is(err, fs.ErrNotExist) {
		return allocator.Owner{}, false, nil
	}
	if err != nil {
		return allocator.Owner{}, false, fmt.Errorf("read reservation %s: %w", ip, err)
	}
	o, err := ParseOwner(data)
	if err != nil {
		// Reserved, but by nobody we can name: GC will release it.
		return allocator.Owner{}, true, nil
	}
	return o, true, nil
}

// IPsOf implements allocator.Store.
func (d *Disk) IPsOf(o allocator.Owner) ([]netip.Addr, error) {
	if err := ValidateOwner(o); err != nil {
		return nil, err
	}
	data, err := readFile(d.ownFd, ownerName(o), d.ownerPath(o))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read owner index of %s: %w", o.ContainerID, err)
	}
	return ParseIPList(data)
}

// metaFor is what SetIPsOf records with owner's addresses: the Meta of
// SetMeta, else the entry's own (a rewrite keeps it).
func (d *Disk) metaFor(o allocator.Owner) Meta {
	if d.meta != nil {
		return *d.meta
	}
	if r, ok, err := d.Record(o); err == nil && ok {
		return r.Meta
	}
	return Meta{}
}

// SetIPsOf implements allocator.Store. A successful write also persists
// the cursors moved since the store was opened (see Disk).
func (d *Disk) SetIPsOf(o allocator.Owner, ips []netip.Addr) error {
	if err := ValidateOwner(o); err != nil {
		return err
	}
	name, p := ownerName(o), d.ownerPath(o)
	if len(ips) == 0 {
		if err := unix.Unlinkat(d.ownFd, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("remove owner index of %s: %s: %w", o.ContainerID, p, err)
		}
		return nil
	}
	// rename would replace a symlink rather than follow it, but one there
	// is not podnet's: refuse it as every other access does.
	var st unix.Stat_t
	if err := unix.Fstatat(d.ownFd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
		if err := checkKind(p, st.Mode, false); err != nil {
			return err
		}
	} else if !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("write owner index of %s: stat %s: %w", o.ContainerID, p, err)
	}
	tmp, err := d.writeTemp(FormatRecord(Record{IPs: ips, Meta: d.metaFor(o)}), true)
	if err != nil {
		return fmt.Errorf("write owner index of %s: %w", o.ContainerID, err)
	}
	if err := unix.Renameat(d.dirFd, tmp, d.ownFd, name); err != nil {
		d.removeTemp(tmp)
		return fmt.Errorf("write owner index of %s: rename to %s: %w", o.ContainerID, p, err)
	}
	if err := fsyncDir(d.ownFd, filepath.Join(d.dir, "owners")); err != nil {
		// Not known to be durable: take it back (GC rebuilds index
		// entries from the reservations).
		_ = unix.Unlinkat(d.ownFd, name, 0)
		return fmt.Errorf("write owner index of %s: %w", o.ContainerID, err)
	}
	d.commitCursors()
	return nil
}

// All implements allocator.Store. Reservations whose file cannot be parsed
// get the zero Owner, which no valid attachment has.
func (d *Disk) All() (map[netip.Addr]allocator.Owner, error) {
	names, err := readDirNames(d.ipsFd, filepath.Join(d.dir, "ips"))
	if err != nil {
		return nil, fmt.Errorf("list reservations: %w", err)
	}
	out := make(map[netip.Addr]allocator.Owner, len(names))
	for _, n := range names {
		ip, err := netip.ParseAddr(n)
		if err != nil {
			continue
		}
		o, _, err := d.OwnerOf(ip)
		if err != nil {
			return nil, err
		}
		out[ip] = o
	}
	return out, nil
}

// Owners implements allocator.Store.
func (d *Disk) Owners() (map[allocator.Owner][]netip.Addr, error) {
	names, err := readDirNames(d.ownFd, filepath.Join(d.dir, "owners"))
	if err != nil {
		return nil, fmt.Errorf("list owner index: %w", err)
	}
	out := make(map[allocator.Owner][]netip.Addr, len(names))
	for _, n := range names {
		cid, ifName, ok := strings.Cut(n, ":")
		o := allocator.Owner{ContainerID: cid, IfName: ifName}
		if !ok || ValidateOwner(o) != nil {
			continue
		}
		ips, err := d.IPsOf(o)
		if errors.Is(err, ErrUnsafeEntry) {
			return nil, err
		}
		if err != nil {
			ips = nil // corrupt entry: GC rewrites it from the reservations
		}
		out[o] = ips
	}
	return out, nil
}

// RemoveTemp deletes temp files left by killed invocations (and the
// hints/*.new files of older versions). Only call it under the lock (no
// live writer then exists). Unlinking never follows a symlink.
func (d *Disk) RemoveTemp() error {
	for _, dir := range []struct {
		fd     int
		path   string
		isTemp func(string) bool
	}{
		{d.dirFd, d.dir, func(n string) bool { return strings.HasPrefix(n, tempPrefix) }},
		{d.hintFd, filepath.Join(d.dir, "hints"), func(n string) bool { return strings.HasSuffix(n, ".new") }},
	} {
		names, err := readDirNames(dir.fd, dir.path)
		if err != nil {
			return err
		}
		for _, n := range names {
			if !dir.isTemp(n) {
				continue
			}
			if err := unix.Unlinkat(dir.fd, n, 0); err != nil && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("remove temp file %s: %w", filepath.Join(dir.path, n), err)
			}
		}
	}
	return nil
}

func (d *Disk) ipPath(ip netip.Addr) string { return filepath.Join(d.dir, "ips", ip.String()) }

func ownerName(o allocator.Owner) string { return o.ContainerID + ":" + o.IfName }

func (d *Disk) ownerPath(o allocator.Owner) string {
	return filepath.Join(d.dir, "owners", ownerName(o))
}
