package policy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/nettest"
)

const portLL = 7311

// linkLocal: a pod isolated for ingress and egress (deny all) reaches
// nothing over link-local addresses either, however they are addressed:
// not its node's listener on [::] through a link-local address of the
// node on its link (on podnet and on podnet-bridge), and on podnet-bridge
// not its bridge neighbour dns. Every pod has a link-local address,
// even in an IPv4-only cluster, and none is a Pod address: before the
// engine judged packets by the pod's port, all of these passed. Each
// check is allowed before the policy (the probes can succeed) and after
// it is deleted.
func (e *env) linkLocal(t *testing.T) {
	ctx := context.Background()
	echoOn(t, e.n1.NS, portLL)
	echoOn(t, e.web.NS, portLL)
	echoOn(t, e.local.NS, portLL)
	bridged := e.c.Cfg.Plugin == "podnet-bridge"
	gw := nodeLinkLocal(t, e.n1, e.local, bridged)
	type probe struct {
		what     string
		from     *cluster.NetNS
		to       netip.Addr
		isolated bool // refused while local is isolated
	}
	probes := []probe{
		{"local -> its node over the gateway's link-local " + gw.String(), e.local.NS, gw, true},
		{"web -> its node over link-local (web not isolated)", e.web.NS, nodeLinkLocal(t, e.n1, e.web, bridged), false},
	}
	if bridged {
		// web and local are isolated for ingress by the earlier
		// subtests' policies; dns (namespace dev, node 1) is not: local
		// reaches it until local is isolated for egress
		echoOn(t, e.dns.NS, portLL)
		probes = append(probes,
			probe{"local -> dns over link-local on the bridge", e.local.NS, linkLocalOf(t, e.dns, e.local), true})
	}
	check := func(when string, isolated bool) {
		t.Helper()
		for _, p := range probes {
			wantOK := !(isolated && p.isolated)
			err := nettest.Poll(ctx, converge, 200*time.Millisecond, func() error {
				err := cluster.ProbeTCP(ctx, p.from, netip.AddrPortFrom(p.to, portLL), 700*time.Millisecond)
				switch {
				case wantOK && err != nil:
					return fmt.Errorf("want allowed: %w", err)
				case !wantOK && err == nil:
					return fmt.Errorf("want refused, it answered")
				}
				return nil
			})
			if err != nil {
				t.Errorf("%s: %s: %v", when, p.what, err)
			}
		}
	}
	check("before any policy on local", false)
	labels := map[string]string{"role": "client", "linklocal": "deny"}
	if err := e.c.SetPodLabels(ctx, e.local, labels); err != nil {
		t.Fatal(err)
	}
	e.create(t, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "prod", Name: "local-deny-all"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: *sel("linklocal", "deny"),
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	})
	check("local isolated (deny all)", true)
	// and counted: by local's pod chain (podnet), by the bridge table's
	// link_dropped counter (podnet-bridge), as read at the next resync
	metric, want := "podnet_policy_drops_total", []string{`namespace="prod"`, `policy="local-deny-all"`}
	if bridged {
		metric, want = "podnet_policy_link_dropped_total", nil
	}
	if err := nettest.Poll(ctx, converge, 200*time.Millisecond, func() error {
		body, err := e.n1.MetricsText()
		if err != nil {
			return err
		}
		if v, ok := cluster.Metric(body, metric, want...); !ok || v == 0 {
			return fmt.Errorf("%s%v = %v (present %v), want > 0", metric, want, v, ok)
		}
		return nil
	}); err != nil {
		t.Errorf("link-local drops not counted: %v", err)
	}
	e.delete(t, "prod", "local-deny-all")
	if err := e.c.SetPodLabels(ctx, e.local, map[string]string{"role": "client"}); err != nil {
		t.Fatal(err)
	}
	check("policy deleted", false)
}

// echoOn serves TCP echo on [::]:port (every address, link-local ones
// included) in netns until the test ends.
func echoOn(t *testing.T, netns *cluster.NetNS, port int) {
	t.Helper()
	echoListen(t, netns, "tcp6", port)
}

// echoListen serves TCP echo on [::]:port of network ("tcp6": IPv6
// only; "tcp": both families) in netns until the test ends.
func echoListen(t *testing.T, netns *cluster.NetNS, network string, port int) {
	t.Helper()
	l, err := netns.Listen(network, fmt.Sprintf("[::]:%d", port))
	if err != nil {
		t.Fatalf("listen on [::]:%d: %v", port, err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) { defer c.Close(); _, _ = io.Copy(c, c) }(c)
		}
	}()
}

// nodeLinkLocal is a link-local address of the pod's node on the pod's
// link: podnet's host veth gateway (the pod's IPv6 default gateway), or
// podnet-bridge's bridge's own link-local address; zoned (by index: the
// zone's name would be looked up outside the pod's netns) to the pod's
// eth0.
func nodeLinkLocal(t *testing.T, n *cluster.Node, p *cluster.Pod, bridged bool) netip.Addr {
	t.Helper()
	var ll netip.Addr
	var err error
	if bridged {
		ll, err = linkLocalIn(n.NS, "podnet0")
	} else {
		err = p.NS.Do(func() error {
			routes, err := netlink.RouteList(nil, netlink.FAMILY_V6)
			if err != nil {
				return err
			}
			for _, r := range routes {
				if ones, _ := maskOf(r.Dst); ones == 0 && r.Gw != nil {
					ll, _ = netip.AddrFromSlice(r.Gw)
				}
			}
			if !ll.IsLinkLocalUnicast() {
				return fmt.Errorf("no link-local IPv6 default gateway (%v)", ll)
			}
			return nil
		})
	}
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	return ll.WithZone(eth0Zone(t, p))
}

// eth0Zone is the index of the pod's eth0, as an address zone.
func eth0Zone(t *testing.T, p *cluster.Pod) string {
	t.Helper()
	var idx int
	if err := p.NS.Do(func() error {
		l, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		idx = l.Attrs().Index
		return nil
	}); err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	return strconv.Itoa(idx)
}

// linkLocalIn is the link-local address of link in netns, once it is no
// longer tentative.
func linkLocalIn(netns *cluster.NetNS, link string) (netip.Addr, error) {
	var ll netip.Addr
	err := nettest.Poll(context.Background(), 10*time.Second, 100*time.Millisecond, func() error {
		return netns.Do(func() error {
			l, err := netlink.LinkByName(link)
			if err != nil {
				return err
			}
			addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
			if err != nil {
				return err
			}
			for _, a := range addrs {
				if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
					ll = ip
					return nil
				}
			}
			return fmt.Errorf("no link-local address on %s yet", link)
		})
	})
	return ll, err
}

// linkLocalOf is the pod's own link-local address on eth0, as a peer on
// its link (peer) reaches it.
func linkLocalOf(t *testing.T, p, peer *cluster.Pod) netip.Addr {
	t.Helper()
	ll, err := linkLocalIn(p.NS, "eth0")
	if err != nil {
		t.Fatalf("pod %s: %v", p.Name, err)
	}
	return ll.WithZone(eth0Zone(t, peer))
}

// maskOf is the prefix length of dst (nil: the default route).
func maskOf(dst *net.IPNet) (int, int) {
	if dst == nil {
		return 0, 128
	}
	return dst.Mask.Size()
}
