package store

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/pkg/utils"
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

// Flags of every open of a store file: never through a symlink, never
// becoming the controlling terminal, never blocking on a FIFO planted in
// the store (the file type is checked right after).
const (
	openFlags = unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NOCTTY | unix.O_NONBLOCK
	dirFlags  = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
)

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

// openDir creates (mode 0700) and opens directory name under the directory
// parent, refusing a symlink or anything but a directory there.
func openDir(parent int, name, path string) (int, error) {
	if err := unix.Mkdirat(parent, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return -1, fmt.Errorf("create IPAM data directory %s: %w", path, err)
	}
	fd, err := unix.Openat(parent, name, dirFlags, 0)
	if err != nil {
		return -1, entryError(parent, name, path, true, err)
	}
	return fd, nil
}

// openFile opens the regular file name under the directory parent with
// flags (plus openFlags); it is created with mode 0600 when flags has
// O_CREAT. A symlink or a non-regular file is refused.
func openFile(parent int, name, path string, flags int) (int, error) {
	fd, err := unix.Openat(parent, name, flags|openFlags, 0o600)
	if err != nil {
		return -1, entryError(parent, name, path, false, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("stat %s: %w", path, err)
	}
	if err := checkKind(path, st.Mode, false); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// entryError explains a failed open of name under parent: an ErrUnsafeEntry
// error when it is a symlink or the wrong kind of file, else err with the
// path (a missing file stays errors.Is fs.ErrNotExist).
func entryError(parent int, name, path string, wantDir bool, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENXIO) {
		var st unix.Stat_t
		if unix.Fstatat(parent, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			if kerr := checkKind(path, st.Mode, wantDir); kerr != nil {
				return kerr
			}
		}
	}
	return fmt.Errorf("open %s: %w", path, err)
}

// checkKind returns an ErrUnsafeEntry error unless mode is a regular file
// (a directory when wantDir).
func checkKind(path string, mode uint32, wantDir bool) error {
	want, ok := "a regular file", mode&unix.S_IFMT == unix.S_IFREG
	if wantDir {
		want, ok = "a directory", mode&unix.S_IFMT == unix.S_IFDIR
	}
	if ok {
		return nil
	}
	var kind string
	switch mode & unix.S_IFMT {
	case unix.S_IFLNK:
		kind = "a symbolic link"
	case unix.S_IFDIR:
		kind = "a directory"
	case unix.S_IFREG:
		kind = "a regular file"
	case unix.S_IFIFO:
		kind = "a named pipe"
	case unix.S_IFSOCK:
		kind = "a socket"
	default:
		kind = "a device file"
	}
	return fmt.Errorf("%w: %s is %s, not %s; podnet-ipam never creates one in its data directory and does not follow or use it: remove it", ErrUnsafeEntry, path, kind, want)
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

// writeTemp writes data to a new 0600 temp file in the network directory,
// created exclusively (so nothing that already exists under its name, a
// symlink included, is ever written through), fsynced when sync, and
// returns its name. On failure nothing is left.
func (d *Disk) writeTemp(data []byte, sync bool) (string, error) {
	var name string
	var fd int
	for try := 0; ; try++ {
		name = tempPrefix + strconv.FormatUint(rand.Uint64(), 36)
		var err error
		fd, err = unix.Openat(d.dirFd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|openFlags, 0o600)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EEXIST) || try == 100 {
			return "", fmt.Errorf("create temp file in %s: %w", d.dir, err)
		}
	}
	err := writeAll(fd, data)
	if err == nil && sync {
		err = unix.Fsync(fd)
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		d.removeTemp(name)
		return "", fmt.Errorf("write temp file %s: %w", filepath.Join(d.dir, name), err)
	}
	return name, nil
}

func (d *Disk) removeTemp(name string) { _ = unix.Unlinkat(d.dirFd, name, 0) }

func writeAll(fd int, data []byte) error {
	for len(data) > 0 {
		n, err := unix.Write(fd, data)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return err
		}
		data = data[n:]
	}
	return nil
}

func fsyncDir(fd int, path string) error {
	if err := unix.Fsync(fd); err != nil {
		return fmt.Errorf("sync %s: %w", path, err)
	}
	return nil
}

