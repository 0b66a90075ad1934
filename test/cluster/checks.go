package cluster

import (
	"context"
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

// TCPMatrix connects over TCP from every pod to every other pod (sources
// in parallel): inside the cluster the server must see the client pod's
// own address (no masquerade).
func TCPMatrix(ctx context.Context, pods []*Pod) []TCPResult {
	addrs := make([]netip.AddrPort, len(pods))
	errs := make([]error, len(pods))
	for i, p := range pods {
		addrs[i], errs[i] = p.ServeTCP()
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
				r := TCPResult{From: src.Name, To: dst.Name, Want: src.IP, Err: errs[j]}
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

// OutsideTCP connects from every pod to a server on the outside host,
// which has no route to the pods: the connection only works masqueraded,
// and the server must see the pod's node address.
func (c *Cluster) OutsideTCP(ctx context.Context, pods []*Pod) ([]TCPResult, error) {
	addr, err := c.ServeOutsideTCP()
	if err != nil {
		return nil, err
	}
	out := make([]TCPResult, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := TCPResult{From: p.Name, To: "outside", Want: p.Node.IP}
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
// every node's address.
func (c *Cluster) NodePodPings(ctx context.Context) []PingResult {
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
			add(n.NS, n.Name, p.Name, p.IP)
			add(p.NS, p.Name, n.Name, n.IP)
		}
	}
	wg.Wait()
	return out
}
