package ship

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

// TestUnprivilegedRoutedAfterPrepareNode checks the DaemonSet's privilege
// split on a node netns. podnet-routed runs the way its container does: uid
// 0 with only CAP_NET_ADMIN, no_new_privs, /proc/sys read-only. On its own
// it cannot set its sysctls: it warns, counts them and goes on (routes,
// node.json, ready). After `podnet-install prepare-node` has run like its
// init container (CAP_NET_ADMIN, the node's /proc/sys/net writable at
// another path), the same podnet-routed finds nothing left to write,
// becomes ready and programs its routes. The credentials are the
// podnet-routed ClusterRole of conf/k8s/podnet.yaml, bound to a token
// user.
func TestUnprivilegedRoutedAfterPrepareNode(t *testing.T) {
	bin := nettest.BinDir(t, "podnet-routed", "podnet-install")
	for _, tool := range []string{"nsenter", "unshare", "setpriv", "mount"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found (util-linux): %v", tool, err)
		}
	}
	s := kapi.Start(t)
	client := s.Client()
	bindManifestRole(t, client)
	createNode(t, client, "ship-n1", "10.78.0.1", "10.244.1.0/24")
	createNode(t, client, "ship-n2", "10.78.0.2", "10.244.2.0/24")

	// IPIP is not in every kernel (test/ipipvm covers it in a VM); VXLAN
	// and direct routing are.
	for _, c := range []struct {
		encap, routeDev string
	}{{"vxlan", "podnet.vxlan"}, {"none", "eth0"}} {
		t.Run(c.encap, func(t *testing.T) {
			node := nettest.NewNetNS(t)
			dir := t.TempDir()
			if err := node.Do(func(ns.NetNS) error {
				lo, err := netlink.LinkByName("lo")
				if err != nil {
					return err
				}
				if err := netlink.LinkSetUp(lo); err != nil {
					return err
				}
				// The underlay: a veth with the node's InternalIP (the
				// kernel may lack the dummy driver).
				if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0", MTU: 1500}, PeerName: "eth0-peer"}); err != nil {
					return err
				}
				eth, err := netlink.LinkByName("eth0")
				if err != nil {
					return err
				}
				if peer, err := netlink.LinkByName("eth0-peer"); err != nil || netlink.LinkSetUp(peer) != nil {
					return fmt.Errorf("eth0-peer: %v", err)
				}
				a, _ := netlink.ParseAddr("10.78.0.1/24")
				if err := netlink.AddrAdd(eth, a); err != nil {
					return err
				}
				if err := netlink.LinkSetUp(eth); err != nil {
					return err
				}
				// What a node may well have: no forwarding, strict rp_filter
				// for new devices. podnet-routed wants otherwise.
				for k, v := range map[string]string{"net/ipv4/ip_forward": "0", "net/ipv4/conf/default/rp_filter": "1"} {
					if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			proxy := startProxy(t, node, fmt.Sprintf("127.0.0.1:%d", s.Port))
			kubeconfig := s.Kubeconfig(kapi.RoutedUser, "https://"+proxy)
			stateDir := filepath.Join(dir, "run-podnet")
			hostProcSys := filepath.Join(dir, "host/proc/sys")
			routedArgs := []string{filepath.Join(bin, "podnet-routed"), "--kubeconfig=" + kubeconfig, "--node-name=ship-n1",
				"--encap=" + c.encap, "--cluster-cidr=10.244.0.0/16", "--state-dir=" + stateDir,
				"--ipam-data-dir=" + filepath.Join(dir, "ipam"), "--cri-socket=", "--health-addr=127.0.0.1:19099", "--metrics-addr=", "--resync-interval=1s"}

			// 1. podnet-routed alone: /proc/sys is read-only. It cannot set
			// its sysctls: it says so, counts them, and goes on (routes,
			// node.json, ready); prepare-node is what sets them.
			r := startRestricted(t, node, "", routedArgs...)
			if !r.waitLog(20*time.Second, "read-only file system") {
				t.Fatalf("podnet-routed without prepare-node did not hit the read-only /proc/sys:\n%s", r.output())
			}
			deadline := time.Now().Add(30 * time.Second)
			for readyz(t, node) != 200 {
				if time.Now().After(deadline) {
					t.Fatalf("podnet-routed not ready with sysctls it cannot set:\n%s", r.output())
				}
				time.Sleep(200 * time.Millisecond)
			}
			if st, err := nodestate.Read(stateDir); err != nil || len(st.PodCIDRs) != 1 || st.PodCIDRs[0] != "10.244.1.0/24" {
				t.Errorf("node.json without prepare-node: %+v %v", st, err)
			}
			if _, body, err := nettest.GetIn(node, "http://127.0.0.1:19099/metrics"); err != nil || !strings.Contains(body, `podnet_sysctl_errors_total{name="net.ipv4.ip_forward"}`) {
				t.Errorf("podnet_sysctl_errors_total for net.ipv4.ip_forward not in /metrics (%v)", err)
			}
			if got, err := nettest.ReadSysctl(node, "net/ipv4/ip_forward"); err != nil || got != "0" {
				t.Errorf("ip_forward %q (%v) under a read-only /proc/sys, want it untouched (0)", got, err)
			}
			r.stop()
			if err := os.Remove(nodestate.Path(stateDir)); err != nil {
				t.Fatal(err)
			}
			// A first boot: prepare-node finds no tunnel device yet.
			if err := node.Do(func(ns.NetNS) error {
				if l, err := netlink.LinkByName("podnet.vxlan"); err == nil {
					return netlink.LinkDel(l)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}

			// 2. prepare-node, as its init container runs.
			p := startRestricted(t, node, hostProcSys, filepath.Join(bin, "podnet-install"), "prepare-node",
				"--kubeconfig="+kubeconfig, "--node-name=ship-n1", "--encap="+c.encap,
				"--cluster-cidr=10.244.0.0/16", "--mtu=0", "--proc-sys="+hostProcSys)
			if err := p.wait(30 * time.Second); err != nil {
				t.Fatalf("prepare-node: %v\n%s", err, p.output())
			}
			t.Logf("prepare-node:\n%s", p.output())
			want := map[string]string{"net/ipv4/ip_forward": "1"}
			if c.encap == "vxlan" {
				want["net/ipv4/conf/podnet.vxlan/rp_filter"] = "2"
				want["net/ipv6/conf/podnet.vxlan/accept_ra"] = "0"
				want["net/ipv6/conf/podnet.vxlan/autoconf"] = "0"
			}
			for k, v := range want {
				if got, err := nettest.ReadSysctl(node, k); err != nil || got != v {
					t.Errorf("after prepare-node %s=%q (%v), want %s", k, got, err, v)
				}
			}

			// 3. podnet-routed again, same restrictions: ready, routes in.
			r = startRestricted(t, node, "", routedArgs...)
			deadline = time.Now().Add(30 * time.Second)
			for readyz(t, node) != 200 {
				if time.Now().After(deadline) {
					t.Fatalf("podnet-routed not ready after prepare-node:\n%s", r.output())
				}
				time.Sleep(200 * time.Millisecond)
			}
			if strings.Contains(r.output(), "read-only") {
				t.Errorf("podnet-routed still hit the read-only /proc/sys:\n%s", r.output())
			}
			st, err := nodestate.Read(stateDir)
			if err != nil || len(st.PodCIDRs) != 1 || st.PodCIDRs[0] != "10.244.1.0/24" {
				t.Errorf("node.json %+v %v", st, err)
			}
			var routes []string
			if err := node.Do(func(ns.NetNS) error {
				rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: 77}, netlink.RT_FILTER_PROTOCOL)
				for _, rt := range rs {
					l, _ := netlink.LinkByIndex(rt.LinkIndex)
					if rt.Dst != nil && l != nil {
						routes = append(routes, rt.Dst.String()+" dev "+l.Attrs().Name)
					}
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if !containsStr(routes, "10.244.2.0/24 dev "+c.routeDev) {
				t.Errorf("podnet routes %v, want 10.244.2.0/24 dev %s", routes, c.routeDev)
			}
			r.stop()
		})
	}
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// bindManifestRole creates the ClusterRole of conf/k8s/podnet.yaml and
// binds it to the test's token user podnet-routed.
func bindManifestRole(t *testing.T, client kubernetes.Interface) {
	t.Helper()
	var role rbacv1.ClusterRole
	for _, o := range readObjects(t, filepath.Join(repo(t), manifestPath)) {
		if o.GetKind() == "ClusterRole" {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role); err != nil {
				t.Fatal(err)
			}
		}
	}
	ctx := context.Background()
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, &role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "ship-podnet-routed"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: kapi.RoutedUser}},
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func createNode(t *testing.T, client kubernetes.Interface, name, ip, cidr string) {
	t.Helper()
	if err := cluster.CreateNode(context.Background(), client, name, ip, cidr); err != nil {
		t.Fatal(err)
	}
}

// restricted is a process started in the node netns the way the
// DaemonSet's containers run: its own mount namespace with /proc/sys
// read-only (optionally the netns' /proc/sys/net bound read-write at
// hostProcSys/net, like prepare-node's hostPath mount), and only
// CAP_NET_ADMIN left (bounding set, no_new_privs), as uid 0.
type restricted struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	buf  bytes.Buffer
	done chan error
}

func startRestricted(t *testing.T, node ns.NetNS, hostProcSys string, argv ...string) *restricted {
	t.Helper()
	script := `set -e
if [ -n "$HOST_PROC_SYS" ]; then mkdir -p "$HOST_PROC_SYS/net"; mount --bind /proc/sys/net "$HOST_PROC_SYS/net"; fi
mount --bind /proc/sys /proc/sys
mount -o remount,bind,ro /proc/sys
exec setpriv --bounding-set -all,+net_admin --inh-caps -all --no-new-privs -- "$@"`
	args := append([]string{"--net=" + node.Path(), "--", "unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh"}, argv...)
	r := &restricted{cmd: exec.Command("nsenter", args...), done: make(chan error, 1)}
	r.cmd.Env = append(os.Environ(), "HOST_PROC_SYS="+hostProcSys)
	pr, pw := io.Pipe()
	r.cmd.Stdout, r.cmd.Stderr = pw, pw
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			r.mu.Lock()
			r.buf.WriteString(sc.Text() + "\n")
			r.mu.Unlock()
		}
	}()
	go func() { err := r.cmd.Wait(); pw.Close(); r.done <- err }()
	t.Cleanup(r.stop)
	return r
}

