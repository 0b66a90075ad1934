// Allocation hints of the store: a free-space bitmap and cursor per range,
// kept in hints/ and trusted only as hints (see hintFile).

package store

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/ipam/allocator"
)

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