// maxEntrySize bounds a reservation or owner index entry: podnet-ipam
// writes a few hundred bytes there (an owner index entry's Meta strings
// are at most maxMetaValue each). A bigger file is not one it wrote, and
// reading it whole could take all the memory of the reader, podnet-routed
// included, which reads every entry at each leak reconcile pass.
const maxEntrySize = 1 << 20

// readFile reads the regular file name under the directory parent, a
// reservation or an owner index entry: one bigger than maxEntrySize is
// refused (ErrUnsafeEntry) without being read.
func readFile(parent int, name, path string) ([]byte, error) {
	fd, err := openFile(parent, name, path, unix.O_RDONLY)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return readAll(fd, path, maxEntrySize)
}

// readAll reads fd from offset 0 to its end; with limit > 0, a file longer
// than limit bytes is an ErrUnsafeEntry error.
func readAll(fd int, path string, limit int64) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	tooBig := func(size string) error {
		return fmt.Errorf("%w: %s is %s bytes long, more than podnet-ipam ever writes there (%d)", ErrUnsafeEntry, path, size, limit)
	}
	if limit > 0 && st.Size > limit {
		return nil, tooBig(strconv.FormatInt(st.Size, 10))
	}
	buf := make([]byte, 0, st.Size+1)
	for {
		if limit > 0 && int64(len(buf)) > limit { // grown since the stat
			return nil, tooBig(fmt.Sprintf("at least %d", len(buf)))
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := unix.Pread(fd, buf[len(buf):cap(buf)], int64(len(buf)))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", path, err)
		}
		if n == 0 {
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
}

// readDirNames lists the directory fd (at path).
func readDirNames(fd int, path string) ([]string, error) {
	dfd, err := unix.Openat(fd, ".", dirFlags, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	f := os.NewFile(uintptr(dfd), path)
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", path, err)
	}
	return names, nil
}

// ValidateOwner rejects container IDs and interface names that could
// escape the store's directories or make ambiguous file names.
func ValidateOwner(o allocator.Owner) error {
	if err := utils.ValidateContainerID(o.ContainerID); err != nil {
		return fmt.Errorf("container ID %q: %s", o.ContainerID, err.Msg)
	}
	if err := utils.ValidateInterfaceName(o.IfName); err != nil {
		return fmt.Errorf("interface name %q: %s", o.IfName, err.Msg)
	}
	return nil
}

// FormatOwner is the content of a reservation file.
func FormatOwner(o allocator.Owner) []byte {
	return []byte(o.ContainerID + "\n" + o.IfName + "\n")
}

// ParseOwner reads a reservation file.
func ParseOwner(data []byte) (allocator.Owner, error) {
	lines := strings.Split(string(data), "\n")
	if len(lines) != 3 || lines[2] != "" {
		return allocator.Owner{}, fmt.Errorf("reservation file: want 2 lines, got %q", data)
	}
	o := allocator.Owner{ContainerID: lines[0], IfName: lines[1]}
	if err := ValidateOwner(o); err != nil {
		return allocator.Owner{}, fmt.Errorf("reservation file: %w", err)
	}
	return o, nil
}

// ParseIPList reads the addresses of an owner index entry (ParseRecord).
func ParseIPList(data []byte) ([]netip.Addr, error) {
	r, err := ParseRecord(data)
	return r.IPs, err
}

// Hint implements allocator.Store: a bitmap file per range (or, for huge
// ranges, just a cursor), read once per invocation and written through
// (the cursor at commit, see Disk).
func (d *Disk) Hint(r allocator.Range) (allocator.Hint, error) {
	key := r.String()
	if h, ok := d.hints[key]; ok {
		return h, nil
	}
	sum := sha256.Sum256([]byte(key))
	f := &hintFile{d: d, name: hex.EncodeToString(sum[:8]), fd: -1}
	data, err := f.read()
	if err != nil {
		f.close()
		return nil, fmt.Errorf("read hint of %s: %w", key, err)
	}
	d.files = append(d.files, f)
	var h allocator.Hint
	if r.Size() <= allocator.MaxBitmapSize {
		b, ok := decodeBitmap(data, r.Size())
		if !ok {
			// Missing or torn: start from "all free", Reserve verifies.
			b = allocator.NewBitmap(r.Size())
		}
		b.Persist = f
		if !ok {
			if err := f.WriteAll(b); err != nil {
				return nil, err
			}
		}
		h = b
	} else {
		s := &allocator.SparseHint{Persist: f.WriteCursor}
		if len(data) >= 16 {
			s.Pos = binary.LittleEndian.Uint64(data[8:16])
		}
		h = s
	}
	d.hints[key] = h
	return h, nil
}

// hintFile is a Bitmap persisted as: size (8 bytes LE), cursor (8 bytes
// LE), then the words (8 bytes LE each). Single-word updates are written
// in place through a descriptor kept open for the verb: a torn write there
// only makes the hint stale. So does a failed one, which is therefore not
// an error: it must not fail an ADD that already holds its reservation.
type hintFile struct {
	d      *Disk
	name   string // under hints/
	fd     int    // -1: not open (yet, or since WriteAll replaced the file)
	cursor uint64 // cursor to persist at commit, when dirty
	dirty  bool
}

const hintHeader = 16

func (f *hintFile) path() string { return filepath.Join(f.d.dir, "hints", f.name) }

// read opens the hint file and returns its content; a missing file is
// empty.
func (f *hintFile) read() ([]byte, error) {
	fd, err := openFile(f.d.hintFd, f.name, f.path(), unix.O_RDWR)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	f.fd = fd
	return readAll(fd, f.path(), 0)
}

func (f *hintFile) close() {
	if f.fd >= 0 {
		unix.Close(f.fd)
		f.fd = -1
	}
}

func decodeBitmap(data []byte, size uint64) (*allocator.Bitmap, bool) {
	words := int((size + 63) / 64)
	if len(data) != hintHeader+8*words || binary.LittleEndian.Uint64(data[0:8]) != size {
		return nil, false
	}
	b := allocator.NewBitmap(size)
	b.Pos = binary.LittleEndian.Uint64(data[8:16]) % size
	for i := range b.Words {
		b.Words[i] = binary.LittleEndian.Uint64(data[hintHeader+8*i:])
	}
	return b, true
}

func (f *hintFile) writeAt(off int64, data []byte) error {
	if f.fd < 0 {
		fd, err := openFile(f.d.hintFd, f.name, f.path(), unix.O_RDWR|unix.O_CREAT)
		if err != nil {
			return fmt.Errorf("open hint: %w", err)
		}
		f.fd = fd
	}
	for len(data) > 0 {
		n, err := unix.Pwrite(f.fd, data, off)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("write hint %s: %w", f.path(), err)
		}
		data, off = data[n:], off+int64(n)
	}
	return nil
}

