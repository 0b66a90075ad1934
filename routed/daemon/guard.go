package daemon

import (
	"context"
	"fmt"
	"net"

	"github.com/podnet/podnet/internal/podfilter"
	"github.com/podnet/podnet/internal/policysock"
	"github.com/podnet/podnet/internal/threadprio"
)

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
func (d *Daemon) GuardPort(_ context.Context, req policysock.Request) error {
	g, ok := podfilter.ByMode(req.Guard.Mode)
	if !ok {
		return fmt.Errorf("no pod filter of mode %q", req.Guard.Mode)
	}
	mac, err := net.ParseMAC(req.Guard.MAC)
	if err != nil {
		return fmt.Errorf("pod MAC: %w", err)
	}
	port := podfilter.Port{Index: req.Guard.Index, Name: req.HostVeth, Alias: req.Guard.Alias, MAC: mac}
	for _, a := range req.IPs {
		port.IPs = append(port.IPs, net.IP(a.Unmap().AsSlice()))
	}
	d.guardMu.Lock()
	defer d.guardMu.Unlock()
	c, err := d.guardConn.Open()
	if err != nil {
		return err
	}
	threadprio.Do(d.cfg.GuardNice, func() { err = g.At(d.cfg.StateDir).InstallOn(c, port) })
	if err != nil {
		// a socket a request failed on is not used again
		d.guardConn.Close()
		d.log.Warn("cannot add a port to the pod filter; the plugin adds it", "hostVeth", req.HostVeth, "pod", req.Namespace+"/"+req.Name, "err", err)
		return err
	}
	return nil
}
