package runtimee2e

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// probeEvery is the prober's period: every target gets an ICMP echo
// request that often.
const probeEvery = 100 * time.Millisecond

// prober pings a changing set of pod addresses from a netns (the node's)
// every probeEvery, over one raw ICMP socket, and counts for each address
// the echo requests sent, those answered, and answers from anyone else.
type prober struct {
	fd    int
	ident uint16

	mu      sync.Mutex
	seq     uint16
	targets map[netip.Addr]*probeTarget
	pending map[uint16]probe // seq -> request not answered yet
	wrong   []string         // replies from another address than the probed one

	quit     chan struct{}
	sendDone chan struct{}
	recvDone chan struct{}
	stopOnce sync.Once
	result   probeResult
}

type probeTarget struct {
	name           string
	sent, answered int
	lost           []time.Time // when the requests never answered were sent
}

type probe struct {
	dst netip.Addr
	at  time.Time
}

// newProber opens the socket in netns and starts probing (no target yet).
func newProber(netns ns.NetNS) (*prober, error) {
	p := &prober{
		targets: map[netip.Addr]*probeTarget{}, pending: map[uint16]probe{},
		quit: make(chan struct{}), sendDone: make(chan struct{}), recvDone: make(chan struct{}),
	}
	var b [2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	p.ident = binary.BigEndian.Uint16(b[:])
	err := netns.Do(func(ns.NetNS) error {
		// The socket stays in the netns it is made in.
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_ICMP)
		p.fd = fd
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("ICMP socket in %s: %w", netns.Path(), err)
	}
	// Receive with a timeout, so the receiver sees stop.
	tv := unix.NsecToTimeval((50 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(p.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(p.fd)
		return nil, fmt.Errorf("ICMP socket timeout: %w", err)
	}
	go p.send()
	go p.receive()
	return p, nil
}

// add starts probing ip (name is for the report).
func (p *prober) add(ip, name string) error {
	a, err := netip.ParseAddr(ip)
	if err != nil || !a.Is4() {
		return fmt.Errorf("probe %s: %q is not an IPv4 address", name, ip)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.targets[a]; ok {
		return fmt.Errorf("probe %s: %s is probed already (for %s)", name, ip, p.targets[a].name)
	}
	p.targets[a] = &probeTarget{name: name}
	return nil
}

func (p *prober) send() {
	defer close(p.sendDone)
	tick := time.NewTicker(probeEvery)
	defer tick.Stop()
	for {
		select {
		case <-p.quit:
			return
		case <-tick.C:
		}
		p.mu.Lock()
		for dst, t := range p.targets {
			p.seq++
			if _, busy := p.pending[p.seq]; busy {
				// 65536 requests unanswered: cannot happen in these tests.
				p.wrong = append(p.wrong, fmt.Sprintf("sequence %d wrapped around", p.seq))
				continue
			}
			pkt := echoRequest(p.ident, p.seq)
			if err := unix.Sendto(p.fd, pkt, 0, &unix.SockaddrInet4{Addr: dst.As4()}); err != nil {
				// Counted as lost: nothing answers a request never sent.
				t.sent++
				t.lost = append(t.lost, time.Now())
				continue
			}
			t.sent++
			p.pending[p.seq] = probe{dst: dst, at: time.Now()}
		}
		p.mu.Unlock()
	}
}

func (p *prober) receive() {
	defer close(p.recvDone)
	buf := make([]byte, 1500)
	for {
		n, from, err := unix.Recvfrom(p.fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				select {
				case <-p.quit:
					if p.drained() {
						return
					}
				default:
				}
				continue
			}
			return // closed
		}
		// A raw ICMP socket reads the IP header too.
		if n < 20 {
			continue
		}
		ihl := int(buf[0]&0x0f) * 4
		if n < ihl+8 || buf[ihl] != 0 /* echo reply */ {
			continue
		}
		icmp := buf[ihl:n]
		if binary.BigEndian.Uint16(icmp[4:6]) != p.ident {
			continue
		}
		seq := binary.BigEndian.Uint16(icmp[6:8])
		src := netip.AddrFrom4([4]byte(buf[12:16]))
		if sa, ok := from.(*unix.SockaddrInet4); ok {
			src = netip.AddrFrom4(sa.Addr)
		}
		p.mu.Lock()
		if req, ok := p.pending[seq]; ok {
			delete(p.pending, seq)
			if src != req.dst {
				p.wrong = append(p.wrong, fmt.Sprintf("echo request to %s (%s) answered by %s", req.dst, p.targets[req.dst].name, src))
			} else {
				p.targets[req.dst].answered++
			}
		}
		p.mu.Unlock()
	}
}

// drained says whether every request sent was answered, or waiting for
// the rest is over (2 s after the last was sent).
func (p *prober) drained() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, req := range p.pending {
		if time.Since(req.at) < 2*time.Second {
			return false
		}
	}
	return true
}

// probeResult is what a prober saw.
type probeResult struct {
	Targets, Sent, Lost int
	Wrong               []string
	// LostBy lists the targets that lost requests, with when.
	LostBy []string
}

// stop stops sending, waits (up to 2 s) for the answers in flight, closes
// the socket and returns the counts (the same on every call).
func (p *prober) stop() probeResult {
	p.stopOnce.Do(func() { p.result = p.halt() })
	return p.result
}

func (p *prober) halt() probeResult {
	close(p.quit)
	<-p.sendDone
	<-p.recvDone
	unix.Close(p.fd)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, req := range p.pending {
		t := p.targets[req.dst]
		t.lost = append(t.lost, req.at)
	}
	p.pending = nil
	r := probeResult{Targets: len(p.targets), Wrong: p.wrong}
	for dst, t := range p.targets {
		r.Sent += t.sent
		r.Lost += len(t.lost)
		if len(t.lost) > 0 {
			sort.Slice(t.lost, func(i, j int) bool { return t.lost[i].Before(t.lost[j]) })
			var at []string
			for _, l := range t.lost {
				at = append(at, l.Format("15:04:05.000"))
			}
			r.LostBy = append(r.LostBy, fmt.Sprintf("%s %s: %d of %d lost (sent at %s)", t.name, dst, len(t.lost), t.sent, abbreviate(at)))
		}
	}
	sort.Strings(r.LostBy)
	return r
}

func (r probeResult) String() string {
	s := fmt.Sprintf("%d pods pinged every %v: %d echo requests, %d lost, %d answered by another address", r.Targets, probeEvery, r.Sent, r.Lost, len(r.Wrong))
	if len(r.LostBy) > 0 {
		s += "\n  " + strings.Join(r.LostBy, "\n  ")
	}
	if len(r.Wrong) > 0 {
		s += "\n  " + abbreviate(r.Wrong)
	}
	return s
}

// echoRequest is an ICMP echo request with a 16-byte payload.
func echoRequest(ident, seq uint16) []byte {
	b := make([]byte, 8+16)
	b[0] = 8 // echo request
	binary.BigEndian.PutUint16(b[4:], ident)
	binary.BigEndian.PutUint16(b[6:], seq)
	copy(b[8:], "podnet-reconcile")
	binary.BigEndian.PutUint16(b[2:], icmpChecksum(b))
	return b
}

func icmpChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
