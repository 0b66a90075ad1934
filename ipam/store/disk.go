package store

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/containernetworking/cni/pkg/utils"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/ipam/allocator"
)

// Disk is the on-disk store of one network:
//
//	<dataDir>/<network>/lock              flock held for a whole verb
//	<dataDir>/<network>/ips/<ip>          "containerID\nifname\n": the reservation
//	<dataDir>/<network>/owners/<cid>:<if> one address per line: the owner index
//	<dataDir>/<network>/hints/<hash>      free-space bitmap + cursor of a range
//
// A reservation is made by writing a temp file, fsyncing it and hard-linking
// it to its ips/ name: link fails if the address is taken, and the file
// appears whole or not at all, so a kill -9 at any instant leaves no
// half-written reservation. The owner index is replaced by rename. A crash
// between the two leaves a reservation without index entry; GC (which scans)
// repairs that. Hints are only hints: a stale one costs a retry, never a
// duplicate.
type Disk struct {
	dir   string
	lock  *os.File
	hints map[string]allocator.Hint
}

var networkName = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`)

const tempPrefix = ".tmp-"

// OpenDisk opens (creating, mode 0700) the store of network under dataDir
// and takes its lock. Close releases it.
func OpenDisk(dataDir, network string) (*Disk, error) {
	if !networkName.MatchString(network) {
		return nil, fmt.Errorf("invalid network name %q", network)
	}
	dir := filepath.Join(dataDir, network)
	for _, d := range []string{dataDir, dir, filepath.Join(dir, "ips"), filepath.Join(dir, "owners"), filepath.Join(dir, "hints")} {
		if err := os.Mkdir(d, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			if err := os.MkdirAll(d, 0o700); err != nil {
				return nil, fmt.Errorf("create IPAM data directory %s: %w", d, err)
			}
		}
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open IPAM lock: %w", err)
	}
	for {
		err = unix.Flock(int(lock.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("lock IPAM store %s: %w", dir, err)
	}
	return &Disk{dir: dir, lock: lock, hints: make(map[string]allocator.Hint)}, nil
}

// Close releases the lock.
func (d *Disk) Close() error { return d.lock.Close() }

// Dir is the network's directory.
func (d *Disk) Dir() string { return d.dir }

// Reserve implements allocator.Store.
func (d *Disk) Reserve(ip netip.Addr, o allocator.Owner) (bool, error) {
	if err := ValidateOwner(o); err != nil {
		return false, err
	}
	tmp, err := d.writeTemp(FormatOwner(o))
	if err != nil {
		return false, err
	}
	defer os.Remove(tmp)
	err = os.Link(tmp, d.ipPath(ip))
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reserve %s: %w", ip, err)
	}
	return true, d.syncDir("ips")
}

// Release implements allocator.Store.
func (d *Disk) Release(ip netip.Addr) error {
	if err := os.Remove(d.ipPath(ip)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("release %s: %w", ip, err)
	}
	return nil
}

// OwnerOf implements allocator.Store.
func (d *Disk) OwnerOf(ip netip.Addr) (allocator.Owner, bool, error) {
	data, err := os.ReadFile(d.ipPath(ip))
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
	data, err := os.ReadFile(d.ownerPath(o))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read owner index of %s: %w", o.ContainerID, err)
	}
	return ParseIPList(data)
}

// SetIPsOf implements allocator.Store.
func (d *Disk) SetIPsOf(o allocator.Owner, ips []netip.Addr) error {
	if err := ValidateOwner(o); err != nil {
		return err
	}
	p := d.ownerPath(o)
	if len(ips) == 0 {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove owner index of %s: %w", o.ContainerID, err)
		}
		return nil
	}
	var b bytes.Buffer
	for _, ip := range ips {
		b.WriteString(ip.String() + "\n")
	}
	tmp, err := d.writeTemp(b.Bytes())
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, p); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write owner index of %s: %w", o.ContainerID, err)
	}
	return d.syncDir("owners")
}

// All implements allocator.Store. Reservations whose file cannot be parsed
// get the zero Owner, which no valid attachment has.
func (d *Disk) All() (map[netip.Addr]allocator.Owner, error) {
	entries, err := os.ReadDir(filepath.Join(d.dir, "ips"))
	if err != nil {
		return nil, fmt.Errorf("list reservations: %w", err)
	}
	out := make(map[netip.Addr]allocator.Owner, len(entries))
	for _, e := range entries {
		ip, err := netip.ParseAddr(e.Name())
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
	entries, err := os.ReadDir(filepath.Join(d.dir, "owners"))
	if err != nil {
		return nil, fmt.Errorf("list owner index: %w", err)
	}
	out := make(map[allocator.Owner][]netip.Addr, len(entries))
	for _, e := range entries {
		cid, ifName, ok := strings.Cut(e.Name(), ":")
		o := allocator.Owner{ContainerID: cid, IfName: ifName}
		if !ok || ValidateOwner(o) != nil {
			continue
		}
		ips, err := d.IPsOf(o)
		if err != nil {
			ips = nil // corrupt entry: GC rewrites it from the reservations
		}
		out[o] = ips
	}
	return out, nil
}

// RemoveTemp deletes temp files left by killed invocations. Only call it
// under the lock (no live writer then exists).
func (d *Disk) RemoveTemp() error {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return fmt.Errorf("list %s: %w", d.dir, err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			if err := os.Remove(filepath.Join(d.dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
	}
	return nil
}

func (d *Disk) ipPath(ip netip.Addr) string { return filepath.Join(d.dir, "ips", ip.String()) }

func (d *Disk) ownerPath(o allocator.Owner) string {
	return filepath.Join(d.dir, "owners", o.ContainerID+":"+o.IfName)
}

// writeTemp writes data to a new fsynced 0600 temp file in the network
// directory and returns its path.
func (d *Disk) writeTemp(data []byte) (string, error) {
	f, err := os.CreateTemp(d.dir, tempPrefix+"*")
	if err != nil {
		return "", fmt.Errorf("create temp file: %w", err)
	}
	if _, err := f.Write(data); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("write temp file: %w", err)
	}
	return f.Name(), nil
}

func (d *Disk) syncDir(sub string) error {
	f, err := os.Open(filepath.Join(d.dir, sub))
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", sub, err)
	}
	return nil
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

// ParseIPList reads an owner index file: one address per line.
func ParseIPList(data []byte) ([]netip.Addr, error) {
	var ips []netip.Addr
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" {
			continue
		}
		ip, err := netip.ParseAddr(line)
		if err != nil {
			return nil, fmt.Errorf("owner index: %w", err)
		}
		ips = append(ips, ip)
	}
	return ips, nil
}

// Hint implements allocator.Store: a bitmap file per range (or, for huge
// ranges, just a cursor), read once per invocation and written through.
func (d *Disk) Hint(r allocator.Range) (allocator.Hint, error) {
	key := r.String()
	if h, ok := d.hints[key]; ok {
		return h, nil
	}
	sum := sha256.Sum256([]byte(key))
	f := &hintFile{path: filepath.Join(d.dir, "hints", hex.EncodeToString(sum[:8]))}
	data, err := os.ReadFile(f.path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("read hint of %s: %w", key, err)
	}
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
// in place: a torn write there only makes the hint stale.
type hintFile struct{ path string }

const hintHeader = 16

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
	fh, err := os.OpenFile(f.path, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open hint: %w", err)
	}
	defer fh.Close()
	if _, err := fh.WriteAt(data, off); err != nil {
		return fmt.Errorf("write hint: %w", err)
	}
	return nil
}

func (f *hintFile) WriteWord(i int, w uint64) error {
	return f.writeAt(hintHeader+8*int64(i), binary.LittleEndian.AppendUint64(nil, w))
}

func (f *hintFile) WriteCursor(c uint64) error {
	return f.writeAt(8, binary.LittleEndian.AppendUint64(nil, c))
}

func (f *hintFile) WriteAll(b *allocator.Bitmap) error {
	buf := make([]byte, 0, hintHeader+8*len(b.Words))
	buf = binary.LittleEndian.AppendUint64(buf, b.Size)
	buf = binary.LittleEndian.AppendUint64(buf, b.Pos)
	for _, w := range b.Words {
		buf = binary.LittleEndian.AppendUint64(buf, w)
	}
	tmp := f.path + ".new"
	if err := os.WriteFile(tmp, buf, 0o600); err != nil {
		return fmt.Errorf("write hint: %w", err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		return fmt.Errorf("install hint: %w", err)
	}
	return nil
}
