package veth

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/internal/podfilter"
	"github.com/podnet/podnet/internal/policysock"
)

// defaultPolicyWait bounds how long ADD waits for the node's NetworkPolicy
// engine to put the new pod's policy in the kernel. The engine's table
// drops a local pod address it does not know yet, so a pod whose wait
// times out is isolated (never open) until the engine catches up.
const defaultPolicyWait = 3 * time.Second

// policyWait is ADD's wait for podnet-routed's NetworkPolicy engine, when
// one listens on the node: the engine programs the new pod before ADD
// returns, so that its containers start with their policy in place. The
// request goes out as soon as the host side is in place (startPolicyWait)
// and the answer is read at the end (finish): the engine's write runs
// while the plugin sets up the pod side. It never fails ADD: no engine
// means no wait, and an engine that does not answer in time leaves the pod
// isolated, which is safe, and says so in the log. The request also asks
// podnet-routed to add the pod's port to the pod filter (guarded).
type policyWait struct {
	p      *policysock.Pending
	cancel context.CancelFunc
	req    policysock.Request
	start  time.Time
	log    *slog.Logger
}

// guardWait bounds how long ADD waits for podnet-routed to say it added
// the pod's port to the pod filter before the plugin adds it itself (the
// daemon's write takes well under a millisecond).
const guardWait = 500 * time.Millisecond

// startPolicyWait sends the engine the pod's addresses and host-side
// interface (inv.host), and guard (nil: none) for the pod filter. A nil
// policyWait (no wait, no engine, or the request failed, which is logged)
// is fine to finish and guards nothing.
func startPolicyWait(inv *invocation, containerID string, ips []net.IP, log *slog.Logger, guard *policysock.GuardPort) *policyWait {
	wait := defaultPolicyWait
	if inv.conf.PolicyWait != nil {
		wait = time.Duration(*inv.conf.PolicyWait)
	}
	if wait <= 0 || inv.pod.PodNamespace == "" || inv.pod.PodName == "" {
		return nil
	}
	req := policysock.Request{Namespace: inv.pod.PodNamespace, Name: inv.pod.PodName, ContainerID: containerID, HostVeth: inv.host, Guard: guard}
	for _, ip := range ips {
		if a, ok := netip.AddrFromSlice(ip); ok {
			req.IPs = append(req.IPs, a.Unmap())
		}
	}
	dir := stateDirOf(inv.conf)
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	w := &policyWait{cancel: cancel, req: req, start: time.Now(), log: log}
	p, err := policysock.Send(ctx, policysock.Path(dir), req)
	if err != nil {
		w.done(err)
		return nil
	}
	w.p = p
	return w
}

// guardPort is the pod filter's port as the request carries it.
func guardPort(g podfilter.Guard, p podfilter.Port) *policysock.GuardPort {
	return &policysock.GuardPort{Mode: g.Mode(), Index: p.Index, Alias: p.Alias, MAC: p.MAC.String()}
}

// guarded reports whether podnet-routed added the port to the pod filter
// (false: the plugin must; why is logged).
func (w *policyWait) guarded() bool {
	if w == nil || w.req.Guard == nil {
		return false
	}
	ok, err := w.p.AwaitGuard(guardWait)
	if err != nil {
		w.log.Info("adding the port to the pod filter itself", "container", w.req.ContainerID, "hostVeth", w.req.HostVeth, "why", err)
	}
	return ok
}

// finish reads the engine's answer (or gives up at the wait's end).
func (w *policyWait) finish() {
	if w != nil {
		w.done(w.p.Await())
	}
}

// abandon closes the request of an ADD that failed after it.
func (w *policyWait) abandon() {
	if w != nil {
		w.p.Close()
		w.cancel()
	}
}

func (w *policyWait) done(err error) {
	defer w.cancel()
	switch {
	case errors.Is(err, policysock.ErrNoEngine):
	case err != nil:
		w.log.Warn("NetworkPolicy engine did not confirm the pod's policy; the pod stays isolated until it does",
			"container", w.req.ContainerID, "pod", w.req.Namespace+"/"+w.req.Name, "err", err)
	default:
		w.log.Debug("pod's NetworkPolicy in place", "pod", w.req.Namespace+"/"+w.req.Name, "waited", time.Since(w.start))
	}
}

// unguardWait bounds how long DEL waits for podnet-routed to take its
// port out of the pod filter before it does it itself (the daemon's
// write takes well under a millisecond).
const unguardWait = 500 * time.Millisecond

// unguardByRouted asks podnet-routed to take port out of g's pod filter
// on its own nftables socket (policysock Request.Unguard) and reports
// whether it did. The plugin's socket would close at its exit, and a
// close after the NetworkPolicy engine removed a gone pod's elements
// holds every nftables writer of the node, the pods being started first,
// for an RCU grace period. No engine, a config without the policy wait,
// or any failure: false, and the plugin removes the port itself.
func unguardByRouted(inv *invocation, g podfilter.Guard, port podfilter.Port) bool {
	if inv.conf.PolicyWait != nil && *inv.conf.PolicyWait <= 0 {
		return false
	}
	// no pod name: an engine that does not know Unguard refuses the
	// request at once instead of taking it for a policy wait
	req := policysock.Request{Unguard: &policysock.GuardPort{Mode: g.Mode(), Index: port.Index}}
	if port.MAC != nil {
		req.Unguard.MAC = port.MAC.String()
	}
	for _, ip := range port.IPs {
		if a, ok := netip.AddrFromSlice(ip); ok {
			req.IPs = append(req.IPs, a.Unmap())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), unguardWait)
	defer cancel()
	return policysock.Wait(ctx, policysock.Path(stateDirOf(inv.conf)), req) == nil
}

// stateDirOf is the node state directory of conf.
func stateDirOf(conf *netConf) string {
	if conf.StateDir == "" {
		return nodestate.DefaultDir
	}
	return conf.StateDir
}
