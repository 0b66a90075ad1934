// The write loop and, beside it, the resync: the read-back of the
// tables (at once when the daemon's nftables monitor saw a change), the
// cross-check of the incremental compile, the counters.

package engine

import (
	"context"
	"sync"
	"time"

	"github.com/podnet/podnet/internal/threadprio"
)

// readBackEvery: with Config.Watched, one resync in this many reads the
// tables back (a lost notification the monitor could not see).
const readBackEvery = 10

// loop writes each change as it comes. Every resync, beside it, the
// table is read back (and written whole when someone changed it; with
// Config.Watched every readBackEvery-th resync, and at once after each
// CheckNow), the drop counters are read and stale overrides pruned: a
// change never waits for that reading.
func (e *Engine) loop(ctx context.Context) error {
	if err := threadprio.Check(e.cfg.LoopNice); err != nil {
		e.log.Warn("the write loop keeps the process's CPU priority", "err", err)
	}
	t := time.NewTicker(e.cfg.Resync)
	defer t.Stop()
	var periodic sync.WaitGroup
	defer periodic.Wait()
	periodic.Go(func() { e.revoker(ctx) })
	busy, again, ticks := false, false, 0
	periodicDone := make(chan struct{}, 1)
	check := func() {
		busy = true
		periodic.Go(func() {
			e.resync(true)
			periodicDone <- struct{}{}
		})
	}
	for {
		// each write (and the answers to the waits it holds) at
		// LoopNice, on a thread locked for that write only: a goroutine
		// locked to its thread for good pays a thread handoff each time
		// it waits for the next change
		var err error
		threadprio.Do(e.cfg.LoopNice, func() { err = e.sync() })
		if err != nil {
			e.m.Errors.Inc()
			e.log.Error("NetworkPolicy write failed; retrying", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
			}
			continue
		}
		select {
		case <-ctx.Done():
			return nil
		case <-e.kick:
		case <-periodicDone:
			busy = false
			if again { // a change came while it read: read again
				again = false
				check()
			}
		case <-e.checkKick:
			if busy {
				again = true
				continue
			}
			check()
		case <-t.C:
			if busy {
				continue // the last one is still reading: skip this tick
			}
			busy, ticks = true, ticks+1
			readBack := !e.cfg.Watched || ticks%readBackEvery == 0
			periodic.Go(func() {
				e.bridgeNetfilter()
				e.refreshLocal()
				e.resync(readBack)
				e.readCounters()
				e.pruneOverrides()
				periodicDone <- struct{}{}
			})
		}
	}
}

// CheckNow asks for the table's read-back (and repair) at once, beside
// the write loop: the daemon calls it when the kernel notifies a change
// of the engine's tables. It never blocks.
func (e *Engine) CheckNow() {
	select {
	case e.checkKick <- struct{}{}:
	default:
	}
}

// resync repairs the table from the last Ruleset written (readBack), and
// asks the write loop for the cross-check of the incremental compile.
func (e *Engine) resync(readBack bool) {
	e.mu.Lock()
	last, ok := e.writtenLocked()
	if ok {
		e.check = true
		e.kickLocked()
	}
	e.mu.Unlock()
	if !ok || !readBack {
		return
	}
	repaired, err := e.w.Resync(last)
	if err != nil {
		e.m.Errors.Inc()
		e.log.Warn("NetworkPolicy table resync failed", "err", err)
		return
	}
	if repaired {
		e.m.Repairs.Inc()
		e.log.Warn("NetworkPolicy table was changed behind podnet-routed's back: written whole again")
	}
}
