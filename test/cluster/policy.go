package cluster

// NetworkPolicy support (issue 24): Pod objects made around the CNI ADD as
// the scheduler and kubelet make them, namespaces with labels,
// NetworkPolicies, and probes of single TCP and UDP flows between pods
// with a short timeout (a dropped first packet is a timeout, not an
// error of the network).

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/podnet/podnet/test/nettest"
)

// PodSpec is what AddPodSpec puts in a pod's Pod object.
type PodSpec struct {
	Namespace string // default "default"
	Name      string // "" = the node's next name
	Labels    map[string]string
	// Ports are the container's ports (named ports resolve against them).
	Ports []corev1.ContainerPort
	// LateStatus: AddPodSpec leaves status.podIPs unset; the caller
	// reports them (ReportPodIPs), as a slow kubelet would.
	LateStatus bool
}

func (c *Cluster) podObjects() bool { return c.Cfg.NetworkPolicy || c.Cfg.PodObjects }

// PodObject is the Pod object a pod of a node gets: one container with
// spec's ports, scheduled on node, pending.
func PodObject(spec PodSpec, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: spec.Namespace, Name: spec.Name, Labels: spec.Labels},
		Spec: corev1.PodSpec{
			NodeName:                     node,
			AutomountServiceAccountToken: new(false),
			Containers:                   []corev1.Container{{Name: "app", Image: "podnet.invalid/app", Ports: spec.Ports}},
		},
	}
}

// createPodObject creates the Pod as the scheduler leaves it: bound to
// n, no addresses yet.
func (c *Cluster) createPodObject(ctx context.Context, n *Node, spec PodSpec) error {
	if err := EnsureServiceAccount(ctx, c.Client, spec.Namespace); err != nil {
		return err
	}
	if _, err := c.Client.CoreV1().Pods(spec.Namespace).Create(ctx, PodObject(spec, n.Name), metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create Pod %s/%s: %w", spec.Namespace, spec.Name, err)
	}
	return nil
}

// ReportPodIPs reports the pod's addresses in its Pod status, as the
// kubelet does after the CNI ADD (phase Running): AddPodSpec does unless
// PodSpec.LateStatus.
func (c *Cluster) ReportPodIPs(ctx context.Context, p *Pod) error { return c.setPodIPs(ctx, p) }

func (c *Cluster) setPodIPs(ctx context.Context, p *Pod) error {
	var ips []string
	for _, a := range []netip.Addr{p.IP, p.IP6} {
		if a.IsValid() {
			ips = append(ips, a.String())
		}
	}
	return SetPodStatusIPs(ctx, c.Client, p.Namespace, p.Name, p.Node.IP.String(), ips)
}

// SetPodStatusIPs sets a Pod's status as the kubelet does once its sandbox
// has addresses: phase Running, hostIP, podIP and podIPs (retrying on
// conflicts).
func SetPodStatusIPs(ctx context.Context, client kubernetes.Interface, namespace, name, hostIP string, ips []string) error {
	for range 5 {
		pod, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get Pod %s/%s: %w", namespace, name, err)
		}
		pod.Status.Phase = corev1.PodRunning
		pod.Status.HostIP = hostIP
		pod.Status.HostIPs = []corev1.HostIP{{IP: hostIP}}
		pod.Status.PodIPs = nil
		pod.Status.PodIP = ""
		for i, ip := range ips {
			if i == 0 {
				pod.Status.PodIP = ip
			}
			pod.Status.PodIPs = append(pod.Status.PodIPs, corev1.PodIP{IP: ip})
		}
		_, err = client.CoreV1().Pods(namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("Pod %s/%s status: %w", namespace, name, err)
		}
	}
	return fmt.Errorf("Pod %s/%s status: too many conflicts", namespace, name)
}

// deletePodObject deletes the pod's Pod object (none: nothing to do).
func (c *Cluster) deletePodObject(ctx context.Context, p *Pod) error {
	if !c.podObjects() {
		return nil
	}
	err := c.Client.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete Pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil
}

// SetPodLabels replaces the labels of the pod's Pod object.
func (c *Cluster) SetPodLabels(ctx context.Context, p *Pod, labels map[string]string) error {
	for range 5 {
		pod, err := c.Client.CoreV1().Pods(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get Pod %s/%s: %w", p.Namespace, p.Name, err)
		}
		pod.Labels = labels
		if _, err = c.Client.CoreV1().Pods(p.Namespace).Update(ctx, pod, metav1.UpdateOptions{}); err == nil {
			return nil
		} else if !apierrors.IsConflict(err) {
			return fmt.Errorf("label Pod %s/%s: %w", p.Namespace, p.Name, err)
		}
	}
	return fmt.Errorf("label Pod %s/%s: too many conflicts", p.Namespace, p.Name)
}

