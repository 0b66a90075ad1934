package cluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

var (
	pingStats = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)
	pingRTT   = regexp.MustCompile(`rtt min/avg/max/mdev = ([0-9.]+)/`)
)

// Ping sends two ICMP echo requests 0.1 s apart from netns to dst (1 s
// wait) and returns the smaller round trip; it fails when none is
// answered.
func Ping(ctx context.Context, from *NetNS, dst netip.Addr) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := from.Exec(ctx, "ping", "-n", "-c", "2", "-i", "0.1", "-W", "1", dst.String())
	if err != nil {
		return 0, fmt.Errorf("%w: %s", err, lastLines(out, 2))
	}
	m := pingRTT.FindStringSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("ping %s: no rtt in %q", dst, out)
	}
	ms, err := strconv.ParseFloat(m[1], 64)
	return time.Duration(ms * float64(time.Millisecond)), err
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " / ")
}

// Cell is one source → destination result of a matrix.
type Cell struct {
	OK  bool
	RTT time.Duration
	Err error
}

// Matrix is the pod-to-pod ICMP connectivity: Cells[i][j] is Pods[i]
// pinging Pods[j] (the diagonal is not probed), at its IP (IP6 when IP6).
type Matrix struct {
	Pods  []*Pod
	Cells [][]Cell
	IP6   bool
}

// PingMatrix pings every pod's IP from every other pod (sources in
// parallel).
func PingMatrix(ctx context.Context, pods []*Pod) *Matrix { return pingMatrix(ctx, pods, false) }

// PingMatrix6 is PingMatrix at the pods' IP6: the IPv6 half of a
// dual-stack cluster.
func PingMatrix6(ctx context.Context, pods []*Pod) *Matrix { return pingMatrix(ctx, pods, true) }

func pingMatrix(ctx context.Context, pods []*Pod, ip6 bool) *Matrix {
	m := &Matrix{Pods: pods, Cells: make([][]Cell, len(pods)), IP6: ip6}
	var wg sync.WaitGroup
	for i, src := range pods {
		m.Cells[i] = make([]Cell, len(pods))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j, dst := range pods {
				if i == j {
					continue
				}
				rtt, err := Ping(ctx, src.NS, dst.addr(ip6))
				m.Cells[i][j] = Cell{OK: err == nil, RTT: rtt, Err: err}
			}
		}()
	}
	wg.Wait()
	return m
}

// Failures describes every failed pair ("" when all passed).
func (m *Matrix) Failures() []string {
	var out []string
	for i, row := range m.Cells {
		for j, c := range row {
			if i != j && !c.OK {
				out = append(out, fmt.Sprintf("%s (%s) → %s (%s): %v", m.Pods[i].Name, m.Pods[i].addr(m.IP6), m.Pods[j].Name, m.Pods[j].addr(m.IP6), c.Err))
			}
		}
	}
	return out
}

// Pairs is the number of probed pairs and how many passed.
func (m *Matrix) Pairs() (total, ok int) {
	for i, row := range m.Cells {
		for j, c := range row {
			if i != j {
				total++
				if c.OK {
					ok++
				}
			}
		}
	}
	return total, ok
}

// Render writes the matrix as a table: rows are sources, columns
// destinations, each cell ✓ with the round trip or ✗.
func (m *Matrix) Render(w io.Writer, indent string) {
	width := 9
	for _, p := range m.Pods {
		width = max(width, len(p.Name)+1)
	}
	fmt.Fprintf(w, "%s%-*s", indent, width+1, "from \\ to")
	for _, p := range m.Pods {
		fmt.Fprintf(w, "%-*s", width+1, p.Name)
	}
	fmt.Fprintln(w)
	for i, row := range m.Cells {
		fmt.Fprintf(w, "%s%-*s", indent, width+1, m.Pods[i].Name)
		for j, c := range row {
			cell := "·"
			switch {
			case i == j:
			case c.OK:
				cell = "✓ " + fmtRTT(c.RTT)
			default:
				cell = "✗"
			}
			fmt.Fprintf(w, "%s%s", cell, strings.Repeat(" ", max(1, width+1-len([]rune(cell)))))
		}
		fmt.Fprintln(w)
	}
}

func fmtRTT(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	if ms < 10 {
		return strconv.FormatFloat(ms, 'f', 2, 64) + "ms"
	}
	return strconv.FormatFloat(ms, 'f', 0, 64) + "ms"
}

// ---- TCP: who am I ----

