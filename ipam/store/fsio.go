// File access of the store: every entry opened relative to its directory's
// descriptor, never through a symlink, and read with a size bound; temp
// files written whole or not at all.

package store

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Flags of every open of a store file: never through a symlink, never
// becoming the controlling terminal, never blocking on a FIFO planted in
// the store (the file type is checked right after).
const (
	openFlags = unix.O_NOFOLLOW | unix.O_CLOEXEC | unix.O_NOCTTY | unix.O_NONBLOCK
	dirFlags  = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
)

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
