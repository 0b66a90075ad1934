package nft

import (
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/routed/policy"
)

// Check says how the table inet podnet-policy of the calling thread's
// network namespace differs from the one a Writer (with logDrops and
// logRate as its LogDrops and LogRate) would write for want: "" when it is
// the same, structure and elements. The table here is only read: to learn
// how the kernel renders want's table, Check writes it in a scratch
// network namespace of its own, which goes when Check returns.
func Check(want policy.Ruleset, logDrops bool, logRate uint64) (string, error) {
	w := &Writer{LogDrops: logDrops, LogRate: logRate}
	def, err := build(want, w.buildOptions())
	if err != nil {
		return "", fmt.Errorf("policy ruleset: %w", err)
	}
	var c nftutil.Conn
	c.ReceiveBuffer, c.Timeout = nftReceiveBuffer, nftTimeout
	conn, err := c.Open()
	if err != nil {
		return "", err
	}
	defer c.Close()
	have, err := nftutil.Structure(c.Netlink(), unix.NFPROTO_INET, TableName)
	if err != nil {
		return "", fmt.Errorf("read nftables table %s: %w", TableName, err)
	}
	if have == nil {
		return "table missing", nil
	}
	var written []string
	if err := inScratchNetns(func() error {
		defer w.Close()
		if err := w.ApplyFull(want); err != nil {
			return err
		}
		written = w.written.all()
		return nil
	}); err != nil {
		return "", fmt.Errorf("render the table for comparison: %w", err)
	}
	return differs(conn, c.Netlink(), def, written)
}

// inScratchNetns runs f on this goroutine's thread moved into a new,
// empty network namespace, and moves it back.
func inScratchNetns(f func() error) error {
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return fmt.Errorf("this network namespace: %w", err)
	}
	defer orig.Close()
	scratch, err := netns.New() // the thread is in it from here
	if err != nil {
		if serr := netns.Set(orig); serr == nil {
			runtime.UnlockOSThread()
		}
		return fmt.Errorf("scratch network namespace: %w", err)
	}
	defer scratch.Close()
	ferr := f()
	if err := netns.Set(orig); err != nil {
		// the thread stays locked: Go ends it with this goroutine rather
		// than reuse it in the wrong namespace
		return fmt.Errorf("back to the network namespace: %w", err)
	}
	runtime.UnlockOSThread()
	return ferr
}
