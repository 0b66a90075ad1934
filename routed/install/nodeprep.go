package install

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/podnet/podnet/internal/sysctl"
	"github.com/podnet/podnet/routed/dataplane"
	"github.com/podnet/podnet/routed/desired"
)

// Prep configures the node for podnet-routed running without privileges.
//
// A container that is not privileged gets /proc/sys read-only, so
// podnet-routed (which only has CAP_NET_ADMIN) cannot set ip_forward or a
// device's rp_filter itself. It does not need to when they already have the
// values it wants: it reads them and only writes on a difference. Prep,
// run once per pod start from an init container that has the host's
// /proc/sys/net mounted read-write at another path, creates the
// encapsulation devices exactly as podnet-routed would (the same dataplane
// code), sets the dataplane's sysctls through that path with the
// dataplane's writer, and then checks that podnet-routed's own setup has
// nothing left to write.
type Prep struct {
	NodeName     string
	Encap        desired.Encap
	ClusterCIDRs []netip.Prefix
	MTU          int
	VXLANVNI     int
	VXLANPort    int
	// ProcSys is where the host's /proc/sys is visible read-write (the
	// net/ subtree is enough), e.g. /host/proc/sys; "" is
	// sysctl.DefaultRoot.
	ProcSys string
	Log     *slog.Logger
}

// Run prepares the node. client reads this node's Node object (its address
// and PodCIDRs, the same way podnet-routed reads them).
func (p Prep) Run(ctx context.Context, client kubernetes.Interface) error {
	if p.Log == nil {
		p.Log = slog.New(slog.DiscardHandler)
	}
	obj, err := client.CoreV1().Nodes().Get(ctx, p.NodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node %s: %w", p.NodeName, err)
	}
	self := desired.FromNode(obj)
	if !self.IP.IsValid() {
		return fmt.Errorf("node %s has no InternalIP (or %s annotation) yet", p.NodeName, desired.NodeIPAnnotation)
	}
	if p.Encap == desired.IPIP {
		if err := dataplane.CheckIPIP(); err != nil {
			return err
		}
	}
	// The devices as podnet-routed makes them (the same code), their
	// sysctls written through the writable tree before they come up.
	dp := &dataplane.Netlink{Encap: p.Encap, VNI: p.VXLANVNI, Port: p.VXLANPort, MTU: p.MTU, ProcSys: p.ProcSys, Log: p.Log}
	res, err := dp.Setup(self, nil)
	if err != nil {
		return fmt.Errorf("set up the tunnel device: %w", err)
	}
	if len(res.SysctlErrors) > 0 {
		return fmt.Errorf("through %s: %w", p.ProcSys, res.SysctlErrors[0])
	}
	v6 := false
	for _, c := range append(append([]netip.Prefix(nil), self.PodCIDRs...), p.ClusterCIDRs...) {
		v6 = v6 || c.Addr().Is6()
	}
	host := sysctl.Writer{Root: p.ProcSys, Log: p.Log}
	if err := host.Write(dataplane.Sysctls(p.Encap, v6)); err != nil {
		return err
	}
	// podnet-routed's own setup, through its own (read-only) /proc/sys,
	// must find nothing left to write.
	check := &dataplane.Netlink{Encap: p.Encap, VNI: p.VXLANVNI, Port: p.VXLANPort, MTU: p.MTU, Log: p.Log}
	res, err = check.Setup(self, nil)
	if err == nil && len(res.SysctlErrors) > 0 {
		err = res.SysctlErrors[0]
	}
	if err != nil {
		return fmt.Errorf("podnet-routed's setup would still change the node after preparing it: %w", err)
	}
	return nil
}
