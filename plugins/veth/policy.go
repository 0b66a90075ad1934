package veth

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/internal/policysock"
)

// defaultPolicyWait bounds how long ADD waits for the node's NetworkPolicy
// engine to put the new pod's policy in the kernel. The engine's table
// drops a local pod address it does not know yet, so a pod whose wait
// times out is isolated (never open) until the engine catches up.
const defaultPolicyWait = 3 * time.Second

// waitPolicy asks podnet-routed's NetworkPolicy engine, when one listens on
// the node, to program the pod before ADD returns, so that the pod's
// containers start with their policy in place. It never fails ADD: no
// engine means no wait, and an engine that does not answer in time leaves
// the pod isolated, which is safe, and says so in the log.
func waitPolicy(inv *invocation, containerID string, ips []net.IP, log *slog.Logger) {
	wait := defaultPolicyWait
	if inv.conf.PolicyWait != nil {
		wait = time.Duration(*inv.conf.PolicyWait)
	}
	if wait <= 0 || inv.pod.PodNamespace == "" || inv.pod.PodName == "" {
		return
	}
	req := policysock.Request{Namespace: inv.pod.PodNamespace, Name: inv.pod.PodName, ContainerID: containerID, HostVeth: inv.host}
	for _, ip := range ips {
		if a, ok := netip.AddrFromSlice(ip); ok {
			req.IPs = append(req.IPs, a.Unmap())
		}
	}
	dir := inv.conf.StateDir
	if dir == "" {
		dir = nodestate.DefaultDir
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	start := time.Now()
	err := policysock.Wait(ctx, policysock.Path(dir), req)
	switch {
	case errors.Is(err, policysock.ErrNoEngine):
	case err != nil:
		log.Warn("NetworkPolicy engine did not confirm the pod's policy; the pod stays isolated until it does",
			"container", containerID, "pod", req.Namespace+"/"+req.Name, "err", err)
	default:
		log.Debug("pod's NetworkPolicy in place", "pod", req.Namespace+"/"+req.Name, "waited", time.Since(start))
	}
}
