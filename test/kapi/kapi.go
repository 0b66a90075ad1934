// Package kapi starts a real etcd and kube-apiserver on loopback for tests:
// the binaries come from scripts/ensure-kapi.sh (cached by version; the
// Makefile exports their directory as PODNET_KAPI_DIR), the certificates,
// service-account keys and static tokens are made here.
package kapi

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Token users the server knows.
const (
	AdminUser  = "admin"         // group system:masters
	RoutedUser = "podnet-routed" // no groups: only what RBAC grants it
)

// Server is a running etcd + kube-apiserver pair.
type Server struct {
	Dir        string
	BinDir     string
	Port       int
	etcdPort   int
	Tokens     map[string]string // user -> bearer token
	etcd, kas  *proc
	t          testing.TB // nil when made by New: Kubeconfig and Client panic instead
	ServerName string
	opts       Options
}

// Options configure New. Start fills them for a test.
type Options struct {
	// Dir holds the PKI, etcd's data and the logs (it must exist).
	Dir string
	// BinDir holds etcd and kube-apiserver (see BinDir and LookBinDir).
	BinDir string
	// ExtraIPs are added to the serving certificate.
	ExtraIPs []net.IP
	// BindAddress is kube-apiserver's --bind-address (default 127.0.0.1).
	BindAddress string
	// AdvertiseAddress is kube-apiserver's --advertise-address (default
	// 127.0.0.1; it should also be in ExtraIPs). An IPv6 one makes the
	// service range IPv6 too (fd00:10:96::/112, kubernetes service
	// fd00:10:96::1 in the certificate), as kube-apiserver wants the
	// advertised address and the primary service range of one family.
	AdvertiseAddress net.IP
	// Port is kube-apiserver's secure port (0: a free port).
	Port int
	// StartProcess starts etcd and kube-apiserver (default cmd.Start): a
	// caller can start them inside another network namespace.
	StartProcess func(cmd *exec.Cmd) error
	// Dial connects to the servers for the readiness checks and Client
	// (default: a plain dial, from the caller's network namespace).
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// BinDir returns the directory of the cached binaries or fails the test.
func BinDir(t testing.TB) string {
	t.Helper()
	dir, err := LookBinDir()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// LookBinDir returns $PODNET_KAPI_DIR after checking that it holds etcd and
// kube-apiserver.
func LookBinDir() (string, error) {
	dir := os.Getenv("PODNET_KAPI_DIR")
	if dir == "" {
		return "", fmt.Errorf("PODNET_KAPI_DIR is not set: run the tests with `make test` (it builds kube-apiserver and etcd once, see scripts/ensure-kapi.sh)")
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("%s missing in %s: %v", b, dir, err)
		}
	}
	return dir, nil
}

// Start brings up etcd and kube-apiserver (RBAC authorization) and stops
// them when the test ends. Extra serving-certificate IPs can be given (e.g.
// 10.0.2.2 for a QEMU guest).
func Start(t testing.TB, extraIPs ...net.IP) *Server {
	t.Helper()
	s, err := New(Options{Dir: t.TempDir(), BinDir: BinDir(t), ExtraIPs: extraIPs})
	if s != nil {
		t.Cleanup(s.Stop)
	}
	if err != nil {
		t.Fatal(err)
	}
	s.t = t
	return s
}

// New brings up etcd and kube-apiserver as Start does, for a program (no
// testing.TB): the caller stops them with Stop. On error the processes
// already started are stopped.
func New(o Options) (*Server, error) {
	if o.Dir == "" || o.BinDir == "" {
		return nil, fmt.Errorf("kapi.New: Dir and BinDir are required")
	}
	if o.BindAddress == "" {
		o.BindAddress = "127.0.0.1"
	}
	if o.AdvertiseAddress == nil {
		o.AdvertiseAddress = net.IPv4(127, 0, 0, 1)
	}
	if o.StartProcess == nil {
		o.StartProcess = (*exec.Cmd).Start
	}
	s := &Server{Dir: o.Dir, BinDir: o.BinDir, Tokens: map[string]string{}, Port: o.Port, opts: o}
	if err := s.makePKI(append([]net.IP{s.serviceIP()}, o.ExtraIPs...)); err != nil {
		return nil, err
	}
	// A port picked free here can be taken by another test process before
	// etcd or kube-apiserver binds it (kube-apiserver binds seconds after
	// its start): when a server exits because its port is in use, start
	// again on fresh ports.
	var err error
	for attempt := 1; ; attempt++ {
		if err = s.startOnFreePorts(o.Port == 0); err == nil {
			return s, nil
		}
		s.Stop()
		if !errors.Is(err, errPortInUse) || attempt == maxStartAttempts {
			return s, err
		}
	}
}

// maxStartAttempts bounds New's retries after a port race.
const maxStartAttempts = 4

// errPortInUse marks a server that exited because its port was taken.
var errPortInUse = errors.New("port already in use")

func (s *Server) startOnFreePorts(pickAPIPort bool) error {
	var err error
	if s.etcdPort, err = freePort(); err != nil {
		return err
	}
	if pickAPIPort {
		if s.Port, err = freePort(); err != nil {
			return err
		}
	}
	if err := s.startEtcd(); err != nil {
		return err
	}
	return s.StartAPIServer()
}

// serviceRange is --service-cluster-ip-range: of the advertised address's
// family.
func (s *Server) serviceRange() string {
	if s.opts.AdvertiseAddress.To4() == nil {
		return "fd00:10:96::/112"
	}
	return "10.96.0.0/24"
}

// serviceIP is the kubernetes service's address (the first of
// serviceRange), which the serving certificate names.
func (s *Server) serviceIP() net.IP {
	if s.opts.AdvertiseAddress.To4() == nil {
		return net.ParseIP("fd00:10:96::1")
	}
	return net.ParseIP("10.96.0.1")
}

// Pids are the process IDs of etcd and kube-apiserver (those running).
func (s *Server) Pids() []int {
	var out []int
	for _, p := range []*proc{s.etcd, s.kas} {
		if p != nil {
			out = append(out, p.cmd.Process.Pid)
		}
	}
	return out
}

// httpClient is for the readiness checks.
func (s *Server) httpClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DialContext: s.opts.Dial, DisableKeepAlives: true},
		Timeout:   2 * time.Second,
	}
}

