// Command podnet-demo is `make demo`: it brings up a podnet cluster in
// network namespaces on this machine (test/cluster: a real kube-apiserver
// + etcd, N nodes running podnet-routed, pods attached through libcni with
// conf/10-podnet.conflist, an outside host), prints what happened — nodes
// with PodCIDRs, pods with IPs, each node's podnet routes, a pod-to-pod
// connectivity matrix, TCP source checks, for each address family of the
// cluster (-family ipv4, dual or ipv6) — and tears it all down, checking
// that the machine's netns is as before (`ip netns`, `ip link`, nft
// ruleset). With -keep the cluster stays up until `podnet-demo -down`
// (`make demo-down`).
//
// It exits 0 when every check passed, 1 when one failed, 2 on a usage or
// set-up error, and 3 when IPIP was asked for on a kernel without it (the
// Makefile then runs the IPIP end-to-end test in a QEMU VM instead).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/kapi"
)

const exitNoIPIP = 3

// podCIDR6 is the IPv6 cluster CIDR of FAMILY=dual and ipv6, as
// scripts/k8s's (a ULA range: its egress is masqueraded).
const podCIDR6 = "fd00:10:244::/56"

func main() {
	os.Exit(run())
}

type options struct {
	mode      string
	family    string
	nodes     int
	pods      int
	keep      bool
	down      bool
	name      string
	workDir   string
	repo      string
	bin       string
	hasIPIP   bool
	crossSubn bool
}

func run() int {
	var o options
	flag.StringVar(&o.mode, "mode", os.Getenv("MODE"), "encapsulation: auto (ipip when this kernel has it loaded, else vxlan), none, vxlan or ipip (env MODE)")
	flag.StringVar(&o.family, "family", os.Getenv("FAMILY"), "address family: ipv4 (default), dual (IPv4 and IPv6: both InternalIPs, both PodCIDRs, every pod both) or ipv6 (IPv6 only, underlay and API server included) (env FAMILY)")
	flag.IntVar(&o.nodes, "nodes", envInt("NODES", 3), "number of nodes (env NODES)")
	flag.IntVar(&o.pods, "pods", 2, "pods per node")
	flag.BoolVar(&o.keep, "keep", envBool("KEEP"), "leave the cluster up (env KEEP=1); remove it with -down")
	flag.BoolVar(&o.down, "down", false, "remove a cluster left up with -keep, then exit")
	flag.BoolVar(&o.crossSubn, "cross-subnet", false, "nodes on two underlay subnets joined by a router (podnet-routed --cross-subnet; not with -mode=none)")
	flag.StringVar(&o.name, "name", "podnet-demo", "prefix of every netns")
	flag.StringVar(&o.workDir, "workdir", "", "state directory (default /run/<name>)")
	flag.StringVar(&o.repo, "repo", "", "repository root (default: found from the working directory)")
	flag.StringVar(&o.bin, "bin", "", "directory of the podnet binaries (default <repo>/bin)")
	flag.BoolVar(&o.hasIPIP, "has-ipip", false, "exit 0 if the demo can use IPIP on this kernel, 1 if not")
	flag.Parse()
	if o.workDir == "" {
		o.workDir = filepath.Join("/run", o.name)
	}
	if o.hasIPIP {
		if ipipLoaded() {
			return 0
		}
		return 1
	}
	if o.down {
		return down(o)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "podnet-demo needs root (it creates network namespaces)")
		return 2
	}
	return demo(o)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func envBool(name string) bool {
	v := strings.ToLower(os.Getenv(name))
	return v == "1" || v == "true" || v == "yes"
}

// ipipLoaded says whether the ipip module is loaded. A module that is only
// loadable is not used: loading it would add tunl0 to every netns,
// including the machine's own, which the demo promises to leave as it was.
func ipipLoaded() bool {
	_, err := os.Stat("/sys/module/ipip")
	return err == nil
}

