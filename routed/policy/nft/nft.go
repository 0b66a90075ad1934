// Package nft puts a policy.Ruleset into the kernel: table inet
// podnet-policy in the calling thread's network namespace (names.go has
// its layout), and table bridge podnet-policy (bridge.go). It builds on
// internal/nftutil's nftables layer: what is its own is which rules and
// which elements (build.go). Every change is one nftables transaction:
// the first write (and a repair) deletes and creates the whole table,
// later ones write the difference from the last Ruleset written (diff.go:
// set and map elements added and deleted, chains created, flushed and
// rewritten, or deleted only when their rules change). The Writer keeps
// what it built per object (store.go), so that a change (ApplyDelta, or
// Apply of a whole Ruleset, compared entry by entry with the stored one)
// builds, compares and reads back only what it touches. The Ruleset's
// ranges are canonical by contract (policy.Rule) and written as they
// are. Resync reads the table back by content (structure and elements,
// nftutil.Differs) so that it repairs a table someone deleted or edited.
// Revoke (conntrack.go) deletes the connections a change no longer
// allows.
package nft

import (
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"

	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/internal/threadprio"
	"github.com/podnet/podnet/routed/policy"
)

// nftTimeout bounds one nftables transaction or read (see
// routed/dataplane's nftTimeout: a lost acknowledgement must fail the
// write, not hang the daemon).
const nftTimeout = 10 * time.Second

// nftSendBuffer is the send buffer of the socket: a transaction is one
// sendmsg, and a ruleset with 10,000 peer ranges takes about 1 MiB.
const nftSendBuffer = 32 << 20

// nftReceiveBuffer is the receive buffer of the socket: the kernel
// acknowledges every message of a transaction (a chain, a rule, a chunk
// of elements), and 1,000 pods and policies make thousands.
const nftReceiveBuffer = 32 << 20

// setElementsPerMessage bounds the elements of one message (their list is
// one netlink attribute, whose length is 16 bits).
const setElementsPerMessage = 500

// Writer keeps table inet podnet-policy equal to the Rulesets it is
// given. The zero Writer is ready; it is safe for concurrent use. It
// works in the network namespace of the thread calling it.
type Writer struct {
	Log *slog.Logger
	// LogDrops makes each pod chain log what it drops to the kernel log,
	// rate-limited per pod and direction (LogRate packets a second, burst
	// 5), prefixed "podnet-policy drop <namespace>/<pod> <direction>: ".
	// Set it before the first write.
	LogDrops bool
	LogRate  uint64
	// TierSegment: rules per tier chain segment (0: 8); tests cut small.
	TierSegment int
	// Nice is the nice value the read-back after an incremental write
	// runs at (0: the process's), on a thread of its own: the next
	// write waits for it.
	Nice int

	mu sync.Mutex
	// st is what the Writer built for the table, per object: the last
	// Ruleset it was given (nil: none yet), whether or not the kernel
	// took it.
	st *store
	// ok: the kernel holds st's table, as last written; false: not known
	// (nothing written, a write failed), so the next write is whole.
	ok bool
	// last is st's whole table, assembled when needed (a whole write, a
	// resync, Verify: store.assemble), nil when st changed since: a
	// change costs what it touches, not the table.
	last *tableDef
	// written is the table's structure read back after the last write
	// (nil: not known).
	written *structure
	// unread is what the last incremental write changed, not read back
	// into written yet (nil: nothing): the read-back (a dozen requests)
	// waits for a goroutine started after the write, or the Writer's
	// next use, so that the write's caller (a pod's ADD waiting for its
	// policy) does not wait for it. ours counts the Writer's commits
	// since gen was read.
	unread *nftutil.Patch
	ours   uint32
	// settling: a goroutine waits to settle (one is enough)
	settling bool
	// gen is the nftables generation at which the kernel's table was
	// last known to be last/written (right after a write of the Writer's
	// alone, or a resync that found it so); 0: not known. A resync that
	// finds the same generation has nothing to read.
	gen uint32
	// seq counts writes: a resync that read the table without w.mu
	// discards what it found when a write came meanwhile.
	seq  uint64
	conn nftutil.Conn

	// bridgeLast is what the bridge table holds (nil: not known) and
	// bridgeWritten its structure read back after it was last written
	// whole (bridge.go).
	bridgeLast    *bridgeDef
	bridgeWritten []string

	// rmu serializes resyncs, which read the table on their own socket
	// (rconn) without w.mu: writes go on meanwhile.
	rmu   sync.Mutex
	rconn nftutil.Conn
}

