package store

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/containernetworking/cni/pkg/utils"
	"github.com/podnet/podnet/ipam/allocator"
)

// Meta is what ADD records with an attachment's owner index entry, so that
// podnet-routed can later tell whether its pod is still alive although no
// runtime calls DEL or GC (routed/reconcile). Every field may be empty: a
// store written by an older podnet has none, a runtime may pass no pod.
type Meta struct {
	// Netns is CNI_NETNS at ADD; NetnsIno the inode of that network
	// namespace (nsfs), which tells it from a later one mounted at the
	// same path.
	Netns    string
	NetnsIno uint64
	// PodNamespace, PodName, PodUID are K8S_POD_NAMESPACE, K8S_POD_NAME
	// and K8S_POD_UID from CNI_ARGS: set when a Kubernetes runtime made
	// the attachment.
	PodNamespace, PodName, PodUID string
	// Created is when ADD wrote the entry.
	Created time.Time
	// BootID is the kernel's boot ID at ADD: a record of another boot
	// cannot belong to a live pod (no netns survives a reboot).
	BootID string
}

// IsZero reports whether m records nothing (an entry of an older podnet).
func (m Meta) IsZero() bool { return m == Meta{} }

// HasPod reports whether a Kubernetes runtime named the pod at ADD.
func (m Meta) HasPod() bool { return m.PodName != "" || m.PodUID != "" }

// Record is an attachment's owner index entry: its addresses and Meta.
type Record struct {
	IPs []netip.Addr
	Meta
}

// The keys of the Meta lines of an owner index entry. Their values are Go
// quoted strings (any byte may appear in a netns path), but for the
// numbers and the time.
const (
	keyNetns        = "netns"
	keyNetnsIno     = "netns-ino"
	keyPodNamespace = "pod-namespace"
	keyPodName      = "pod-name"
	keyPodUID       = "pod-uid"
	keyCreated      = "created"
	keyBootID       = "boot-id"
)

// maxMetaValue bounds each recorded string: CNI_NETNS and CNI_ARGS come
// from the runtime, and an owner index entry is read on every DEL.
const maxMetaValue = 4096

// FormatRecord is the content of an owner index entry: one address per
// line (all a podnet older than the Meta lines wrote), then one "key=value"
// line per Meta field set.
func FormatRecord(r Record) []byte {
	var b strings.Builder
	for _, ip := range r.IPs {
		b.WriteString(ip.String())
		b.WriteByte('\n')
	}
	str := func(k, v string) {
		if v != "" {
			b.WriteString(k + "=" + strconv.Quote(v) + "\n")
		}
	}
	str(keyNetns, r.Netns)
	if r.NetnsIno != 0 {
		b.WriteString(keyNetnsIno + "=" + strconv.FormatUint(r.NetnsIno, 10) + "\n")
	}
	str(keyPodNamespace, r.PodNamespace)
	str(keyPodName, r.PodName)
	str(keyPodUID, r.PodUID)
	if !r.Created.IsZero() {
		b.WriteString(keyCreated + "=" + r.Created.UTC().Format(time.RFC3339Nano) + "\n")
	}
	str(keyBootID, r.BootID)
	return []byte(b.String())
}

// ParseRecord reads an owner index entry, of this podnet (addresses then
// Meta lines) or of an older one (addresses only). Unknown keys are
// skipped, for a newer podnet's sake; a line that is neither an address
// nor a known key with a valid value is an error.
func ParseRecord(data []byte) (Record, error) {
	var r Record
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" {
			continue
		}
		k, v, isMeta := strings.Cut(line, "=")
		if !isMeta {
			ip, err := netip.ParseAddr(line)
			if err != nil {
				return Record{}, fmt.Errorf("owner index: %w", err)
			}
			r.IPs = append(r.IPs, ip)
			continue
		}
		if err := r.set(k, v); err != nil {
			return Record{}, fmt.Errorf("owner index: %s: %w", k, err)
		}
	}
	return r, nil
}

