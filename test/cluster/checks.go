package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
)

// TCPResult is one TCP connection of a check: who connected to whom, the
// source address the server saw, and whether that is the expected one.
type TCPResult struct {
	From, To string
	Want     netip.Addr // the source the server should see
	Seen     netip.Addr
	Err      error
}

// OK says whether the connection worked with the expected source.
func (r TCPResult) OK() bool { return r.Err == nil && r.Seen == r.Want }

func (r TCPResult) String() string {
	switch {
	case r.Err != nil:
		return fmt.Sprintf("%s → %s: %v", r.From, r.To, r.Err)
	case r.Seen != r.Want:
		return fmt.Sprintf("%s → %s: server saw source %s, want %s", r.From, r.To, r.Seen, r.Want)
	}
	return fmt.Sprintf("%s → %s: source %s", r.From, r.To, r.Seen)
}

// TCPMatrix connects over TCP from every pod to every other pod's IP
// (sources in parallel): inside the cluster the server must see the client
// pod's own address (no masquerade).
func TCPMatrix(ctx context.Context, pods []*Pod) []TCPResult { return tcpMatrix(ctx, pods, false) }

// TCPMatrix6 is TCPMatrix between the pods' IP6: the IPv6 half of a
// dual-stack cluster.
func TCPMatrix6(ctx context.Context, pods []*Pod) []TCPResult { return tcpMatrix(ctx, pods, true) }

func tcpMatrix(ctx context.Context, pods []*Pod, ip6 bool) []TCPResult {
	addrs := make([]netip.AddrPort, len(pods))
	errs := make([]error, len(pods))
	for i, p := range pods {
		addrs[i], errs[i] = p.serveTCP(ip6)
	}
	out := make([][]TCPResult, len(pods))
	var wg sync.WaitGroup
	for i, src := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j, dst := range pods {
				if i == j {
					continue
				}
				r := TCPResult{From: src.Name, To: dst.Name, Want: src.addr(ip6), Err: errs[j]}
				if r.Err == nil {
					r.Seen, r.Err = TCPSource(ctx, src.NS, addrs[j])
				}
				out[i] = append(out[i], r)
			}
		}()
	}
	wg.Wait()
	var all []TCPResult
	for _, row := range out {
		all = append(all, row...)
	}
	return all
}

// OutsideTCP connects from every pod to a server on the outside host
// (its first address, OutsideIPs), which has no route to the pods: the
// connection only works masqueraded, and the server must see the pod's
// node address (IP).
func (c *Cluster) OutsideTCP(ctx context.Context, pods []*Pod) ([]TCPResult, error) {
	return c.outsideTCP(ctx, pods, false)
}

// OutsideTCP6 is OutsideTCP over IPv6 in a dual-stack cluster: to
// OutsideIP6 from the pods' IP6, the server seeing the nodes' IP6.
func (c *Cluster) OutsideTCP6(ctx context.Context, pods []*Pod) ([]TCPResult, error) {
	return c.outsideTCP(ctx, pods, true)
}

func (c *Cluster) outsideTCP(ctx context.Context, pods []*Pod, ip6 bool) ([]TCPResult, error) {
	dst := c.OutsideIPs()[0]
	if ip6 {
		if c.Cfg.ClusterCIDR6 == "" {
			return nil, errors.New("OutsideTCP6: not a dual-stack cluster")
		}
		dst = OutsideIP6
	}
	addr, err := c.serveOutsideTCP(dst)
	if err != nil {
		return nil, err
	}
	out := make([]TCPResult, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := TCPResult{From: p.Name, To: "outside", Want: p.Node.addr(ip6)}
			r.Seen, r.Err = TCPSource(ctx, p.NS, addr)
			out[i] = r
		}()
	}
	wg.Wait()
	return out, nil
}

// PingResult is one ping of a check.
type PingResult struct {
	From, To string
	Dst      netip.Addr
	RTT      Cell
}

// NodePodPings pings from every node to every pod and from every pod to
// every node's address (IP).
func (c *Cluster) NodePodPings(ctx context.Context) []PingResult { return c.nodePodPings(ctx, false) }

// NodePodPings6 is NodePodPings at the IP6 of a dual-stack cluster's pods
// and nodes.
func (c *Cluster) NodePodPings6(ctx context.Context) []PingResult { return c.nodePodPings(ctx, true) }

func (c *Cluster) nodePodPings(ctx context.Context, ip6 bool) []PingResult {
	var out []PingResult
	var mu sync.Mutex
	var wg sync.WaitGroup
	add := func(from *NetNS, fromName, toName string, dst netip.Addr) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rtt, err := Ping(ctx, from, dst)
			mu.Lock()
			out = append(out, PingResult{From: fromName, To: toName, Dst: dst, RTT: Cell{OK: err == nil, RTT: rtt, Err: err}})
			mu.Unlock()
		}()
	}
	for _, n := range c.Nodes {
		for _, p := range c.Pods() {
			add(n.NS, n.Name, p.Name, p.addr(ip6))
			add(p.NS, p.Name, n.Name, n.addr(ip6))
		}
	}
	wg.Wait()
	return out
}

// addr is the pod's IP, or its IP6 when ip6.
func (p *Pod) addr(ip6 bool) netip.Addr {
	if ip6 {
		return p.IP6
	}
	return p.IP
}

// addr is the node's IP, or its IP6 when ip6.
func (n *Node) addr(ip6 bool) netip.Addr {
	if ip6 {
		return n.IP6
	}
	return n.IP
}
