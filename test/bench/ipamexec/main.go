// Command ipamexec measures the ADD and DEL latency of IPAM plugin binaries
// exec'd the way a container runtime (or a main plugin delegating to its
// IPAM) runs them: one process per verb, the network config on stdin, the
// CNI_* environment. It pre-fills a /16 with a number of randomly scattered
// reservations (the same addresses for every plugin), then times -n ADD+DEL
// pairs of fresh container IDs and writes a Markdown table of p50/p90
// latencies, plus host-local/podnet-ipam ratios when both plugins ran.
// The plugins take turns in chunks of -chunk pairs.
//
//	go run ./test/bench/ipamexec -plugin bin/podnet-ipam -plugin $CNI_TOOLS/host-local \
//	    -prefill 0,100,1000 -n 200 -out results.md
//
// The plugin kind is the binary's base name: podnet-ipam is pre-filled
// through its own ipam.Add (in-process, CNI_ARGS IP=<addr>), host-local by
// writing its on-disk format directly (one file per address, named by the
// address, holding "containerID\r\nifname"). It is run by `make bench`
// (scripts/bench-ipam.sh), never by `make test`.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/ipam"
)

const network = "bench"

type pluginsFlag []string

func (p *pluginsFlag) String() string { return strings.Join(*p, ",") }
func (p *pluginsFlag) Set(s string) error {
	for _, v := range strings.Split(s, ",") {
		if v != "" {
			*p = append(*p, v)
		}
	}
	return nil
}

type result struct {
	plugin   string
	prefill  int
	n        int
	fill     time.Duration
	add, del []time.Duration
}

func main() {
	var plugins pluginsFlag
	flag.Var(&plugins, "plugin", "plugin binary to measure (repeatable or comma-separated); its base name must be podnet-ipam or host-local")
	n := flag.Int("n", 200, "measured ADD+DEL pairs per plugin and occupancy")
	warmup := flag.Int("warmup", 5, "unmeasured ADD+DEL pairs before the measured ones")
	chunk := flag.Int("chunk", 25, "measured pairs of one plugin before switching to the next")
	prefillList := flag.String("prefill", "0,100,1000", "comma-separated numbers of addresses reserved before measuring")
	subnetText := flag.String("subnet", "10.128.0.0/16", "subnet of the range")
	out := flag.String("out", "", "Markdown file to write the tables to (default stdout)")
	root := flag.String("dir", "", "directory for the data dirs (default: a new directory on tmpfs /dev/shm when available, else the temp dir)")
	flag.Parse()
	if len(plugins) == 0 {
		fatalf("no -plugin given")
	}
	if *n < 1 || *chunk < 1 || *warmup < 0 {
		fatalf("-n and -chunk must be positive, -warmup not negative")
	}
	subnet, err := netip.ParsePrefix(*subnetText)
	if err != nil || !subnet.Addr().Is4() {
		fatalf("-subnet %q: want an IPv4 CIDR", *subnetText)
	}
	var prefills []int
	for _, s := range strings.Split(*prefillList, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || v < 0 {
			fatalf("-prefill: bad count %q", s)
		}
		prefills = append(prefills, v)
	}
	for i, p := range plugins {
		abs, err := filepath.Abs(p)
		if err != nil {
			fatalf("%v", err)
		}
		if k := filepath.Base(abs); k != ipam.PluginType && k != "host-local" {
			fatalf("-plugin %s: unknown plugin %q (want podnet-ipam or host-local)", p, k)
		}
		plugins[i] = abs
	}
	where := *root
	if where == "" {
		where = tmpfsOr(os.TempDir())
	}
	base, err := os.MkdirTemp(where, "podnet-ipamexec-")
	if err != nil {
		fatalf("%v", err)
	}
	cleanups = append(cleanups, func() { os.RemoveAll(base) })
	defer os.RemoveAll(base)

	netns, stopNS := targetNetNS()
	cleanups = append(cleanups, stopNS)
	defer stopNS()

	candidates := usableAddrs(subnet)
	rng := rand.New(rand.NewPCG(1, 2)) // the same scatter for every plugin and run
	rng.Shuffle(len(candidates), func(i, j int) { candidates[i], candidates[j] = candidates[j], candidates[i] })

	var results []result
	for _, count := range prefills {
		if count > len(candidates) {
			fatalf("-prefill %d: the subnet has only %d usable addresses", count, len(candidates))
		}
		var runs []*run
		for i, plugin := range plugins {
			runs = append(runs, newRun(plugin, subnet, filepath.Join(base, fmt.Sprintf("%d-%d", count, i)), candidates[:count], netns))
		}
		// Alternate the plugins in chunks of pairs: drift in the machine's
		// speed hits all of them alike, while one plugin's verbs rarely
		// run right after the other's (host-local's scans of thousands of
		// files evict caches the next verb would otherwise find warm).
		for _, r := range runs {
			for i := 0; i < *warmup; i++ {
				r.pair(false)
			}
		}
		for done := 0; done < *n; done += *chunk {
			for _, r := range runs {
				for i := done; i < min(done+*chunk, *n); i++ {
					r.pair(true)
				}
			}
		}
		for _, r := range runs {
			r.check()
			fmt.Fprintf(os.Stderr, "ipamexec: %-11s prefill %6d: ADD p50 %s ms, DEL p50 %s ms (pre-fill %v)\n",
				r.plugin, count, ms(pct(r.add, 50)), ms(pct(r.del, 50)), r.fill.Round(time.Millisecond))
			results = append(results, r.result)
		}
	}

	var w io.Writer = os.Stdout
	if *out != "" {
		f, err := os.Create(*out)
		if err != nil {
			fatalf("%v", err)
		}
		defer f.Close()
		w = f
	}
	fmt.Fprintf(w, "Data dirs on %s (%s); CNI_NETNS %s.\n\n", where, fsKind(where), netnsNote(netns))
	writeTables(w, results)
}