func (w *Writer) buildOptions() buildOptions {
	o := buildOptions{logDrops: w.LogDrops, logRate: w.LogRate, segment: w.TierSegment}
	if o.logRate == 0 {
		o.logRate = 10
	}
	return o
}

func (w *Writer) log() *slog.Logger {
	if w.Log == nil {
		return slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return w.Log
}

func table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
}

// nft returns the Writer's socket, dialed when needed, with a deadline of
// nftTimeout. Callers hold w.mu.
func (w *Writer) nft() (*nftables.Conn, error) {
	w.conn.SendBuffer, w.conn.ReceiveBuffer, w.conn.Timeout = nftSendBuffer, nftReceiveBuffer, nftTimeout
	return w.conn.Open()
}

// rnft is nft for the resync socket. Callers hold w.rmu.
func (w *Writer) rnft() (*nftables.Conn, error) {
	w.rconn.ReceiveBuffer, w.rconn.Timeout = nftReceiveBuffer, nftTimeout
	return w.rconn.Open()
}

// Close closes the Writer's socket (a later use dials again). The table
// stays.
func (w *Writer) Close() {
	w.rmu.Lock()
	w.rconn.Close()
	w.rmu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closeConn()
}

func (w *Writer) closeConn() { w.conn.Close() }

// fail forgets what the kernel holds after a failed write: the next
// write is whole. The store stays: it is what the Writer was last given.
func (w *Writer) fail() {
	w.ok, w.written, w.gen, w.unread, w.ours = false, nil, 0, nil, 0
	w.bridgeLast, w.bridgeWritten = nil, nil
	w.closeConn()
}

// store is w.st, made at its first use, and made again with the
// Writer's options when they changed (LogDrops, LogRate): every pod chain
// changes then, and the table is written whole. Callers hold w.mu.
func (w *Writer) store() *store {
	opt := w.buildOptions()
	if w.st == nil {
		w.st = newStore(opt)
	}
	if w.st.opt != opt {
		rs := w.st.ruleset()
		w.st = newStore(opt)
		d, err := w.st.deltaTo(rs)
		if err == nil {
			_, err = w.st.apply(d)
		}
		if err != nil { // it was written with the other options: cannot be
			w.log().Error("nft table: the stored ruleset does not build with the new options", "err", err)
			w.st = newStore(opt)
		}
		w.ok, w.last = false, nil
	}
	return w.st
}

// def is the store's whole table, assembled once per change of the
// store. Callers hold w.mu.
func (w *Writer) def() *tableDef {
	if w.last == nil {
		w.last = w.store().assemble()
	}
	return w.last
}

// Apply makes the table want's in one transaction: the whole table the
// first time (or after a failure), else what differs from the last
// Ruleset the Writer was given: want is compared with it entry by entry
// (a pod or policy chain equal to the stored one is not built again) and
// the difference goes the way of ApplyDelta. When that write fails (the
// kernel's table is not what was written: a set or chain deleted behind
// the Writer's back), it writes the whole table in a second transaction.
func (w *Writer) Apply(want policy.Ruleset) (Stats, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.settle()
	st := w.store()
	d, err := st.deltaTo(want)
	if err != nil {
		return Stats{}, fmt.Errorf("policy ruleset: %w", err)
	}
	ch, err := st.apply(d)
	if err != nil {
		return Stats{}, fmt.Errorf("policy ruleset: %w", err)
	}
	return w.write(ch)
}