func (r *Record) set(k, v string) error {
	str := func(dst *string) error {
		s, err := strconv.Unquote(v)
		if err != nil {
			return fmt.Errorf("not a quoted string: %q", v)
		}
		if len(s) > maxMetaValue {
			return fmt.Errorf("longer than %d bytes", maxMetaValue)
		}
		*dst = s
		return nil
	}
	switch k {
	case keyNetns:
		return str(&r.Netns)
	case keyPodNamespace:
		return str(&r.PodNamespace)
	case keyPodName:
		return str(&r.PodName)
	case keyPodUID:
		return str(&r.PodUID)
	case keyBootID:
		return str(&r.BootID)
	case keyNetnsIno:
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return err
		}
		r.NetnsIno = n
	case keyCreated:
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return err
		}
		r.Created = t
	}
	return nil
}

// CheckMeta refuses Meta that would not read back as written: strings
// longer than maxMetaValue.
func CheckMeta(m Meta) error {
	for k, v := range map[string]string{keyNetns: m.Netns, keyPodNamespace: m.PodNamespace, keyPodName: m.PodName, keyPodUID: m.PodUID, keyBootID: m.BootID} {
		if len(v) > maxMetaValue {
			return fmt.Errorf("%s is %d bytes long, more than %d", k, len(v), maxMetaValue)
		}
	}
	return nil
}

// SetMeta sets what the next SetIPsOf that records addresses writes with
// them (ADD calls it before allocating). Without it, SetIPsOf keeps the
// Meta the entry has (GC rewriting an index entry).
func (d *Disk) SetMeta(m Meta) { d.meta = &m }

// Record returns owner's index entry; ok is false when it has none.
func (d *Disk) Record(o allocator.Owner) (Record, bool, error) {
	if err := ValidateOwner(o); err != nil {
		return Record{}, false, err
	}
	data, err := readFile(d.ownFd, ownerName(o), d.ownerPath(o))
	if errors.Is(err, fs.ErrNotExist) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("read owner index of %s: %w", o.ContainerID, err)
	}
	r, err := ParseRecord(data)
	if err != nil {
		return Record{}, false, &parseError{fmt.Errorf("%s: %w", d.ownerPath(o), err)}
	}
	return r, true, nil
}

// parseError is an owner index entry that was read but does not parse.
type parseError struct{ err error }

func (e *parseError) Error() string { return e.err.Error() }
func (e *parseError) Unwrap() error { return e.err }

// Reservation is one ips/ entry as a snapshot saw it.
type Reservation struct {
	Owner allocator.Owner // zero when the file does not parse
	// Changed is the entry's ctime: when the reservation was made (a
	// link never rewrites it).
	Changed time.Time
}

// Snapshot is a store's content read without its lock: a consistent view
// of each file (reservations appear by link, index entries by rename),
// not of the whole. Whoever acts on it re-reads under the lock.
type Snapshot struct {
	Records      map[allocator.Owner]Record
	Reservations map[netip.Addr]Reservation
	// Corrupt lists owner index entries that do not parse.
	Corrupt []allocator.Owner
	// Unreadable lists owner index entries that could not be read (one
	// podnet-ipam never makes: a symlink, a huge file, ...); Skipped says
	// why, for them and for the reservations that could not be read. Such
	// entries are left alone: one cannot keep the rest of the store from
	// being read.
	Unreadable []allocator.Owner
	Skipped    []error
}