// WriteWord writes one word in place, best effort (see hintFile).
func (f *hintFile) WriteWord(i int, w uint64) error {
	_ = f.writeAt(hintHeader+8*int64(i), binary.LittleEndian.AppendUint64(nil, w))
	return nil
}

// WriteCursor records the cursor; commitCursors writes it when the ADD
// that moved it commits.
func (f *hintFile) WriteCursor(c uint64) error {
	f.cursor, f.dirty = c, true
	return nil
}

// commitCursors writes the cursors moved since the store was opened, best
// effort (see hintFile).
func (d *Disk) commitCursors() {
	for _, f := range d.files {
		if f.dirty {
			_ = f.writeAt(8, binary.LittleEndian.AppendUint64(nil, f.cursor))
			f.dirty = false
		}
	}
}

// WriteAll replaces the hint file by rename of a new temp file.
func (f *hintFile) WriteAll(b *allocator.Bitmap) error {
	buf := make([]byte, 0, hintHeader+8*len(b.Words))
	buf = binary.LittleEndian.AppendUint64(buf, b.Size)
	buf = binary.LittleEndian.AppendUint64(buf, b.Pos)
	for _, w := range b.Words {
		buf = binary.LittleEndian.AppendUint64(buf, w)
	}
	tmp, err := f.d.writeTemp(buf, false)
	if err != nil {
		return fmt.Errorf("write hint: %w", err)
	}
	if err := unix.Renameat(f.d.dirFd, tmp, f.d.hintFd, f.name); err != nil {
		f.d.removeTemp(tmp)
		return fmt.Errorf("install hint %s: %w", f.path(), err)
	}
	f.close() // the old file's; the next write opens the new one
	f.dirty = false
	return nil
}