// ApplyDelta changes the table by d (the Ruleset last given to Apply or
// ApplyDelta, changed as policy.Ruleset.With changes it) in one
// transaction that writes only what d touches: the chains, sets, counters
// and elements of the pods and policy chains d names, the tier chains
// those refer to, and the elements of the table's own sets and maps that
// differ (Known's and Ports' by comparison with the last ones, which
// costs O(Known) only when they changed). The bridge table, when its
// content changes, goes in a transaction of its own before.
//
// What build refuses, ApplyDelta refuses, writing nothing and keeping
// the Ruleset as it was: a pod referring to a policy chain the Ruleset
// would not hold (d's, or one that stays) or of another tier, an ID twice
// in d, a name nft cannot take. A write that fails in the kernel is
// written whole in a second transaction, like Apply's. After an error
// from the kernel, the Writer holds d (the next write is whole): a caller
// that is not sure which Ruleset the Writer holds gives Apply the whole
// one, which writes what differs.
func (w *Writer) ApplyDelta(d policy.Delta) (Stats, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.settle()
	ch, err := w.store().apply(d)
	if err != nil {
		return Stats{}, fmt.Errorf("policy delta: %w", err)
	}
	return w.write(ch)
}

// write puts a change of the store in the kernel: the bridge table when
// its content changed, then the inet table's change (diff.go), or the
// whole table when the kernel's is not known or the change fails there.
// Callers hold w.mu.
func (w *Writer) write(ch *change) (Stats, error) {
	if ch.changed {
		w.last = nil
	}
	// the bridge table first, in a transaction of its own before the
	// inet table's: the inet write's read-back still sees its own
	// transaction alone
	if ch.bridge || w.bridgeLast == nil {
		if err := w.applyBridge(w.st.bridgeDef()); err != nil {
			w.fail() // the inet table's change is not written either
			return Stats{}, err
		}
	}
	if !w.ok {
		return Stats{Full: true}, w.writeFull(w.def())
	}
	st, err := w.writeChange(ch)
	if err != nil {
		// the kernel's table is not what the Writer thinks (a set or
		// chain deleted behind its back): the whole table, now
		w.log().Info("nft table: incremental write failed, writing it whole", "table", "inet "+TableName, "err", err)
		w.fail()
		return Stats{Full: true}, w.writeFull(w.def())
	}
	if w.unread != nil && !w.settling {
		w.settling = true
		go w.settleLocked()
	}
	return st, nil
}

// settleLocked is settle for a goroutine of its own.
func (w *Writer) settleLocked() {
	threadprio.Do(w.Nice, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.settling = false
		w.settle()
	})
}

// settle reads back what the last incremental write changed (w.unread)
// into w.written. It reads on the socket the write used, never on a new
// one: it may run on any thread, and a socket dialed there would be of
// that thread's network namespace. When that socket is gone or the
// reading fails, the kernel's table is not known any more (the next write
// is whole). Callers hold w.mu.
func (w *Writer) settle() {
	if w.unread == nil {
		return
	}
	p := *w.unread
	w.unread = nil
	nl := w.conn.Netlink()
	if nl == nil {
		w.fail()
		return
	}
	if err := w.readPatch(nl, p); err != nil {
		w.log().Info("nft table: read-back failed: the next write is whole", "table", "inet "+TableName, "err", err)
		w.fail()
	}
}

// readPatch reads back the objects an incremental write changed (p) on
// top of what was read before.
func (w *Writer) readPatch(nl *netlink.Conn, p nftutil.Patch) error {
	g1, err := nftutil.Generation(nl)
	if err != nil {
		return fmt.Errorf("read back nftables table %s: %w", TableName, err)
	}
	// known: the kernel's table was w.written at w.gen, and the only
	// commits since are the Writer's own
	known := w.gen != 0 && g1 == w.gen+w.ours
	// only the objects p names are read (old nil: StructurePatch walks
	// no line of the rest)
	fresh, err := nftutil.StructurePatch(nl, byte(nftables.TableFamilyINet), TableName, nil, p)
	if err != nil {
		return fmt.Errorf("read back nftables table %s: %w", TableName, err)
	}
	w.written.patch(p, fresh)
	w.gen, w.ours = 0, 0
	// the kernel's table is known to be what was written and read when
	// nothing else committed since it last was, nor during the reading
	if g2, err := nftutil.Generation(nl); err == nil && known && g2 == g1 {
		w.gen = g1
	}
	return nil
}