type run struct {
	result
	path    string
	conf    []byte
	dataDir string
	env     []string
	seq     int
}

// newRun pre-fills a fresh data dir of the plugin with addrs.
func newRun(plugin string, subnet netip.Prefix, dataDir string, addrs []netip.Addr, netns string) *run {
	kind := filepath.Base(plugin)
	r := &run{path: plugin, conf: config(kind, subnet, dataDir), dataDir: dataDir,
		env: append(os.Environ(), "CNI_PATH="+filepath.Dir(plugin), "CNI_NETNS="+netns, "CNI_IFNAME=eth0")}
	start := time.Now()
	switch kind {
	case "host-local":
		prefillHostLocal(dataDir, addrs)
	default:
		prefillPodnet(r.conf, addrs)
	}
	r.result = result{plugin: kind, prefill: len(addrs), fill: time.Since(start)}
	return r
}

// pair execs ADD then DEL of a new container, recording the times if
// measured.
func (r *run) pair(measured bool) {
	r.seq++
	cid := fmt.Sprintf("bench-%s-%d", r.plugin, r.seq)
	add := execPlugin(r.path, "ADD", cid, r.conf, r.env)
	del := execPlugin(r.path, "DEL", cid, r.conf, r.env)
	if measured {
		r.add = append(r.add, add)
		r.del = append(r.del, del)
		r.n++
	}
}

// check verifies that every DEL released its ADD.
func (r *run) check() {
	if got := countReservations(r.plugin, r.dataDir); got != r.prefill {
		fatalf("%s: %d reservations after the run, want %d (a DEL did not release its ADD)", r.plugin, got, r.prefill)
	}
}

func config(kind string, subnet netip.Prefix, dataDir string) []byte {
	if kind == "host-local" {
		return fmt.Appendf(nil, `{"cniVersion":"1.0.0","name":%q,"ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"dataDir":%q}}`,
			network, subnet, dataDir)
	}
	return fmt.Appendf(nil, `{"cniVersion":"1.0.0","name":%q,"ipam":{"type":%q,"subnet":%q,"dataDir":%q}}`,
		network, ipam.PluginType, subnet, dataDir)
}

// execPlugin runs one verb and returns its wall time (fork+exec+plugin).
func execPlugin(path, verb, cid string, conf []byte, env []string) time.Duration {
	cmd := exec.Command(path)
	cmd.Env = append(env, "CNI_COMMAND="+verb, "CNI_CONTAINERID="+cid)
	cmd.Stdin = bytes.NewReader(conf)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	d := time.Since(start)
	if err != nil {
		fatalf("%s %s %s: %v\nstdout: %s\nstderr: %s", filepath.Base(path), verb, cid, err, stdout.Bytes(), stderr.Bytes())
	}
	if verb == "ADD" && !bytes.Contains(stdout.Bytes(), []byte(`"ips"`)) {
		fatalf("%s ADD %s: no addresses in the result: %s", filepath.Base(path), cid, stdout.Bytes())
	}
	return d
}

// prefillPodnet reserves the addresses through podnet-ipam's own ADD
// (in-process, each address requested with CNI_ARGS IP=).
func prefillPodnet(conf []byte, addrs []netip.Addr) {
	for i, ip := range addrs {
		req := ipam.Request{Stdin: conf, ContainerID: "prefill-" + strconv.Itoa(i), IfName: "eth0", Args: "IP=" + ip.String()}
		if _, err := ipam.Add(req); err != nil {
			fatalf("pre-fill podnet-ipam %s: %v", ip, err)
		}
	}
}

// prefillHostLocal writes what host-local's disk backend
// (plugins/ipam/host-local/backend/disk, v1.9.1) leaves after an ADD: a
// file named by the address holding "containerID\r\nifname".
func prefillHostLocal(dataDir string, addrs []netip.Addr) {
	dir := filepath.Join(dataDir, network)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fatalf("%v", err)
	}
	for i, ip := range addrs {
		data := "prefill-" + strconv.Itoa(i) + "\r\neth0"
		if err := os.WriteFile(filepath.Join(dir, ip.String()), []byte(data), 0o600); err != nil {
			fatalf("pre-fill host-local: %v", err)
		}
	}
}