// ReadSnapshot reads the store of network under dataDir without taking its
// lock and without creating anything. A network directory that does not
// exist is fs.ErrNotExist.
func ReadSnapshot(dataDir, network string) (*Snapshot, error) {
	if !networkName.MatchString(network) {
		return nil, fmt.Errorf("invalid network name %q", network)
	}
	d := &Disk{dir: filepath.Join(dataDir, network), dirFd: -1, ipsFd: -1, ownFd: -1, hintFd: -1, lockFd: -1}
	defer d.Close()
	var err error
	if d.dirFd, err = unix.Open(d.dir, dirFlags, 0); err != nil {
		return nil, entryErrorPath(d.dir, err)
	}
	for _, sub := range []struct {
		name string
		fd   *int
	}{{"ips", &d.ipsFd}, {"owners", &d.ownFd}} {
		if *sub.fd, err = unix.Openat(d.dirFd, sub.name, dirFlags, 0); err != nil {
			if errors.Is(err, unix.ENOENT) {
				*sub.fd = -1
				continue // never used yet
			}
			return nil, entryError(d.dirFd, sub.name, filepath.Join(d.dir, sub.name), true, err)
		}
	}
	s := &Snapshot{Records: map[allocator.Owner]Record{}, Reservations: map[netip.Addr]Reservation{}}
	if d.ownFd >= 0 {
		names, err := readDirNames(d.ownFd, filepath.Join(d.dir, "owners"))
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			cid, ifName, ok := strings.Cut(n, ":")
			o := allocator.Owner{ContainerID: cid, IfName: ifName}
			if !ok || ValidateOwner(o) != nil {
				continue
			}
			r, found, err := d.Record(o)
			var pe *parseError
			switch {
			case errors.As(err, &pe):
				s.Corrupt = append(s.Corrupt, o)
			case err != nil:
				s.Unreadable = append(s.Unreadable, o)
				s.Skipped = append(s.Skipped, err)
			case found:
				s.Records[o] = r
			}
		}
	}
	if d.ipsFd >= 0 {
		names, err := readDirNames(d.ipsFd, filepath.Join(d.dir, "ips"))
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			ip, err := netip.ParseAddr(n)
			if err != nil {
				continue
			}
			res, ok, err := d.reservation(ip)
			if err != nil {
				s.Skipped = append(s.Skipped, err)
				continue
			}
			if ok {
				s.Reservations[ip] = res
			}
		}
	}
	return s, nil
}

// Reservation returns ip's reservation (under the lock, to re-check what a
// Snapshot saw).
func (d *Disk) Reservation(ip netip.Addr) (Reservation, bool, error) { return d.reservation(ip) }

func (d *Disk) reservation(ip netip.Addr) (Reservation, bool, error) {
	fd, err := openFile(d.ipsFd, ip.String(), d.ipPath(ip), unix.O_RDONLY)
	if errors.Is(err, fs.ErrNotExist) {
		return Reservation{}, false, nil
	}
	if err != nil {
		return Reservation{}, false, err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return Reservation{}, false, fmt.Errorf("stat %s: %w", d.ipPath(ip), err)
	}
	data, err := readAll(fd, d.ipPath(ip), maxEntrySize)
	if err != nil {
		return Reservation{}, false, err
	}
	o, _ := ParseOwner(data) // zero Owner when it does not parse
	return Reservation{Owner: o, Changed: time.Unix(st.Ctim.Unix())}, true, nil
}

// Networks lists the network names that have a store under dataDir.
func Networks(dataDir string) ([]string, error) {
	fd, err := unix.Open(dataDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open IPAM data directory %s: %w", dataDir, err)
	}
	defer unix.Close(fd)
	names, err := readDirNames(fd, dataDir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range names {
		var st unix.Stat_t
		if !networkName.MatchString(n) || unix.Fstatat(fd, n, &st, unix.AT_SYMLINK_NOFOLLOW) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		// A store has its lock file: ADD, DEL, CHECK, GC and STATUS
		// create it first.
		if unix.Fstatat(fd, n+"/lock", &st, unix.AT_SYMLINK_NOFOLLOW) == nil {
			out = append(out, n)
		}
	}
	return out, nil
}

func entryErrorPath(path string, err error) error {
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
		return fmt.Errorf("%w: %s is not a directory podnet-ipam made (a symbolic link or another kind of file)", ErrUnsafeEntry, path)
	}
	return fmt.Errorf("open %s: %w", path, err)
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