// ApplyFull writes the whole table for want in one transaction (delete
// and create), whatever the kernel holds.
func (w *Writer) ApplyFull(want policy.Ruleset) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.unread = nil // written whole, read whole
	if err := w.take(want); err != nil {
		return err
	}
	w.bridgeLast = nil
	if err := w.applyBridge(w.st.bridgeDef()); err != nil {
		w.fail()
		return err
	}
	return w.writeFull(w.def())
}

// take makes want the store's Ruleset, writing nothing. Callers hold
// w.mu.
func (w *Writer) take(want policy.Ruleset) error {
	st := w.store()
	d, err := st.deltaTo(want)
	if err != nil {
		return fmt.Errorf("policy ruleset: %w", err)
	}
	ch, err := st.apply(d)
	if err != nil {
		return fmt.Errorf("policy ruleset: %w", err)
	}
	if ch.changed {
		w.last = nil
	}
	return nil
}

// Resync verifies the kernel's table against the last Ruleset written
// and, when it differs, writes it whole: repaired says that the table was
// found changed behind the Writer's back (a deleted or edited table,
// chain, rule, set or element). want counts only when nothing is known to
// be in the kernel (nothing written yet, or the last write failed): it is
// written then. A caller's want may be older than the last Apply (a
// resync running beside the write loop), so it never replaces what a
// later Apply wrote.
//
// When no nftables transaction at all was committed since the Writer last
// knew the table (the netns's generation), there is nothing to read.
// Otherwise the table is read on a socket of its own without holding up
// Apply: a write that comes meanwhile makes this resync's reading moot
// (it returns false; the next one reads again).
func (w *Writer) Resync(want policy.Ruleset) (repaired bool, err error) {
	w.mu.Lock()
	w.settle()
	w.store() // (with other options, the table is not known any more)
	if !w.ok || w.bridgeLast == nil {
		defer w.mu.Unlock()
		if err := w.take(want); err != nil {
			return false, err
		}
		if err := w.applyBridge(w.st.bridgeDef()); err != nil {
			w.fail()
			return false, err
		}
		return false, w.writeFull(w.def())
	}
	if _, err := w.nft(); err == nil {
		// (the commits since gen, if any, are the Writer's own: settled,
		// their structure is read)
		if g, err := nftutil.Generation(w.conn.Netlink()); err == nil && w.gen != 0 && g == w.gen+w.ours {
			w.mu.Unlock()
			return false, nil
		}
	}
	seq, def, written := w.seq, w.def(), w.written.all()
	bdef, bwritten := w.bridgeLast, w.bridgeWritten
	w.mu.Unlock()

	w.rmu.Lock()
	diff, gen, err := w.check(def, written, bdef, bwritten)
	w.rmu.Unlock()

	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seq != seq || w.last != def || w.bridgeLast != bdef {
		return false, nil
	}
	if err != nil {
		diff = err.Error()
	}
	if diff == "" {
		w.gen, w.ours = gen, 0 // (no write came meanwhile: seq)
		return false, nil
	}
	return w.repair(def, diff)
}

// repair writes def whole because the kernel's table differs (why).
// Callers hold w.mu.
func (w *Writer) repair(def *tableDef, why string) (bool, error) {
	b := w.bridgeLast
	w.bridgeLast = nil
	if err := w.applyBridge(b); err != nil {
		return false, err
	}
	if err := w.writeFull(def); err != nil {
		return false, err
	}
	w.log().Info("nft table repaired", "table", "inet "+TableName, "why", why)
	return true, nil
}

