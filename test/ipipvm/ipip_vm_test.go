// Package ipipvm tests podnet's IPIP encapsulation for real. The host kernel
// has no ipip module, so the test boots Debian's stock kernel in QEMU (TCG)
// with an initramfs holding the podnet binaries and a test program
// (./guest). Inside the VM, three "node" network namespaces run
// podnet-routed --encap=ipip against a real kube-apiserver on the host,
// reached through QEMU user networking (10.0.2.2 is the host's loopback);
// pods made by the podnet plugin ping each other across nodes and the
// test requires tunl0's packet counters to move. One boot runs every
// scenario; see guest/main.go for the list.
package ipipvm

import (
	"bufio"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/podnet/podnet/test/ipipvm/vmconf"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

const (
	clusterCIDR = "10.244.0.0/16"
	// guestDeadline bounds the test program in the VM; vmTimeout the
	// whole QEMU run (boot included). A normal run takes 15-40 s.
	guestDeadline = 150 * time.Second
	vmTimeout     = 180 * time.Second
)

// vmNodes are the simulated nodes. node-c's pod takes its range from the
// node.json podnet-routed writes ("usePodCidr"), and node-c is deleted
// through the API server at the end.
var vmNodes = []vmconf.Node{
	{Name: "node-a", UnderlayIP: "192.168.50.1", PodCIDR: "10.244.1.0/24", MgmtMAC: "52:54:00:50:00:01"},
	{Name: "node-b", UnderlayIP: "192.168.50.2", PodCIDR: "10.244.2.0/24", MgmtMAC: "52:54:00:50:00:02"},
	{Name: "node-c", UnderlayIP: "192.168.50.3", PodCIDR: "10.244.3.0/24", MgmtMAC: "52:54:00:50:00:03", UsePodCIDR: true},
}

func TestIPIPAcrossNodesInVM(t *testing.T) {
	start := time.Now()
	root := nettest.RepoRoot(t)
	bins := nettest.BinDir(t, "podnet", "podnet-ipam", "podnet-routed")
	for _, b := range []string{"podnet", "podnet-ipam", "podnet-routed"} {
		requireStatic(t, filepath.Join(bins, b))
	}
	kernelDir := ensureKernel(t, root)
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Fatalf("qemu-system-x86_64 not found (%v): the IPIP test needs it because this kernel has no ipip module; "+
			"install it with `apt-get install --no-install-recommends qemu-system-x86 busybox-static cpio` "+
			"(scripts/ipipvm/ensure-kernel.sh does that when run as root)", err)
	}
	prepared := time.Now()

	s := kapi.Start(t, net.ParseIP(vmconf.APIServerHostIP))
	client := s.Client()
	ca, err := os.ReadFile(s.CACert())
	if err != nil {
		t.Fatal(err)
	}
	guestURL := fmt.Sprintf("https://%s:%d", vmconf.APIServerHostIP, s.Port)
	token := routedToken(t, s, client, root)
	createNodes(t, client)
	apiReady := time.Now()

	work := t.TempDir()
	cfg := vmconf.Config{
		APIServer:       guestURL,
		CAPEM:           string(ca),
		AdminToken:      s.Tokens[kapi.AdminUser],
		ClusterCIDR:     clusterCIDR,
		UnderlayBits:    24,
		Nodes:           vmNodes,
		DeleteNode:      "node-c",
		DeadlineSeconds: int(guestDeadline / time.Second),
	}
	cfgPath := filepath.Join(work, "config.json")
	writeJSON(t, cfgPath, cfg)
	kubeconfig := filepath.Join(work, "routed.kubeconfig")
	writeKubeconfig(t, kubeconfig, guestURL, ca, token)
	guest := buildGuest(t, root, work)
	initrd := filepath.Join(work, "initrd.img")
	run(t, root, filepath.Join(root, "scripts/ipipvm/mkinitramfs.sh"), kernelDir, initrd,
		guest+":"+strings.TrimPrefix(vmconf.GuestPath, "/"),
		filepath.Join(bins, "podnet")+":"+strings.TrimPrefix(vmconf.BinDir, "/")+"/podnet",
		filepath.Join(bins, "podnet-ipam")+":"+strings.TrimPrefix(vmconf.BinDir, "/")+"/podnet-ipam",
		filepath.Join(bins, "podnet-routed")+":"+strings.TrimPrefix(vmconf.BinDir, "/")+"/podnet-routed",
		cfgPath+":"+strings.TrimPrefix(vmconf.ConfigPath, "/"),
		kubeconfig+":"+strings.TrimPrefix(vmconf.KubeconfigPath, "/"),
	)
	built := time.Now()

	vm := boot(t, qemu, kernelDir, initrd, filepath.Join(work, "console.log"))
	for _, l := range vm.lines {
		if strings.HasPrefix(l, "ipipvm") || strings.HasPrefix(l, "PODNET-IPIP") {
			t.Log(l)
		}
	}
	if vm.verdict != vmconf.PassMarker {
		t.Fatalf("IPIP VM test failed: %s\n\nfull VM console:\n%s", vm.verdict, strings.Join(vm.lines, "\n"))
	}

	// The VM deleted node-c through the API server: this proves it talked
	// to this server, not to anything else.
	if _, err := client.CoreV1().Nodes().Get(context.Background(), "node-c", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("node-c should have been deleted from inside the VM, Get says: %v", err)
	}
	t.Logf("timings: kernel/tools %s, API server + Nodes %s, guest build + initramfs %s, VM %s (userspace at %s, marker at %s), total %s",
		prepared.Sub(start).Round(time.Millisecond), apiReady.Sub(prepared).Round(time.Millisecond),
		built.Sub(apiReady).Round(time.Millisecond), vm.total.Round(time.Millisecond),
		vm.userspace.Round(time.Millisecond), vm.marker.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// requireStatic fails when path is dynamically linked: the initramfs has
// no libc.
func requireStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("%s is dynamically linked; build it with `make` (CGO_ENABLED=0)", path)
		}
	}
}