// whoAmI is a TCP server that answers every line with the address the
// connection came from: the client learns which source address reached
// the server (its own, or a masquerading node's).
type whoAmI struct {
	l  net.Listener
	wg sync.WaitGroup
}

func serveWhoAmI(netns *NetNS, ip netip.Addr) (*whoAmI, error) {
	l, err := netns.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		return nil, err
	}
	s := &whoAmI{l: l}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(5 * time.Second))
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				ap, _ := netip.ParseAddrPort(c.RemoteAddr().String())
				fmt.Fprintf(c, "%s\n", ap.Addr().Unmap())
			}()
		}
	}()
	return s, nil
}

func (s *whoAmI) Addr() netip.AddrPort { return netip.MustParseAddrPort(s.l.Addr().String()) }

func (s *whoAmI) Close() error {
	err := s.l.Close()
	s.wg.Wait()
	return err
}

// ServeTCP starts (once) the pod's TCP who-am-I server on its address
// (IP) and returns where it listens.
func (p *Pod) ServeTCP() (netip.AddrPort, error) { return p.serveTCP(false) }

// ServeTCP6 is ServeTCP on the pod's IP6 (dual-stack).
func (p *Pod) ServeTCP6() (netip.AddrPort, error) { return p.serveTCP(true) }

func (p *Pod) serveTCP(ip6 bool) (netip.AddrPort, error) {
	ip := p.addr(ip6)
	if !ip.IsValid() {
		return netip.AddrPort{}, fmt.Errorf("pod %s has no IPv6 address (IP6) of a dual-stack cluster", p.Name)
	}
	p.mu.Lock()
	for _, s := range p.servers {
		if w, ok := s.(*whoAmI); ok && w.Addr().Addr() == ip {
			p.mu.Unlock()
			return w.Addr(), nil
		}
	}
	p.mu.Unlock()
	s, err := serveWhoAmI(p.NS, ip)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("pod %s: %w", p.Name, err)
	}
	p.addServer(s)
	return s.Addr(), nil
}

// ServeOutsideTCP starts a TCP who-am-I server on the outside host's
// first address (OutsideIPs).
func (c *Cluster) ServeOutsideTCP() (netip.AddrPort, error) {
	return c.serveOutsideTCP(c.OutsideIPs()[0])
}

func (c *Cluster) serveOutsideTCP(ip netip.Addr) (netip.AddrPort, error) {
	s, err := serveWhoAmI(c.Outside, ip)
	if err != nil {
		return netip.AddrPort{}, err
	}
	c.mu.Lock()
	c.servers = append(c.servers, s)
	c.mu.Unlock()
	return s.Addr(), nil
}

// TCPSource connects from netns to a who-am-I server and returns the
// source address the server saw.
func TCPSource(ctx context.Context, from *NetNS, to netip.AddrPort) (netip.Addr, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := from.DialContext(ctx, "tcp", to.String())
	if err != nil {
		return netip.Addr{}, fmt.Errorf("TCP %s → %s: %w", from.Name, to, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := io.WriteString(conn, "who am i\n"); err != nil {
		return netip.Addr{}, err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return netip.Addr{}, fmt.Errorf("TCP %s → %s: read: %w", from.Name, to, err)
	}
	return netip.ParseAddr(strings.TrimSpace(line))
}

// ---- a running ping ----

// PingRun is a ping running in the background.
type PingRun struct {
	done     chan struct{}
	out      string
	err      error
	Sent     int
	Received int
}

// StartPing starts `ping -i interval -c count dst` in netns.
func StartPing(ctx context.Context, from *NetNS, dst netip.Addr, interval time.Duration, count int) *PingRun {
	r := &PingRun{done: make(chan struct{})}
	limit := time.Duration(count)*interval + 10*time.Second
	go func() {
		defer close(r.done)
		ctx, cancel := context.WithTimeout(ctx, limit)
		defer cancel()
		r.out, r.err = from.Exec(ctx, "ping", "-n", "-q", "-i", strconv.FormatFloat(interval.Seconds(), 'f', 3, 64),
			"-c", strconv.Itoa(count), "-W", "1", dst.String())
		if m := pingStats.FindStringSubmatch(r.out); m != nil {
			r.Sent, _ = strconv.Atoi(m[1])
			r.Received, _ = strconv.Atoi(m[2])
		} else if r.err == nil {
			r.err = errors.New("no statistics in ping's output")
		}
	}()
	return r
}

// Wait waits for the ping to finish and returns its summary line.
func (r *PingRun) Wait() (string, error) {
	<-r.done
	return lastLines(r.out, 2), r.err
}
