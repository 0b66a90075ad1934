//go:build bench

package policybench

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// rxCounter reads the bytes a pod's eth0 received.
type rxCounter struct{ h *netlink.Handle }

func newRxCounter(n ns.NetNS) (*rxCounter, error) {
	h, err := netlink.NewHandleAt(netns.NsHandle(int(n.Fd())))
	if err != nil {
		return nil, fmt.Errorf("netlink in %s: %w", n.Path(), err)
	}
	return &rxCounter{h: h}, nil
}

func (c *rxCounter) bytes() (uint64, error) {
	l, err := c.h.LinkByName("eth0")
	if err != nil {
		return 0, fmt.Errorf("eth0: %w", err)
	}
	if l.Attrs().Statistics == nil {
		return 0, fmt.Errorf("eth0: no statistics")
	}
	return l.Attrs().Statistics.RxBytes, nil
}

// streamArms is one iperf3 stream cli -> srv during which the arm is
// switched every seg, segs times, in the order without, with, with,
// without (ABBA), after the stream's first 300 ms (its slow start,
// counted in neither): the throughput of a TCP stream already running,
// the per-packet cost of each table on the same flow at the same
// moments, measured by srv's eth0 received bytes over each segment.
// It returns each arm's bytes and seconds.
func (b *bench) streamArms(sw []*tableSwitch, rx *rxCounter, segs int, seg time.Duration) (open, pol [2]float64) {
	t := b.t
	dur := int((300*time.Millisecond+time.Duration(segs)*seg)/time.Second) + 2
	for try := 0; ; try++ {
		done := make(chan []byte, 1)
		go func() {
			var out []byte
			_ = b.cli.NS.NetNS.Do(func(ns.NetNS) error {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(dur+20)*time.Second)
				defer cancel()
				out, _ = exec.CommandContext(ctx, "iperf3", "-c", b.srv.IP.String(), "-A", "1", "-p", strconv.Itoa(iperfPort), "-t", strconv.Itoa(dur), "-J").CombinedOutput()
				return nil
			})
			done <- out
		}()
		b.activate(sw, true)
		started := b.streamStarted(rx, done)
		if started {
			time.Sleep(300 * time.Millisecond)
			last, err := rx.bytes()
			b.must(err)
			lastT := time.Now()
			for i := range segs {
				isOpen := i%4 == 0 || i%4 == 3
				b.activate(sw, isOpen)
				time.Sleep(seg - time.Since(lastT))
				n, err := rx.bytes()
				b.must(err)
				now := time.Now()
				acc := &pol
				if isOpen {
					acc = &open
				}
				acc[0] += float64(n - last)
				acc[1] += now.Sub(lastT).Seconds()
				last, lastT = n, now
			}
		}
		out := <-done
		if started {
			return open, pol
		}
		if try == 10 {
			t.Fatalf("iperf3 -c %s: the stream never started\n%s", b.srv.IP, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// streamStarted waits until srv receives 1 MB within 100 ms (true) or
// the iperf3 client ended (false).
func (b *bench) streamStarted(rx *rxCounter, done chan []byte) bool {
	prev, err := rx.bytes()
	b.must(err)
	for range 50 {
		select {
		case out := <-done:
			done <- out
			return false
		case <-time.After(100 * time.Millisecond):
		}
		n, err := rx.bytes()
		b.must(err)
		if n-prev > 1<<20 {
			return true
		}
		prev = n
	}
	return false
}
