package allocator

import "math/bits"

// MaxBitmapSize is the largest range tracked by a bitmap (128 KiB); larger
// ranges (IPv6) use a SparseHint and are never close to full.
const MaxBitmapSize = uint64(1) << 20

// Bitmap is a Hint backed by one bit per offset. Persist, when set, is told
// about every change so a store can write it through.
type Bitmap struct {
	Words   []uint64
	Size    uint64
	Pos     uint64
	Persist BitmapPersister
}

// BitmapPersister writes a Bitmap's changes to stable storage.
type BitmapPersister interface {
	WriteWord(index int, word uint64) error
	WriteCursor(cursor uint64) error
	WriteAll(b *Bitmap) error
}

// NewBitmap returns an all-free bitmap of size offsets.
func NewBitmap(size uint64) *Bitmap {
	return &Bitmap{Words: make([]uint64, (size+63)/64), Size: size}
}

// NextFree implements Hint.
func (b *Bitmap) NextFree(from uint64) (uint64, bool) {
	if b.Size == 0 {
		return 0, false
	}
	from %= b.Size
	if off, ok := b.scan(from, b.Size); ok {
		return off, true
	}
	return b.scan(0, from)
}

// scan finds the first clear bit in [from, to).
func (b *Bitmap) scan(from, to uint64) (uint64, bool) {
	for off := from; off < to; {
		w := off / 64
		free := ^b.Words[w] >> (off % 64)
		if free != 0 {
			found := off + uint64(bits.TrailingZeros64(free))
			if found < to {
				return found, true
			}
			return 0, false
		}
		off = (w + 1) * 64
	}
	return 0, false
}

// Mark implements Hint.
func (b *Bitmap) Mark(off uint64, taken bool) error {
	if off >= b.Size {
		return nil
	}
	w := off / 64
	old := b.Words[w]
	if taken {
		b.Words[w] |= 1 << (off % 64)
	} else {
		b.Words[w] &^= 1 << (off % 64)
	}
	if b.Persist != nil && b.Words[w] != old {
		return b.Persist.WriteWord(int(w), b.Words[w])
	}
	return nil
}

// Reset implements Hint.
func (b *Bitmap) Reset(taken []uint64) error {
	clear(b.Words)
	for _, off := range taken {
		if off < b.Size {
			b.Words[off/64] |= 1 << (off % 64)
		}
	}
	if b.Persist != nil {
		return b.Persist.WriteAll(b)
	}
	return nil
}

// Cursor implements Hint.
func (b *Bitmap) Cursor() uint64 { return b.Pos }

// SetCursor implements Hint.
func (b *Bitmap) SetCursor(c uint64) error {
	b.Pos = c
	if b.Persist != nil {
		return b.Persist.WriteCursor(c)
	}
	return nil
}

// SparseHint is the Hint of ranges too large for a bitmap: it believes every
// address free and only keeps the cursor; Store.Reserve tells the truth.
type SparseHint struct {
	Pos     uint64
	Persist func(cursor uint64) error
}

// NextFree implements Hint.
func (s *SparseHint) NextFree(from uint64) (uint64, bool) { return from, true }

// Mark implements Hint.
func (s *SparseHint) Mark(uint64, bool) error { return nil }

// Reset implements Hint.
func (s *SparseHint) Reset([]uint64) error { return nil }

// Cursor implements Hint.
func (s *SparseHint) Cursor() uint64 { return s.Pos }

// SetCursor implements Hint.
func (s *SparseHint) SetCursor(c uint64) error {
	s.Pos = c
	if s.Persist != nil {
		return s.Persist(c)
	}
	return nil
}