// check compares the kernel's table with def and written (its structure
// read back after the write of def) on the resync socket; gen is the
// generation it read at when nothing was committed during the reading
// (else 0). Callers hold w.rmu.
func (w *Writer) check(def *tableDef, written []string, bdef *bridgeDef, bwritten []string) (diff string, gen uint32, err error) {
	c, err := w.rnft()
	if err != nil {
		return "", 0, err
	}
	g0, err := nftutil.Generation(w.rconn.Netlink())
	if err != nil {
		w.rconn.Close()
		return "", 0, err
	}
	diff, err = differs(c, w.rconn.Netlink(), def, written)
	if err == nil && diff == "" {
		diff, err = bridgeDiffers(c, w.rconn.Netlink(), bdef, bwritten)
	}
	if err != nil {
		w.rconn.Close()
		return "", 0, err
	}
	if g1, err := nftutil.Generation(w.rconn.Netlink()); err != nil || g1 != g0 {
		g0 = 0
	}
	return diff, g0, nil
}

// Verify says how the kernel's table differs from want ("" when it does
// not): the Ruleset last written differs from want, the table's
// structure (tables, chains, rules, sets, counters) differs from what was
// read back after the last write, or a set's or map's elements are not
// want's. Nothing written yet is a difference.
func (w *Writer) Verify(want policy.Ruleset) (string, error) {
	def, err := build(want, w.buildOptions())
	if err != nil {
		return "", fmt.Errorf("policy ruleset: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.settle()
	if !w.ok {
		return "nothing written yet", nil
	}
	if d := defDiff(w.def(), def); d != "" {
		return "not the ruleset last written: " + d, nil
	}
	c, err := w.nft()
	if err != nil {
		return "", err
	}
	diff, err := differs(c, w.conn.Netlink(), def, w.written.all())
	if err != nil {
		w.closeConn()
	}
	return diff, err
}

// differs compares the kernel's table (read on c and its netlink socket
// nl) with def and written, its structure read back after def was
// written: "" when they are the same.
func differs(c *nftables.Conn, nl *netlink.Conn, def *tableDef, written []string) (string, error) {
	return nftutil.Differs(c, nl, def.spec(), written)
}

// writeFull replaces the table with def's in one transaction, keeping
// the values of the counters that stay, and reads its structure back.
func (w *Writer) writeFull(def *tableDef) error {
	err := w.writeFullOnce(def)
	if err != nil {
		w.fail()
	}
	return err
}

func (w *Writer) writeFullOnce(def *tableDef) error {
	c, err := w.nft()
	if err != nil {
		return err
	}
	kept, err := readCounters(c)
	if err != nil {
		return err
	}
	if err := def.spec().QueueWhole(c, kept, setElementsPerMessage); err != nil {
		return err
	}
	g0, err := nftutil.Generation(w.conn.Netlink())
	if err != nil {
		return err
	}
	w.seq++
	if err := c.Flush(); err != nil {
		return fmt.Errorf("write nftables table %s: %w", TableName, err)
	}
	w.written, w.unread = nil, nil
	return w.readBack(g0)
}

// readBack reads the whole table's structure after a whole write made at
// generation g0 (read just before it); the kernel holds the store's table
// then.
func (w *Writer) readBack(g0 uint32) error {
	nl := w.conn.Netlink()
	g1, err := nftutil.Generation(nl)
	if err != nil {
		return fmt.Errorf("read back nftables table %s: %w", TableName, err)
	}
	lines, err := nftutil.ReadBack(nl, nftables.TableFamilyINet, TableName, nil, nil)
	if err != nil {
		return err
	}
	w.written, w.ok, w.gen, w.ours = newStructure(lines), true, 0, 0
	// the kernel's table is known to be what was written and read when
	// the write was the only transaction and nothing committed during
	// the reading
	if g2, err := nftutil.Generation(nl); err == nil && g1 == g0+1 && g2 == g1 {
		w.gen = g1
	}
	return nil
}

// Delete removes the table (the engine turned off); a missing table is
// fine. The next write is whole.
func (w *Writer) Delete() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ok, w.written, w.unread = false, nil, nil
	w.bridgeLast, w.bridgeWritten = nil, nil
	c, err := w.nft()
	if err != nil {
		return err
	}
	for _, t := range []*nftables.Table{table(), bridgeTable()} {
		if err := nftutil.DeleteTable(c, t); err != nil {
			w.closeConn()
			return err
		}
	}
	return nil
}