func down(o options) int {
	removed, err := cluster.DownDir(o.workDir, o.name)
	for _, r := range removed {
		fmt.Println("removed", r)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "podnet-demo -down:", err)
		return 1
	}
	if len(removed) == 0 {
		fmt.Printf("no demo cluster up (%s)\n", o.workDir)
	}
	return 0
}

// printer prints lines with the time since the start.
type printer struct {
	start  time.Time
	w      io.Writer
	failed bool // a check failed
}

func (p *printer) step(format string, args ...any) {
	fmt.Fprintf(p.w, "[%5.1fs] %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
}

func (p *printer) section(title string) { fmt.Fprintf(p.w, "\n%s\n", title) }

func demo(o options) int {
	p := &printer{start: time.Now(), w: os.Stdout}
	repo, err := repoRoot(o.repo)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if o.bin == "" {
		o.bin = filepath.Join(repo, "bin")
	}
	for _, b := range []string{"podnet", "podnet-ipam", "podnet-routed"} {
		if _, err := os.Stat(filepath.Join(o.bin, b)); err != nil {
			fmt.Fprintf(os.Stderr, "%s not built (run `make`): %v\n", b, err)
			return 2
		}
	}
	kapiDir, err := kapi.LookBinDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}

	var clusterCIDR, clusterCIDR6 string
	switch o.family {
	case "", "ipv4":
		o.family = "ipv4"
	case "dual":
		clusterCIDR6 = podCIDR6
	case "ipv6":
		clusterCIDR = podCIDR6
	default:
		fmt.Fprintf(os.Stderr, "FAMILY=%q: want ipv4, dual or ipv6\n", o.family)
		return 2
	}
	if o.crossSubn && o.family != "ipv4" {
		fmt.Fprintf(os.Stderr, "-cross-subnet is IPv4 only (the router netns joining the two underlay subnets has no IPv6): not with FAMILY=%s\n", o.family)
		return 2
	}

	mode, why := o.mode, ""
	switch mode {
	case "", "auto":
		if o.family == "ipv6" {
			mode, why = "vxlan", "auto: IPIP carries IPv4 only"
		} else if ipipLoaded() {
			mode, why = "ipip", "auto: this kernel has IPIP"
		} else {
			mode, why = "vxlan", "auto: this kernel has no IPIP; `make demo MODE=ipip` shows IPIP in a QEMU VM"
		}
	case "ipip":
		if o.family == "ipv6" {
			fmt.Fprintln(os.Stderr, "MODE=ipip: IPIP carries IPv4 only; an IPv6-only cluster runs MODE=vxlan (over the IPv6 underlay) or MODE=none")
			return 2
		}
		if !ipipLoaded() {
			fmt.Println("MODE=ipip: this kernel has no ipip module loaded (and loading one would add tunl0 to the machine's own netns).")
			fmt.Println("IPIP is shown in a QEMU VM instead: `make ipipvm` (test/ipipvm) boots Debian's kernel with the podnet")
			fmt.Println("binaries and runs podnet-routed --encap=ipip in three node netns against a real kube-apiserver.")
			return exitNoIPIP
		}
	case "none", "vxlan":
	default:
		fmt.Fprintf(os.Stderr, "MODE=%q: want auto, none, vxlan or ipip\n", mode)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	_, err = os.Stat(filepath.Join(o.workDir, cluster.StateFile))
	if left, _ := cluster.NetNSNames(o.name + "-"); err == nil || len(left) > 0 {
		p.step("a demo left up (KEEP=1, or interrupted) is still there: removing it first")
		if code := down(o); code != 0 {
			return code
		}
	}
	before, err := cluster.TakeHostState(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "reading this machine's netns state:", err)
		return 2
	}

	fmt.Printf("podnet demo: %d nodes, FAMILY=%s, --encap=%s", o.nodes, o.family, mode)
	if why != "" {
		fmt.Printf(" (%s)", why)
	}
	fmt.Println()
	fmt.Printf("everything lives in network namespaces named %s-*; this machine's own netns is not touched\n\n", o.name)

	cfg := cluster.Config{
		Name: o.name, WorkDir: o.workDir, RepoRoot: repo, BinDir: o.bin, KapiDir: kapiDir,
		Encap: mode, CrossSubnet: o.crossSubn, Nodes: o.nodes, Detach: o.keep,
		ClusterCIDR: clusterCIDR, ClusterCIDR6: clusterCIDR6,
		Logf: p.step,
	}
	p.step("starting etcd + kube-apiserver, the underlay bridge and %d nodes", o.nodes)
	c, err := cluster.Up(ctx, cfg)
	if err != nil && ctx.Err() != nil {
		fmt.Println("podnet demo: interrupted; everything removed")
		return 130
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bringing the cluster up:", err)
		return 2
	}
	ok := true
	if err := show(ctx, p, c, o); err != nil {
		fmt.Println("  ✗", err)
		ok = false
	}
	if p.failed {
		ok = false
	}

	if o.keep {
		p.section("LEFT UP (KEEP=1)")
		fmt.Printf("  netns:     ip netns | grep %s-\n", o.name)
		fmt.Printf("  a node:    ip netns exec %s-node1 ip route\n", o.name)
		last := c.Pods()[len(c.Pods())-1]
		fmt.Printf("  a pod:     ip netns exec %s-pod-%s ping %s\n", o.name, c.Pods()[0].Name, last.IP)
		if last.IP6.IsValid() {
			fmt.Printf("             ip netns exec %s-pod-%s ping %s\n", o.name, c.Pods()[0].Name, last.IP6)
		}
		fmt.Printf("  logs:      %s/<node>/podnet-routed.log, %s/kapi/\n", o.workDir, o.workDir)
		n1 := c.Nodes[0]
		leak := o.name + "-leak"
		fmt.Printf("  a leak:    ip netns add %s   # attach a pod by hand, then delete its netns without DEL:\n", leak)
		fmt.Printf("             ip netns exec %s env NETCONFPATH=%s CNI_PATH=%s \"$(scripts/install-cni-tools.sh)/cnitool\" add podnet /run/netns/%s\n", n1.NS.Name, n1.Dir, o.bin, leak)
		fmt.Printf("             ip netns del %s   # within 3 min (grace 2 min + interval 1 min) %s's podnet-routed logs \"leak reclaimed\"\n", leak, n1.Name)
		fmt.Printf("  remove it: make demo-down\n")
	} else {
		p.section("TEARDOWN")
		start := time.Now()
		if err := c.Down(); err != nil {
			fmt.Println("  ✗ teardown:", err)
			ok = false
		}
		after, err := cluster.TakeHostState(context.Background())
		if err != nil {
			fmt.Println("  ✗ reading this machine's netns state:", err)
			ok = false
		}
		d := before.Diff(after, o.name+"-")
		if d == "" && err == nil {
			fmt.Printf("  ✓ removed in %s; this machine is as before: `ip netns`, `ip link` and %s are identical\n", time.Since(start).Round(time.Millisecond), after.NFTSource)
			if before.Diff(after, "") != "" {
				fmt.Println("    (other programs' netns came or went meanwhile; none of them is the demo's)")
			}
		} else {
			fmt.Printf("  ✗ this machine changed (- before, + after):\n%s", d)
			ok = false
		}
	}
	fmt.Println()
	if ctx.Err() != nil {
		fmt.Println("podnet demo: interrupted")
		return 130
	}
	if ok {
		fmt.Printf("podnet demo: every check passed in %s\n", time.Since(p.start).Round(100*time.Millisecond))
		return 0
	}
	fmt.Printf("podnet demo: SOME CHECKS FAILED (%s)\n", time.Since(p.start).Round(100*time.Millisecond))
	return 1
}