// CreateNamespace creates a namespace with labels (the API server adds
// kubernetes.io/metadata.name itself).
func (c *Cluster) CreateNamespace(ctx context.Context, name string, labels map[string]string) error {
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create Namespace %s: %w", name, err)
	}
	return nil
}

// SetNamespaceLabels replaces a namespace's labels (its
// kubernetes.io/metadata.name stays).
func (c *Cluster) SetNamespaceLabels(ctx context.Context, name string, labels map[string]string) error {
	for range 5 {
		ns, err := c.Client.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("get Namespace %s: %w", name, err)
		}
		ns.Labels = map[string]string{"kubernetes.io/metadata.name": name}
		for k, v := range labels {
			ns.Labels[k] = v
		}
		if _, err = c.Client.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err == nil {
			return nil
		} else if !apierrors.IsConflict(err) {
			return fmt.Errorf("label Namespace %s: %w", name, err)
		}
	}
	return fmt.Errorf("label Namespace %s: too many conflicts", name)
}

// CreatePolicy creates a NetworkPolicy.
func (c *Cluster) CreatePolicy(ctx context.Context, np *networkingv1.NetworkPolicy) error {
	if _, err := c.Client.NetworkingV1().NetworkPolicies(np.Namespace).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
	}
	return nil
}

// DeletePolicy deletes a NetworkPolicy.
func (c *Cluster) DeletePolicy(ctx context.Context, namespace, name string) error {
	if err := c.Client.NetworkingV1().NetworkPolicies(namespace).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete NetworkPolicy %s/%s: %w", namespace, name, err)
	}
	return nil
}

// ---- probes ----

// echoServer answers every TCP line and every UDP datagram with the same
// bytes; TCP connections stay open until the client closes them (a
// stream for the revocation checks).
type echoServer struct {
	l  net.Listener
	pc net.PacketConn
	wg sync.WaitGroup
	mu sync.Mutex
	cs map[net.Conn]struct{}
}