func countReservations(kind, dataDir string) int {
	dir := filepath.Join(dataDir, network)
	if kind != "host-local" {
		dir = filepath.Join(dir, "ips")
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		fatalf("%v", err)
	}
	n := 0
	for _, e := range ents {
		if _, err := netip.ParseAddr(e.Name()); err == nil {
			n++
		}
	}
	return n
}

// usableAddrs is every address of an IPv4 subnet but the network, the
// broadcast and the default gateway (the first host) addresses.
func usableAddrs(subnet netip.Prefix) []netip.Addr {
	subnet = subnet.Masked()
	var out []netip.Addr
	gw := subnet.Addr().Next()
	for ip := gw.Next(); subnet.Contains(ip.Next()); ip = ip.Next() {
		out = append(out, ip)
	}
	return out
}

// targetNetNS returns a network namespace path other than our own, as a
// runtime passes the pod's: a sleeping `unshare --net` child's. When that
// cannot be made (no privilege), a path that does not exist, which the
// plugins' CNI library accepts the same way (neither plugin enters it).
func targetNetNS() (string, func()) {
	const placeholder = "/var/run/netns/podnet-ipamexec-none"
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		return placeholder, func() {}
	}
	cmd := exec.Command("unshare", "--net", "sleep", "3600")
	if err := cmd.Start(); err != nil {
		return placeholder, func() {}
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	path := fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid)
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		// Until unshare has run unshare(2) the child is in our netns; once
		// it has exec'd sleep, comm says so.
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", cmd.Process.Pid))
		if other, err := os.Readlink(path); err == nil && other != self && strings.TrimSpace(string(comm)) == "sleep" {
			return path, stop
		}
	}
	stop()
	return placeholder, func() {}
}

func netnsNote(p string) string {
	if strings.HasPrefix(p, "/proc/") {
		return "is a real network namespace (an `unshare --net` child's)"
	}
	return "is a path that does not exist (could not create a namespace)"
}

func tmpfsOr(fallback string) string {
	for _, d := range []string{"/dev/shm", "/run"} {
		if fsKind(d) == "tmpfs" && unix.Access(d, unix.W_OK) == nil {
			return d
		}
	}
	return fallback
}

func fsKind(dir string) string {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return "unknown"
	}
	if st.Type == unix.TMPFS_MAGIC {
		return "tmpfs"
	}
	return "not tmpfs"
}

// pct is the nearest-rank p-th percentile.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s)+99)/100 - 1
	return s[max(i, 0)]
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) }

func writeTables(w io.Writer, results []result) {
	fmt.Fprintln(w, "| pre-reserved | plugin | pairs | ADD p50 | ADD p90 | DEL p50 | DEL p90 | pre-fill |")
	fmt.Fprintln(w, "|---:|---|---:|---:|---:|---:|---:|---:|")
	for _, r := range results {
		fmt.Fprintf(w, "| %d | %s | %d | %s ms | %s ms | %s ms | %s ms | %v |\n", r.prefill, r.plugin, r.n,
			ms(pct(r.add, 50)), ms(pct(r.add, 90)), ms(pct(r.del, 50)), ms(pct(r.del, 90)), r.fill.Round(time.Millisecond))
	}
	type key struct {
		plugin  string
		prefill int
	}
	byKey := map[key]result{}
	var counts []int
	for _, r := range results {
		byKey[key{r.plugin, r.prefill}] = r
		if !slices.Contains(counts, r.prefill) {
			counts = append(counts, r.prefill)
		}
	}
	var rows []string
	for _, c := range counts {
		p, ok1 := byKey[key{ipam.PluginType, c}]
		h, ok2 := byKey[key{"host-local", c}]
		if !ok1 || !ok2 {
			continue
		}
		ratio := func(a, b time.Duration) string { return strconv.FormatFloat(float64(a)/float64(b), 'f', 2, 64) + "x" }
		rows = append(rows, fmt.Sprintf("| %d | %s | %s | %s |", c,
			ratio(pct(h.add, 50), pct(p.add, 50)), ratio(pct(h.del, 50), pct(p.del, 50)),
			ratio(pct(h.add, 50)+pct(h.del, 50), pct(p.add, 50)+pct(p.del, 50))))
	}
	if len(rows) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "host-local time / podnet-ipam time (p50; above 1 means podnet-ipam is faster):")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| pre-reserved | ADD | DEL | ADD+DEL |")
		fmt.Fprintln(w, "|---:|---:|---:|---:|")
		for _, row := range rows {
			fmt.Fprintln(w, row)
		}
	}
}

// cleanups run on fatalf too (os.Exit skips deferred calls).
var cleanups []func()

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "ipamexec: "+format+"\n", args...)
	for i := len(cleanups) - 1; i >= 0; i-- {
		cleanups[i]()
	}
	os.Exit(1)
}