// show creates the pods and prints the picture; failed checks set p.failed.
func show(ctx context.Context, p *printer, c *cluster.Cluster, o options) error {
	for _, n := range c.Nodes {
		for range o.pods {
			if _, err := n.AddPod(ctx, ""); err != nil {
				return err
			}
		}
	}
	ranges := map[string]string{"ipv4": "usePodCidr", "dual": "usePodCidr + usePodCidrIPv6", "ipv6": "usePodCidrIPv6"}[o.family]
	p.step("%d pods attached through libcni with conf/10-podnet.conflist (podnet + podnet-ipam, %s)", len(c.Pods()), ranges)

	p.section("UNDERLAY (bridges in netns " + c.Underlay.Name + ")")
	tw := tabwriter.NewWriter(os.Stdout, 2, 8, 2, ' ', 0)
	if c.Router != nil {
		fmt.Fprintf(tw, "  router\t%s, %s\t%s\t(joins the two subnets; knows no pod route)\n", cluster.RouterIP(0), cluster.RouterIP(1), c.Router.Name)
	}
	fmt.Fprintf(tw, "  kube-apiserver + etcd\t%s\t%s\t(podnet-routed on every node watches Nodes here)\n", c.APIServerAddr(), c.CP.Name)
	fmt.Fprintf(tw, "  outside host\t%s\t%s\t(not in the cluster: no route to the pods)\n", join(c.OutsideIPs()), c.Outside.Name)
	tw.Flush()
	fmt.Printf("  subnets: %v\n", c.UnderlaySubnets())

	cidrs := c.Cfg.ClusterCIDR
	if c.Cfg.ClusterCIDR6 != "" {
		cidrs += "," + c.Cfg.ClusterCIDR6
	}
	p.section("NODES (Node objects: spec.podCIDRs carved from the cluster CIDR " + cidrs + " like kube-controller-manager, status InternalIP)")
	tw = tabwriter.NewWriter(os.Stdout, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  NAME\tINTERNAL-IP\tPOD-CIDR\tPOD MTU\tNETNS")
	for _, n := range c.Nodes {
		mtu := "?"
		if st, err := n.State(); err == nil {
			mtu = strconv.Itoa(st.MTU)
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", n.Name, join([]netip.Addr{n.IP, n.IP6}), join([]netip.Prefix{n.PodCIDR, n.PodCIDR6}), mtu, n.NS.Name)
	}
	tw.Flush()

	p.section("PODS")
	tw = tabwriter.NewWriter(os.Stdout, 2, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  NAME\tNODE\tIP\tHOST VETH\tNETNS")
	for _, pod := range c.Pods() {
		veth := "?"
		for _, i := range pod.Result.Interfaces {
			if i.Sandbox == "" {
				veth = i.Name
			}
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", pod.Name, pod.Node.Name, join([]netip.Addr{pod.IP, pod.IP6}), veth, pod.NS.Name)
	}
	tw.Flush()

	p.section("ROUTES (ip route show proto podnet, per node)")
	for _, n := range c.Nodes {
		routes, err := n.Routes()
		if err != nil {
			return err
		}
		fmt.Printf("  %s:\n", n.Name)
		for _, r := range routes {
			what := "podnet-routed: " + routeRole(c, r)
			if r.IsPodRoute() {
				what = "podnet plugin: local pod"
			}
			fmt.Printf("    %-62s # %s\n", r, what)
		}
	}

	for _, f := range families(o.family) {
		if err := connectivity(ctx, p, c, f); err != nil {
			return err
		}
	}
	return nil
}

// family is one address family of the checks: which of the pods' and
// nodes' addresses (IP, or IP6 in a dual-stack cluster) they use.
type family struct {
	name string // IPv4, IPv6
	ip6  bool   // the IP6 fields (dual-stack's second family)
}

// families are the families the checks run over: IP is IPv6 in an
// IPv6-only cluster, IP6 the second family of a dual-stack one.
func families(f string) []family {
	switch f {
	case "dual":
		return []family{{"IPv4", false}, {"IPv6", true}}
	case "ipv6":
		return []family{{"IPv6", false}}
	}
	return []family{{"IPv4", false}}
}

// connectivity prints the checks of one family: the ping matrix, TCP
// pod → pod, node ↔ pod pings, pod → outside masqueraded.
func connectivity(ctx context.Context, p *printer, c *cluster.Cluster, f family) error {
	p.section("CONNECTIVITY over " + f.name + " (ping pod → pod, round trip)")
	m := cluster.PingMatrix(ctx, c.Pods())
	if f.ip6 {
		m = cluster.PingMatrix6(ctx, c.Pods())
	}
	m.Render(os.Stdout, "  ")
	total, good := m.Pairs()
	p.check(good == total, "%d/%d pod pairs answer ICMP over %s (same node and across nodes)", good, total, f.name)
	for _, f := range m.Failures() {
		fmt.Println("      ", f)
	}

	fmt.Println()
	tcp := cluster.TCPMatrix(ctx, c.Pods())
	if f.ip6 {
		tcp = cluster.TCPMatrix6(ctx, c.Pods())
	}
	good = 0
	for _, r := range tcp {
		if r.OK() {
			good++
		} else {
			fmt.Println("      ✗", r)
		}
	}
	p.check(good == len(tcp), "%d/%d pod → pod TCP connections over %s, each server saw the client pod's own address (no NAT inside the cluster)", good, len(tcp), f.name)

	np := c.NodePodPings(ctx)
	if f.ip6 {
		np = c.NodePodPings6(ctx)
	}
	good = 0
	for _, r := range np {
		if r.RTT.OK {
			good++
		} else {
			fmt.Printf("      ✗ %s → %s (%s): %v\n", r.From, r.To, r.Dst, r.RTT.Err)
		}
	}
	p.check(good == len(np), "%d/%d node ↔ pod pings over %s (every node to every pod, every pod to every node)", good, len(np), f.name)

	outside := c.OutsideIPs()[0]
	out, err := c.OutsideTCP(ctx, c.Pods())
	if f.ip6 {
		outside = cluster.OutsideIP6
		out, err = c.OutsideTCP6(ctx, c.Pods())
	}
	if err != nil {
		return err
	}
	good = 0
	for _, r := range out {
		if r.OK() {
			good++
		} else {
			fmt.Println("      ✗", r)
		}
	}
	how := "masqueraded to the pod's node address"
	if outside.Is6() {
		how += " (the pod range is ULA: podnet-routed --masquerade-ipv6=auto masquerades it)"
	}
	p.check(good == len(out), "%d/%d pod → outside (%s, no route to the pods) TCP connections, %s", good, len(out), outside, how)
	if len(out) > 0 && out[0].OK() {
		src := c.Pods()[0].IP
		if f.ip6 {
			src = c.Pods()[0].IP6
		}
		fmt.Printf("      e.g. %s (%s) → outside: seen from %s\n", out[0].From, src, out[0].Seen)
	}
	return nil
}

// join lists the valid ones of addrs (or prefixes), comma-separated.
func join[T interface {
	IsValid() bool
	String() string
}](addrs []T) string {
	var out []string
	for _, a := range addrs {
		if a.IsValid() {
			out = append(out, a.String())
		}
	}
	return strings.Join(out, ",")
}

// routeRole says what a node route is for.
func routeRole(c *cluster.Cluster, r cluster.Route) string {
	for _, n := range c.Nodes {
		if n.PodCIDR == r.Dst || (n.PodCIDR6.IsValid() && n.PodCIDR6 == r.Dst) {
			if r.Blackhole {
				return "own PodCIDR (unused addresses go nowhere)"
			}
			how := map[string]string{"eth0": "direct over the underlay", "podnet.vxlan": "VXLAN", "tunl0": "IPIP"}[r.Dev]
			return n.Name + "'s PodCIDR, " + how
		}
	}
	return "?"
}

func (p *printer) check(ok bool, format string, args ...any) {
	mark := "✓"
	if !ok {
		mark = "✗"
		p.failed = true
	}
	fmt.Fprintf(p.w, "  %s %s\n", mark, fmt.Sprintf(format, args...))
}

func repoRoot(dir string) (string, error) {
	if dir != "" {
		return dir, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for d := wd; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "conf", "10-podnet.conflist")); err == nil {
			return d, nil
		}
		if filepath.Dir(d) == d {
			return "", errors.New("conf/10-podnet.conflist not found above the working directory: run from the repository or pass -repo")
		}
	}
}