// ensureKernel runs scripts/ipipvm/ensure-kernel.sh (which also installs
// qemu, busybox-static and cpio when missing) and returns the kernel dir.
func ensureKernel(t *testing.T, root string) string {
	t.Helper()
	out := run(t, root, filepath.Join(root, "scripts/ipipvm/ensure-kernel.sh"))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	dir := lines[len(lines)-1]
	if _, err := os.Stat(filepath.Join(dir, "vmlinux")); err != nil {
		t.Fatalf("ensure-kernel.sh printed %q: %v", dir, err)
	}
	return dir
}

// run runs a command in dir and returns its stdout; it fails the test with
// stderr on error.
func run(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// routedToken applies the RBAC podnet ships (conf/podnet-routed-rbac.yaml)
// and returns a token of its ServiceAccount: podnet-routed in the VM runs
// with exactly the permissions a real deployment grants it.
func routedToken(t *testing.T, s *kapi.Server, client kubernetes.Interface, root string) string {
	t.Helper()
	ctx := context.Background()
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "conf/podnet-routed-rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var sa *corev1.ServiceAccount
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(data), -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
		if err != nil {
			t.Fatalf("conf/podnet-routed-rbac.yaml: %v", err)
		}
		switch o := obj.(type) {
		case *rbacv1.ClusterRole:
			_, err = client.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = client.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *corev1.ServiceAccount:
			sa = o
			_, err = client.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("conf/podnet-routed-rbac.yaml: unexpected %T", obj)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if sa == nil {
		t.Fatal("conf/podnet-routed-rbac.yaml has no ServiceAccount")
	}
	exp := int64(3600)
	tr, err := client.CoreV1().ServiceAccounts(sa.Namespace).CreateToken(ctx, sa.Name,
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token for %s/%s: %v", sa.Namespace, sa.Name, err)
	}
	// Fail here, with a clear message, rather than in the VM if the
	// shipped RBAC does not let podnet-routed list Nodes.
	rc, err := kubernetes.NewForConfig(&rest.Config{Host: s.URL(), BearerToken: tr.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAFile: s.CACert()}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rc.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("podnet-routed's ServiceAccount cannot list Nodes with conf/podnet-routed-rbac.yaml: %v", err)
	}
	return tr.Status.Token
}

// createNodes creates the Nodes with their PodCIDR and InternalIP, as the
// node controller and the kubelet would.
func createNodes(t *testing.T, client kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	for _, n := range vmNodes {
		node := &corev1.Node{
			ObjectMeta: metav1.ObjectMeta{Name: n.Name},
			Spec:       corev1.NodeSpec{PodCIDR: n.PodCIDR, PodCIDRs: []string{n.PodCIDR}},
		}
		created, err := client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Status.Addresses = []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: n.UnderlayIP},
			{Type: corev1.NodeHostName, Address: n.Name},
		}
		if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// writeKubeconfig writes podnet-routed's kubeconfig for the VM: the API
// server at its guest-side address, the CA inline (no host paths in the VM).
func writeKubeconfig(t *testing.T, path, server string, ca []byte, token string) {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["vm"] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: ca}
	cfg.AuthInfos["podnet-routed"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["vm"] = &clientcmdapi.Context{Cluster: "vm", AuthInfo: "podnet-routed"}
	cfg.CurrentContext = "vm"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
}

// buildGuest builds the in-VM test program, static.
func buildGuest(t *testing.T, root, work string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(work, "guest")
	cmd := exec.Command(goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", out, "./test/ipipvm/guest")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the guest program: %v\n%s", err, b)
	}
	return out
}

// vmRun is what one boot produced.
type vmRun struct {
	lines   []string // console, without carriage returns and terminal escapes
	verdict string   // PassMarker, or the failure reason
	// since QEMU started: first userspace line, marker, exit
	userspace, marker, total time.Duration
}

var ansiEscape = regexp.MustCompile(`\x1b\[[0-9;?]*[a-zA-Z]|\x1bc`)

// boot runs QEMU with one user-networking NIC per node until the guest
// powers off, and reads the console for the markers.
func boot(t *testing.T, qemu, kernelDir, initrd, logPath string) vmRun {
	t.Helper()
	args := []string{
		"-accel", "tcg", "-m", "1024", "-smp", "1",
		"-nodefaults", "-nographic", "-serial", "stdio", "-no-reboot",
		"-kernel", filepath.Join(kernelDir, "vmlinux"), "-initrd", initrd,
		"-append", "console=ttyS0 quiet panic=-1",
	}
	for i, n := range vmNodes {
		// romfile= skips the iPXE option ROM: nothing boots from the network.
		args = append(args,
			"-netdev", fmt.Sprintf("user,id=mgmt%d", i),
			"-device", fmt.Sprintf("e1000,netdev=mgmt%d,mac=%s,romfile=", i, n.MgmtMAC))
	}
	ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, args...)
	cmd.WaitDelay = 5 * time.Second
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", qemu, err)
	}
	var vm vmRun
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := ansiEscape.ReplaceAllString(strings.TrimRight(sc.Text(), "\r"), "")
			fmt.Fprintln(logFile, line)
			mu.Lock()
			vm.lines = append(vm.lines, line)
			switch {
			case vm.userspace == 0 && strings.Contains(line, "ipipvm-init: kernel"): // may follow firmware text on the line
				vm.userspace = time.Since(start)
			case line == vmconf.PassMarker:
				vm.verdict, vm.marker = line, time.Since(start)
			case strings.HasPrefix(line, vmconf.FailMarker) && vm.verdict == "":
				vm.verdict, vm.marker = line, time.Since(start)
			}
			mu.Unlock()
		}
	}()
	<-done
	err = cmd.Wait()
	vm.total = time.Since(start)
	if vm.verdict == "" {
		switch {
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			vm.verdict = fmt.Sprintf("no marker: QEMU killed after %s", vmTimeout)
		case err != nil:
			vm.verdict = fmt.Sprintf("no marker: QEMU: %v", err)
		default:
			vm.verdict = "no marker: the VM powered off without the guest printing its result (crash?)"
		}
	}
	return vm
}