func (r *restricted) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.buf.String()
}

func (r *restricted) waitLog(limit time.Duration, s string) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if strings.Contains(r.output(), s) {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

func (r *restricted) wait(limit time.Duration) error {
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(limit):
		r.stop()
		return fmt.Errorf("still running after %s", limit)
	}
}

func (r *restricted) stop() {
	if r.cmd.Process == nil {
		return
	}
	select {
	case err := <-r.done:
		r.done <- err
		return
	default:
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-r.done:
		r.done <- err
	case <-time.After(10 * time.Second):
		_ = r.cmd.Process.Kill()
		r.done <- <-r.done
	}
}

// readyz asks podnet-routed's /readyz inside the node netns and returns
// the HTTP status (0 when it does not answer).
func readyz(t *testing.T, node ns.NetNS) int {
	t.Helper()
	code, _, err := nettest.GetIn(node, "http://127.0.0.1:19099/readyz")
	if err != nil {
		return 0
	}
	return code
}

// startProxy listens on the node netns' loopback and forwards each
// connection to target on the test's own loopback (where kube-apiserver
// listens). It returns the address inside the netns.
func startProxy(t *testing.T, node ns.NetNS, target string) string {
	t.Helper()
	return nettest.Forward(t, node, "127.0.0.1:0", target, nil).Addr()
}
