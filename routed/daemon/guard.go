package daemon

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/nftutil"
	"github.com/podnet/podnet/internal/podfilter"
	"github.com/podnet/podnet/internal/policysock"
	"github.com/podnet/podnet/internal/threadprio"
)

// maxGuardBatch is the most ports one pod filter transaction of
// podnet-routed adds: a batch's messages stay far below the socket's
// buffer however many pods start at once.
const maxGuardBatch = 64

// guardReq is one port waiting for podnet-routed's guard write: done,
// and err, are set by the writer that took it, under guardMu.
type guardReq struct {
	g    podfilter.Guard
	port podfilter.Port
	pod  string
	// answer, when set, tells the plugin at once, from the writing
	// thread (policysock.GuardHandler)
	answer func(error)
	err    error
	done   bool
}

// GuardPort adds the port a plugin's policy wait describes to the pod
// filter (policysock.GuardHandler), on podnet-routed's one lasting
// nftables socket. A plugin that wrote the elements itself would close
// its socket at its exit, and the kernel holds the netns's nftables commit
// lock through every such close until what earlier transactions removed
// is freed (an RCU grace period): every other writer of the node, the
// NetworkPolicy engine's ADD-time writes first, would wait for it. The
// request is checked by policysock; the port's record and elements are
// those the plugin would write (podfilter.Guard.Install), and a failure
// leaves it to the plugin.
//
// Ports asked for while a write is under way are written together by the
// next one (podfilter.Guard.InstallAllOn): when many pods start at once,
// each waits for at most the write in progress and its own batch's, not
// for one transaction per pod before it. Each is answered right after
// its batch's write, from the writing thread.
// newGuardConn is the socket GuardPort writes the pod filter on: one
// lasting socket, with room for the acknowledgements of a whole write.
func newGuardConn() nftutil.Conn {
	return nftutil.Conn{Timeout: 2 * time.Second, ReceiveBuffer: podfilter.ReceiveBuffer}
}

func (d *Daemon) GuardPort(_ context.Context, req policysock.Request, answer func(error)) error {
	g, ok := podfilter.ByMode(req.Guard.Mode)
	if !ok {
		return fmt.Errorf("no pod filter of mode %q", req.Guard.Mode)
	}
	mac, err := net.ParseMAC(req.Guard.MAC)
	if err != nil {
		return fmt.Errorf("pod MAC: %w", err)
	}
	r := &guardReq{g: g.At(d.cfg.StateDir), pod: req.Namespace + "/" + req.Name, answer: answer,
		port: podfilter.Port{Index: req.Guard.Index, Name: req.HostVeth, Alias: req.Guard.Alias, MAC: mac}}
	for _, a := range req.IPs {
		r.port.IPs = append(r.port.IPs, net.IP(a.Unmap().AsSlice()))
	}
	d.guardQMu.Lock()
	d.guardQ = append(d.guardQ, r)
	d.guardQMu.Unlock()
	d.guardMu.Lock()
	defer d.guardMu.Unlock()
	// whoever holds guardMu writes every port asked for so far; r is
	// either done by an earlier holder or among them
	for !r.done {
		d.guardQMu.Lock()
		batch := d.guardQ[:min(len(d.guardQ), maxGuardBatch)]
		d.guardQ = d.guardQ[len(batch):]
		d.guardQMu.Unlock()
		d.writeGuards(batch)
	}
	return r.err
}

// writeGuards writes batch, one transaction per pod filter mode, and
// marks each request done. Callers hold guardMu.
func (d *Daemon) writeGuards(batch []*guardReq) {
	defer func() {
		for _, r := range batch {
			r.done = true
		}
	}()
	c, err := d.guardConn.Open()
	if err != nil {
		for _, r := range batch {
			r.err = err
		}
		return
	}
	byGuard := map[podfilter.Guard][]*guardReq{}
	var order []podfilter.Guard
	for _, r := range batch {
		if byGuard[r.g] == nil {
			order = append(order, r.g)
		}
		byGuard[r.g] = append(byGuard[r.g], r)
	}
	failed := false
	for _, g := range order {
		reqs := byGuard[g]
		ports := make([]podfilter.Port, len(reqs))
		for i, r := range reqs {
			ports[i] = r.port
		}
		threadprio.Do(d.cfg.GuardNice, func() {
			for i, err := range g.InstallAllOn(c, ports) {
				r := reqs[i]
				if r.err = err; r.answer != nil {
					r.answer(err)
				}
			}
		})
		for _, r := range reqs {
			if r.err != nil {
				failed = true
				d.log.Warn("cannot add a port to the pod filter; the plugin adds it", "hostVeth", r.port.Name, "pod", r.pod, "err", r.err)
			}
		}
	}
	if failed {
		// a socket a request failed on is not used again
		d.guardConn.Close()
	}
}

// UnguardPort takes the port a plugin's DEL names out of the pod filter
// (policysock.UnguardHandler), on the same lasting socket as GuardPort
// and for the same reason: the plugin's own socket would close at its
// exit, and on a node that deletes pods while it starts others the close
// after a removal holds every writer, the new pods' guard and policy
// writes first, for a grace period. The request is checked by
// policysock; a failure leaves it to the plugin. A port whose host veth
// is up is refused: DEL takes it out only once it has taken the veth out
// of service, and a live pod's port out of the filter would let that pod
// send as anyone.
func (d *Daemon) UnguardPort(_ context.Context, req policysock.Request) error {
	g, ok := podfilter.ByMode(req.Unguard.Mode)
	if !ok {
		return fmt.Errorf("no pod filter of mode %q", req.Unguard.Mode)
	}
	if l, err := netlink.LinkByIndex(req.Unguard.Index); err == nil && l.Attrs().Flags&net.FlagUp != 0 {
		return fmt.Errorf("interface index %d (%s) is up: a port leaves the pod filter only once DEL has taken its host veth down", req.Unguard.Index, l.Attrs().Name)
	}
	port := podfilter.Port{Index: req.Unguard.Index}
	if len(req.IPs) > 0 {
		mac, err := net.ParseMAC(req.Unguard.MAC)
		if err != nil {
			return fmt.Errorf("pod MAC: %w", err)
		}
		port.MAC = mac
		for _, a := range req.IPs {
			port.IPs = append(port.IPs, net.IP(a.Unmap().AsSlice()))
		}
	}
	d.guardMu.Lock()
	defer d.guardMu.Unlock()
	c, err := d.guardConn.Open()
	if err != nil {
		return err
	}
	threadprio.Do(d.cfg.GuardNice, func() { err = g.At(d.cfg.StateDir).RemoveExactOn(c, d.guardConn.Netlink(), port) })
	if err != nil {
		// a socket a request failed on is not used again
		d.guardConn.Close()
		d.log.Warn("cannot take a port out of the pod filter; the plugin does", "index", port.Index, "err", err)
	}
	return err
}