func (s *echoServer) Close() error {
	var err error
	if s.l != nil {
		err = s.l.Close()
	}
	if s.pc != nil {
		err = errors.Join(err, s.pc.Close())
	}
	s.mu.Lock()
	for c := range s.cs {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return err
}

// ServeEcho starts a TCP and a UDP echo server on port of every address
// of the pod (IP, and IP6 when dual-stack). Port 0 is not allowed: the
// policies name the ports.
func (p *Pod) ServeEcho(port int) error {
	if port <= 0 {
		return fmt.Errorf("pod %s: ServeEcho needs a port", p.Name)
	}
	for _, ip := range []netip.Addr{p.IP, p.IP6} {
		if !ip.IsValid() {
			continue
		}
		s, err := serveEcho(p.NS, netip.AddrPortFrom(ip, uint16(port)))
		if err != nil {
			return fmt.Errorf("pod %s: %w", p.Name, err)
		}
		p.addServer(s)
	}
	return nil
}

func serveEcho(netns *NetNS, at netip.AddrPort) (*echoServer, error) {
	s := &echoServer{cs: map[net.Conn]struct{}{}}
	var err error
	if s.l, err = netns.Listen("tcp", at.String()); err != nil {
		return nil, err
	}
	if err = netns.Do(func() error {
		var err error
		s.pc, err = net.ListenPacket("udp", at.String())
		return err
	}); err != nil {
		s.l.Close()
		return nil, err
	}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		for {
			c, err := s.l.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.cs[c] = struct{}{}
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer func() {
					s.mu.Lock()
					delete(s.cs, c)
					s.mu.Unlock()
					c.Close()
				}()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	go func() {
		defer s.wg.Done()
		buf := make([]byte, 2048)
		for {
			n, from, err := s.pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = s.pc.WriteTo(buf[:n], from)
		}
	}()
	return s, nil
}

// ProbeTimeout is how long a probe waits for a connection or an answer:
// the policy table drops a refused flow's packets (no reset), so a refused
// flow is one that does not answer in this time.
const ProbeTimeout = 700 * time.Millisecond

// ProbeTCP opens a new TCP connection from netns to to, sends a line and
// waits for its echo (ServeEcho), within timeout; nil when it came back.
func ProbeTCP(ctx context.Context, from *NetNS, to netip.AddrPort, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := from.DialContext(ctx, "tcp", to.String())
	if err != nil {
		return fmt.Errorf("TCP %s → %s: %w", from.Name, to, err)
	}
	defer conn.Close()
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	if _, err := io.WriteString(conn, "probe\n"); err != nil {
		return fmt.Errorf("TCP %s → %s: write: %w", from.Name, to, err)
	}
	if line, err := bufio.NewReader(conn).ReadString('\n'); err != nil || line != "probe\n" {
		return fmt.Errorf("TCP %s → %s: echo %q: %v", from.Name, to, line, err)
	}
	return nil
}

// ProbeUDP sends datagrams from a new socket (a new flow: a new source
// port) in netns to to and waits for an echo (ServeEcho), within timeout;
// it sends again every 100 ms so that one lost datagram is no refusal.
func ProbeUDP(ctx context.Context, from *NetNS, to netip.AddrPort, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	conn, err := from.DialContext(ctx, "udp", to.String())
	if err != nil {
		return fmt.Errorf("UDP %s → %s: %w", from.Name, to, err)
	}
	defer conn.Close()
	got := make(chan error, 1)
	go func() {
		buf := make([]byte, 64)
		dl, _ := ctx.Deadline()
		_ = conn.SetReadDeadline(dl)
		n, err := conn.Read(buf)
		if err == nil && string(buf[:n]) != "probe" {
			err = fmt.Errorf("echo %q", buf[:n])
		}
		got <- err
	}()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := conn.Write([]byte("probe")); err != nil {
			// ECONNREFUSED from an ICMP port unreachable: answered, no server
			return fmt.Errorf("UDP %s → %s: write: %w", from.Name, to, err)
		}
		select {
		case err := <-got:
			if err != nil {
				return fmt.Errorf("UDP %s → %s: %w", from.Name, to, err)
			}
			return nil
		case <-tick.C:
		}
	}
}

// Probe is ProbeTCP or ProbeUDP by proto ("tcp" or "udp").
func Probe(ctx context.Context, proto string, from *NetNS, to netip.AddrPort, timeout time.Duration) error {
	switch proto {
	case "tcp":
		return ProbeTCP(ctx, from, to, timeout)
	case "udp":
		return ProbeUDP(ctx, from, to, timeout)
	}
	return fmt.Errorf("probe: protocol %q", proto)
}

// Stream is an open TCP connection to an echo server (ServeEcho).
type Stream struct {
	conn net.Conn
	r    *bufio.Reader
	seq  int
}

// OpenStream connects from netns to an echo server.
func OpenStream(ctx context.Context, from *NetNS, to netip.AddrPort) (*Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := from.DialContext(ctx, "tcp", to.String())
	if err != nil {
		return nil, fmt.Errorf("TCP stream %s → %s: %w", from.Name, to, err)
	}
	return &Stream{conn: conn, r: bufio.NewReader(conn)}, nil
}

// Echo sends one line on the stream and waits up to timeout for its echo.
// After a timeout the stream is out of step: Close it.
func (s *Stream) Echo(timeout time.Duration) error {
	s.seq++
	line := "line " + strconv.Itoa(s.seq) + "\n"
	_ = s.conn.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(s.conn, line); err != nil {
		return fmt.Errorf("stream write: %w", err)
	}
	got, err := s.r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("stream echo: %w", err)
	}
	if got != line {
		return fmt.Errorf("stream echo %q, want %q", got, line)
	}
	return nil
}

// Close closes the stream.
func (s *Stream) Close() error { return s.conn.Close() }

// MetricsText is podnet-routed's /metrics, whole (labelled series too).
func (n *Node) MetricsText() (string, error) {
	code, body, err := nettest.GetIn(n.NS.NetNS, "http://"+MetricsAddr+"/metrics")
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("%s: /metrics %d", n.Name, code)
	}
	return body, nil
}

// Metric is the value of the series name{labels} in /metrics text (labels
// as written there, e.g. `object="policy-table"`; "" for none), summed
// over series whose labels include them all; ok is false when no series
// matched.
func Metric(body, name string, labels ...string) (v float64, ok bool) {
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		// a label value may hold spaces: the series ends at its "}"
		cut := strings.IndexByte(line, ' ')
		if i := strings.IndexByte(line, '{'); i >= 0 && (cut < 0 || i < cut) {
			cut = strings.LastIndexByte(line, '}') + 1
		}
		if cut <= 0 || cut >= len(line) {
			continue
		}
		series, val := line[:cut], line[cut:]
		base, lbl, _ := strings.Cut(series, "{")
		if base != name {
			continue
		}
		have := strings.Split(strings.TrimSuffix(lbl, "}"), ",")
		all := true
		for _, l := range labels {
			if !containsStr(have, l) {
				all = false
				break
			}
		}
		if !all {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		v += f
		ok = true
	}
	return v, ok
}

func containsStr(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

// EnsureServiceAccount creates the namespace's "default" ServiceAccount,
// which the API server's ServiceAccount admission wants for every Pod (no
// kube-controller-manager here to make it).
func EnsureServiceAccount(ctx context.Context, client kubernetes.Interface, namespace string) error {
	_, err := client.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ServiceAccount %s/default: %w", namespace, err)
	}
	return nil
}