// URL is the API server's address.
func (s *Server) URL() string { return fmt.Sprintf("https://127.0.0.1:%d", s.Port) }

func (s *Server) startEtcd() error {
	peer, err := freePort()
	if err != nil {
		return err
	}
	cmd := exec.Command(filepath.Join(s.BinDir, "etcd"),
		"--name=test", "--data-dir="+filepath.Join(s.Dir, "etcd-data"),
		fmt.Sprintf("--listen-client-urls=http://127.0.0.1:%d", s.etcdPort),
		fmt.Sprintf("--advertise-client-urls=http://127.0.0.1:%d", s.etcdPort),
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", peer),
		fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", peer),
		fmt.Sprintf("--initial-cluster=test=http://127.0.0.1:%d", peer),
		"--unsafe-no-fsync", "--log-level=warn")
	cmd.Env = cleanEnv()
	pr, err := s.startLogged(cmd, filepath.Join(s.Dir, "etcd.log"))
	if err != nil {
		return err
	}
	s.etcd = pr
	client := s.httpClient()
	return waitFor(30*time.Second, pr, func() error {
		resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/health", s.etcdPort))
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("etcd health %d", resp.StatusCode)
		}
		return nil
	}, "etcd (log: "+pr.logPath+")")
}

// StartAPIServer starts (or restarts) kube-apiserver and waits for /readyz.
func (s *Server) StartAPIServer() error {
	p := func(n string) string { return filepath.Join(s.Dir, "pki", n) }
	cmd := exec.Command(filepath.Join(s.BinDir, "kube-apiserver"),
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", s.etcdPort),
		"--bind-address="+s.opts.BindAddress, "--advertise-address="+s.opts.AdvertiseAddress.String(), "--secure-port="+strconv.Itoa(s.Port),
		"--tls-cert-file="+p("apiserver.crt"), "--tls-private-key-file="+p("apiserver.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+p("sa.pub"), "--service-account-signing-key-file="+p("sa.key"),
		"--service-cluster-ip-range="+s.serviceRange(), "--endpoint-reconciler-type=none",
		"--token-auth-file="+p("tokens.csv"), "--authorization-mode=RBAC", "--profiling=false", "--v=1")
	cmd.Env = cleanEnv()
	pr, err := s.startLogged(cmd, filepath.Join(s.Dir, "kube-apiserver.log"))
	if err != nil {
		return err
	}
	s.kas = pr
	client := s.httpClient()
	return waitFor(90*time.Second, pr, func() error {
		req, _ := http.NewRequest(http.MethodGet, s.URL()+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+s.Tokens[AdminUser])
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	}, "kube-apiserver (log: "+pr.logPath+")")
}

// StopAPIServer stops kube-apiserver only (etcd keeps the data).
func (s *Server) StopAPIServer() {
	stopCmd(s.kas)
	s.kas = nil
}

// Stop stops both processes.
func (s *Server) Stop() {
	stopCmd(s.kas)
	stopCmd(s.etcd)
	s.kas, s.etcd = nil, nil
}

// Kubeconfig writes a kubeconfig for user (AdminUser or RoutedUser) and
// returns its path. server overrides the address (e.g. for a VM guest).
func (s *Server) Kubeconfig(user, server string) string {
	path, err := s.WriteKubeconfig(user, server)
	if err != nil {
		s.fatal(err)
	}
	return path
}

// fatal fails the test of a Server made by Start, or panics.
func (s *Server) fatal(err error) {
	if s.t == nil {
		panic(err)
	}
	s.t.Helper()
	s.t.Fatal(err)
}

// WriteKubeconfig is Kubeconfig returning its error.
func (s *Server) WriteKubeconfig(user, server string) (string, error) {
	if server == "" {
		server = s.URL()
	}
	sum := sha256.Sum256([]byte(server))
	path := filepath.Join(s.Dir, user+"-"+hex.EncodeToString(sum[:4])+".kubeconfig")
	content := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: test
  context: {cluster: test, user: %s}
current-context: test
`, server, filepath.Join(s.Dir, "pki", "ca.crt"), user, s.Tokens[user], user)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return "", err
	}
	return path, nil
}

// Client returns an admin clientset.
func (s *Server) Client() kubernetes.Interface {
	cfg, err := s.AdminConfig()
	if err != nil {
		s.fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		s.fatal(err)
	}
	return c
}

// AdminConfig is the admin user's client config (dialing with
// Options.Dial when set).
func (s *Server) AdminConfig() (*rest.Config, error) {
	path, err := s.WriteKubeconfig(AdminUser, "")
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, err
	}
	cfg.Dial = s.opts.Dial
	return cfg, nil
}

// CACert is the path of the CA certificate.
func (s *Server) CACert() string { return filepath.Join(s.Dir, "pki", "ca.crt") }

func (s *Server) makePKI(extraIPs []net.IP) error {
	dir := filepath.Join(s.Dir, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "podnet-test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, _ := x509.ParseCertificate(caDER)
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "kube-apiserver"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: append([]net.IP{net.ParseIP("127.0.0.1")}, extraIPs...),
		DNSNames:    []string{"localhost", "kubernetes", "kubernetes.default"},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	saKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	srvKeyDER, _ := x509.MarshalECPrivateKey(srvKey)
	saPub, _ := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	files := map[string][]byte{
		"ca.crt":        pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		"apiserver.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}),
		"apiserver.key": pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: srvKeyDER}),
		"sa.key":        pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(saKey)}),
		"sa.pub":        pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: saPub}),
	}
	tokens := ""
	for _, u := range []string{AdminUser, RoutedUser} {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return err
		}
		s.Tokens[u] = hex.EncodeToString(b)
		groups := ""
		if u == AdminUser {
			groups = `,"system:masters"`
		}
		tokens += fmt.Sprintf("%s,%s,%s-uid%s\n", s.Tokens[u], u, u, groups)
	}
	files["tokens.csv"] = []byte(tokens)
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// cleanEnv drops ETCD_* variables (etcd reads them as flags).
func cleanEnv() []string {
	var env []string
	for _, e := range os.Environ() {
		if len(e) < 5 || e[:5] != "ETCD_" {
			env = append(env, e)
		}
	}
	return env
}

// proc is a started process and the channel closed when it exits.
type proc struct {
	cmd     *exec.Cmd
	done    chan struct{}
	logPath string
}

func (s *Server) startLogged(cmd *exec.Cmd, logPath string) (*proc, error) {
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = f, f
	if err := s.opts.StartProcess(cmd); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	p := &proc{cmd: cmd, done: make(chan struct{}), logPath: logPath}
	go func() { _ = cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

// stopCmd interrupts p and kills it if it has not exited within 10 s.
func stopCmd(p *proc) {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// waitFor polls check until it succeeds, the limit passes or p exits; an
// exit is reported with the end of p's log, and wraps errPortInUse when
// the log says its port was taken.
func waitFor(limit time.Duration, p *proc, check func() error, what string) error {
	deadline := time.Now().Add(limit)
	var err error
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			tail := logTail(p.logPath, 2048)
			exitErr := fmt.Errorf("%s exited before it was ready (%v): %s", what, p.cmd.ProcessState, tail)
			if strings.Contains(tail, "address already in use") {
				return fmt.Errorf("%w: %w", errPortInUse, exitErr)
			}
			return exitErr
		default:
		}
		if err = check(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s: %v; log ends: %s", what, limit, err, logTail(p.logPath, 2048))
}

// logTail returns the last n bytes of the file at path.
func logTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, io.SeekStart)
	}
	b, _ := io.ReadAll(f)
	return strings.TrimSpace(string(b))
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
