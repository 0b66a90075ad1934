package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/test/nettest"
)

// The tests in this file exercise bin/podnet-ipam: exec'd directly as a
// runtime (or a delegating plugin) would, and through libcni under the
// reference ptp plugin and under podnet. IPAM does not touch the network,
// so the direct execs need no netns; CNI_NETNS is a dummy path.

// dummyNetns is the CNI_NETNS of direct podnet-ipam execs: IPAM never opens it.
const dummyNetns = "/var/run/netns/none"

// ipamNet is one podnet-ipam network: its base config and its data dir.
type ipamNet struct {
	t       *testing.T
	bin     string // path of bin/podnet-ipam
	name    string
	dataDir string
	ipam    map[string]any
}

// newIPAMNet returns a network named name whose ipam object is ipam plus
// type and a fresh private dataDir.
func newIPAMNet(t *testing.T, name string, ipam map[string]any) *ipamNet {
	t.Helper()
	bin := filepath.Join(nettest.BinDir(t, "podnet-ipam"), "podnet-ipam")
	n := &ipamNet{t: t, bin: bin, name: name, dataDir: t.TempDir(), ipam: map[string]any{}}
	for k, v := range ipam {
		n.ipam[k] = v
	}
	n.ipam["type"] = "podnet-ipam"
	n.ipam["dataDir"] = n.dataDir
	return n
}

// rangesOf is the ipam object with one range set per subnet.
func rangesOf(subnets ...string) map[string]any {
	var sets []any
	for _, s := range subnets {
		sets = append(sets, []any{map[string]any{"subnet": s}})
	}
	return map[string]any{"ranges": sets}
}

// conf renders the network config; extra adds or replaces top-level keys.
func (n *ipamNet) conf(extra map[string]any) []byte {
	c := map[string]any{"cniVersion": "1.1.0", "name": n.name, "ipam": n.ipam}
	for k, v := range extra {
		c[k] = v
	}
	b, err := json.Marshal(c)
	if err != nil {
		n.t.Fatal(err)
	}
	return b
}

// ipamCall is one podnet-ipam invocation.
type ipamCall struct {
	cmd     string // CNI_COMMAND
	cid     string
	ifName  string // default eth0 for ADD/DEL/CHECK
	cniArgs string
	extra   map[string]any // top-level config keys
}

// command builds the exec.Cmd of call (not started).
func (n *ipamNet) command(c ipamCall) *exec.Cmd {
	cmd := exec.Command(n.bin)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"CNI_COMMAND=" + c.cmd,
		"CNI_PATH=" + filepath.Dir(n.bin),
	}
	if c.cmd == "ADD" || c.cmd == "DEL" || c.cmd == "CHECK" {
		ifName := c.ifName
		if ifName == "" {
			ifName = "eth0"
		}
		cmd.Env = append(cmd.Env, "CNI_CONTAINERID="+c.cid, "CNI_IFNAME="+ifName, "CNI_NETNS="+dummyNetns)
	}
	if c.cniArgs != "" {
		cmd.Env = append(cmd.Env, "CNI_ARGS="+c.cniArgs)
	}
	cmd.Stdin = bytes.NewReader(n.conf(c.extra))
	cmd.Stdout, cmd.Stderr = new(bytes.Buffer), new(bytes.Buffer)
	return cmd
}

// outcome classifies a finished podnet-ipam process.
func outcome(cmd *exec.Cmd, waitErr error) execResult {
	res := execResult{stdout: cmd.Stdout.(*bytes.Buffer).Bytes(), stderr: cmd.Stderr.(*bytes.Buffer).Bytes()}
	var exitErr *exec.ExitError
	switch {
	case waitErr == nil:
	case errors.As(waitErr, &exitErr):
		res.exitCode = exitErr.ExitCode() // -1 when killed by a signal
	default:
		res.exitCode = -2
		res.stderr = append(res.stderr, []byte(waitErr.Error())...)
	}
	return res
}

// run execs one call and waits for it.
func (n *ipamNet) run(c ipamCall) execResult {
	n.t.Helper()
	cmd := n.command(c)
	return outcome(cmd, cmd.Run())
}

// add runs ADD and fails the test unless it succeeds.
func (n *ipamNet) add(c ipamCall) *current.Result {
	n.t.Helper()
	c.cmd = "ADD"
	res := n.run(c)
	r, err := parseIPAMResult(res)
	if err != nil {
		n.t.Fatalf("ADD %s: %v", c.cid, err)
	}
	return r
}

// ok runs a verb that prints nothing on success and fails the test unless
// it succeeds.
func (n *ipamNet) ok(c ipamCall) {
	n.t.Helper()
	if res := n.run(c); res.exitCode != 0 {
		n.t.Fatalf("%s %s: exit %d\nstdout: %s\nstderr: %s", c.cmd, c.cid, res.exitCode, res.stdout, res.stderr)
	}
}

// fails runs c, requires a CNI error with code (0: any code) whose msg
// contains every want, and returns it.
func (n *ipamNet) fails(c ipamCall, code uint, want ...string) *types.Error {
	n.t.Helper()
	res := n.run(c)
	e, err := ipamError(res)
	if err != nil {
		n.t.Fatalf("%s %s: %v", c.cmd, c.cid, err)
	}
	if code != 0 && e.Code != code {
		n.t.Fatalf("%s %s: code %d (%q), want %d", c.cmd, c.cid, e.Code, e.Msg, code)
	}
	for _, w := range want {
		if !strings.Contains(e.Msg, w) {
			n.t.Fatalf("%s %s: msg %q, want it to contain %q", c.cmd, c.cid, e.Msg, w)
		}
	}
	return e
}

// gc runs GC keeping valid (an empty, non-nil list releases everything).
func (n *ipamNet) gc(valid []types.GCAttachment) {
	n.t.Helper()
	if valid == nil {
		valid = []types.GCAttachment{}
	}
	n.ok(ipamCall{cmd: "GC", extra: map[string]any{"cni.dev/valid-attachments": valid}})
}

// parseIPAMResult requires exit 0 and a result on stdout.
func parseIPAMResult(res execResult) (*current.Result, error) {
	if res.exitCode != 0 {
		return nil, fmt.Errorf("exit %d\nstdout: %s\nstderr: %s", res.exitCode, res.stdout, res.stderr)
	}
	var r current.Result
	if err := json.Unmarshal(res.stdout, &r); err != nil {
		return nil, fmt.Errorf("result does not parse: %v\n%s", err, res.stdout)
	}
	if len(r.IPs) == 0 {
		return nil, fmt.Errorf("result has no IPs: %s", res.stdout)
	}
	return &r, nil
}

// ipamError requires a non-zero exit with exactly a CNI error on stdout.
func ipamError(res execResult) (*types.Error, error) {
	if res.exitCode == 0 {
		return nil, fmt.Errorf("succeeded, want a failure; stdout: %s", res.stdout)
	}
	if bytes.Contains(res.stderr, []byte("panic")) {
		return nil, fmt.Errorf("panicked:\n%s", res.stderr)
	}
	e, err := decodeCNIErrorOutput(res.stdout)
	if err != nil {
		return nil, fmt.Errorf("exit %d: %v\nstdout: %s\nstderr: %s", res.exitCode, err, res.stdout, res.stderr)
	}
	return e, nil
}

// ipamStore is the on-disk store of one network, read back for assertions.
type ipamStore struct {
	ips    map[string]string   // ips/<ip> -> "cid:ifname" ("?<raw>" when it does not parse)
	owners map[string][]string // owners/<cid:ifname> -> addresses
	// meta are the owner index entries' "key=value" lines (what ADD
	// records with the addresses: netns, pod, created, boot-id), raw.
	meta  map[string]map[string]string
	temps []string // .tmp-* files anywhere in the network dir
	stray []string // any other unexpected file
}

func readIPAMStore(t *testing.T, dataDir, network string) ipamStore {
	t.Helper()
	dir := filepath.Join(dataDir, network)
	s := ipamStore{ips: map[string]string{}, owners: map[string][]string{}, meta: map[string]map[string]string{}}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		base := d.Name()
		if strings.HasPrefix(base, ".tmp-") {
			s.temps = append(s.temps, rel)
			return nil
		}
		if d.IsDir() {
			if rel != "." && rel != "ips" && rel != "owners" && rel != "hints" {
				s.stray = append(s.stray, rel+"/")
				return filepath.SkipDir
			}
			return nil
		}
		data, rerr := os.ReadFile(p)
		if rerr != nil {
			return rerr
		}
		switch filepath.Dir(rel) {
		case ".":
			if rel != "lock" {
				s.stray = append(s.stray, rel)
			}
		case "ips":
			lines := strings.Split(string(data), "\n")
			if _, err := netip.ParseAddr(base); err != nil || len(lines) != 3 || lines[2] != "" {
				s.stray = append(s.stray, rel)
				s.ips[base] = "?" + string(data)
			} else {
				s.ips[base] = lines[0] + ":" + lines[1]
			}
		case "owners":
			// the addresses, and apart the lines of what ADD recorded
			// with them (key=value)
			var list []string
			for _, l := range strings.Split(string(data), "\n") {
				if k, v, isMeta := strings.Cut(l, "="); isMeta {
					if s.meta[base] == nil {
						s.meta[base] = map[string]string{}
					}
					s.meta[base][k] = v
				} else if l != "" {
					list = append(list, l)
				}
			}
			s.owners[base] = list
		case "hints":
			if len(base) != 16 {
				s.stray = append(s.stray, rel)
			}
		default:
			s.stray = append(s.stray, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("read IPAM store %s: %v", dir, err)
	}
	return s
}

// consistent checks that both indexes agree: every reservation names an
// owner whose index entry lists it, and every index entry's addresses are
// reserved for that owner. It also reports temp and stray files.
func (s ipamStore) consistent() error {
	var errs []error
	for ip, o := range s.ips {
		if !slices.Contains(s.owners[o], ip) {
			errs = append(errs, fmt.Errorf("ips/%s names %q whose owners entry is %v", ip, o, s.owners[o]))
		}
	}
	for o, list := range s.owners {
		if len(list) == 0 {
			errs = append(errs, fmt.Errorf("owners/%s is empty", o))
		}
		for _, ip := range list {
			if s.ips[ip] != o {
				errs = append(errs, fmt.Errorf("owners/%s lists %s, reserved for %q", o, ip, s.ips[ip]))
			}
		}
	}
	if len(s.temps) > 0 {
		errs = append(errs, fmt.Errorf("temp files left: %v", s.temps))
	}
	if len(s.stray) > 0 {
		errs = append(errs, fmt.Errorf("unexpected files: %v", s.stray))
	}
	return errors.Join(errs...)
}

func (s ipamStore) String() string {
	return fmt.Sprintf("ips=%v owners=%v temps=%v stray=%v", s.ips, s.owners, s.temps, s.stray)
}

// assertStoreEmpty fails unless ips/ and owners/ are empty and no temp
// file is left.
func assertStoreEmpty(t *testing.T, dataDir, network string) {
	t.Helper()
	s := readIPAMStore(t, dataDir, network)
	if len(s.ips) > 0 || len(s.owners) > 0 || len(s.temps) > 0 || len(s.stray) > 0 {
		t.Fatalf("IPAM store not empty: %s", s)
	}
}

// runParallel starts all cmds at once (as far as the scheduler allows) and
// returns their outcomes in order.
func runParallel(cmds []*exec.Cmd) []execResult {
	out := make([]execResult, len(cmds))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, cmd := range cmds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out[i] = outcome(cmd, cmd.Run())
		}()
	}
	close(start)
	wg.Wait()
	return out
}

// usableV4 is the number of addresses podnet-ipam hands out from an IPv4
// subnet of prefix length bits: all but network, broadcast and gateway.
func usableV4(bits int) int { return 1<<(32-bits) - 2 - 1 }

func TestIPAMConcurrentProcesses(t *testing.T) {
	const procs = 32
	concurrentAdd := func(t *testing.T, n *ipamNet) (ok map[string]string, failed []*types.Error) {
		t.Helper()
		cmds := make([]*exec.Cmd, procs)
		for i := range cmds {
			cmds[i] = n.command(ipamCall{cmd: "ADD", cid: fmt.Sprintf("conc-%02d", i)})
		}
		ok = map[string]string{}
		for i, res := range runParallel(cmds) {
			cid := fmt.Sprintf("conc-%02d", i)
			if res.exitCode == 0 {
				r, err := parseIPAMResult(res)
				if err != nil {
					t.Fatalf("ADD %s: %v", cid, err)
				}
				if len(r.IPs) != 1 {
					t.Fatalf("ADD %s: %d IPs, want 1", cid, len(r.IPs))
				}
				ok[cid] = r.IPs[0].Address.IP.String()
				continue
			}
			e, err := ipamError(res)
			if err != nil {
				t.Fatalf("ADD %s: %v", cid, err)
			}
			failed = append(failed, e)
		}
		return ok, failed
	}
	checkStore := func(t *testing.T, n *ipamNet, ok map[string]string) {
		t.Helper()
		s := readIPAMStore(t, n.dataDir, n.name)
		if err := s.consistent(); err != nil {
			t.Fatalf("store inconsistent: %v\n%s", err, s)
		}
		if len(s.ips) != len(ok) || len(s.owners) != len(ok) {
			t.Fatalf("store has %d ips and %d owners, want %d each", len(s.ips), len(s.owners), len(ok))
		}
		seen := map[string]string{}
		for cid, ip := range ok {
			if other, dup := seen[ip]; dup {
				t.Fatalf("%s handed out to both %s and %s", ip, other, cid)
			}
			seen[ip] = cid
			if s.ips[ip] != cid+":eth0" {
				t.Fatalf("ips/%s = %q, want %s:eth0", ip, s.ips[ip], cid)
			}
		}
	}

	small := newIPAMNet(t, "conc27", rangesOf("10.201.1.0/27"))
	want := usableV4(27) // 32 - network - broadcast - gateway = 29
	ok, failed := concurrentAdd(t, small)
	t.Logf("/27: %d of %d ADDs succeeded, %d failed (want %d succeeded)", len(ok), procs, len(failed), want)
	if len(ok) != want || len(failed) != procs-want {
		t.Fatalf("/27: %d succeeded and %d failed, want %d and %d", len(ok), len(failed), want, procs-want)
	}
	for _, e := range failed {
		if e.Code != types.ErrTryAgainLater || !strings.Contains(e.Msg, "no free address") {
			t.Fatalf("/27 exhausted: error %d %q, want code 11 saying no free address", e.Code, e.Msg)
		}
	}
	prefix := netip.MustParsePrefix("10.201.1.0/27")
	for cid, ip := range ok {
		a := netip.MustParseAddr(ip)
		if !prefix.Contains(a) || ip == "10.201.1.0" || ip == "10.201.1.1" || ip == "10.201.1.31" {
			t.Fatalf("%s got %s: not a usable address of %s", cid, ip, prefix)
		}
	}
	checkStore(t, small, ok)
	// Full: STATUS says so.
	small.fails(ipamCall{cmd: "STATUS"}, types.ErrPluginNotAvailable, "no free address")

	big := newIPAMNet(t, "conc24", rangesOf("10.201.2.0/24"))
	okBig, failedBig := concurrentAdd(t, big)
	t.Logf("/24: %d of %d ADDs succeeded", len(okBig), procs)
	if len(okBig) != procs || len(failedBig) != 0 {
		t.Fatalf("/24: %d succeeded, %d failed (first: %v), want all %d", len(okBig), len(failedBig), failedBig, procs)
	}
	checkStore(t, big, okBig)

	// 32 concurrent DELs empty each store (on the /27, three of them
	// release nothing).
	for _, n := range []*ipamNet{small, big} {
		cmds := make([]*exec.Cmd, procs)
		for i := range cmds {
			cmds[i] = n.command(ipamCall{cmd: "DEL", cid: fmt.Sprintf("conc-%02d", i)})
		}
		for i, res := range runParallel(cmds) {
			if res.exitCode != 0 {
				t.Fatalf("%s: DEL conc-%02d: exit %d: %s %s", n.name, i, res.exitCode, res.stdout, res.stderr)
			}
		}
		assertStoreEmpty(t, n.dataDir, n.name)
	}
	small.ok(ipamCall{cmd: "STATUS"})
}

func TestIPAMKillMidAdd(t *testing.T) {
	const (
		perRound = 40
		// The first rounds kill 0-5 ms after start: mostly during process
		// start-up or while waiting for the store's lock. The later ones
		// spread the kills over the measured lifetime of an ADD in such a
		// crowd, so that some land inside the locked critical section.
		shortRounds = 3
		longRounds  = 3
		shortDelay  = 5 * time.Millisecond
	)
	n := newIPAMNet(t, "killnet", rangesOf("10.201.3.0/24"))
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("PODNET_KILL_SEED"); s != "" {
		fmt.Sscan(s, &seed)
	}
	t.Logf("seed %d (set PODNET_KILL_SEED to replay)", seed)
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))

	valid := map[string]string{} // cid -> address, ADDs that completed
	var failed int
	var lifetime time.Duration // longest run of a completed ADD so far
	type tally struct{ tried, killed, late int }
	var short, long tally
	for round := range shortRounds + longRounds {
		maxDelay := shortDelay
		tl := &short
		if round >= shortRounds {
			maxDelay = max(lifetime, shortDelay)
			tl = &long
		}
		type proc struct {
			cid      string
			cmd      *exec.Cmd
			kill     bool
			delay    time.Duration
			res      execResult
			signaled bool
			ran      time.Duration
		}
		procs := make([]*proc, perRound)
		for i := range procs {
			p := &proc{
				cid:   fmt.Sprintf("kill-%d-%02d", round, i),
				kill:  rng.IntN(2) == 0,
				delay: time.Duration(rng.Int64N(int64(maxDelay) + 1)),
			}
			p.cmd = n.command(ipamCall{cmd: "ADD", cid: p.cid})
			procs[i] = p
		}
		var late atomic.Int32
		var wg sync.WaitGroup
		start := make(chan struct{})
		for _, p := range procs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				t0 := time.Now()
				if err := p.cmd.Start(); err != nil {
					p.res = execResult{exitCode: -2, stderr: []byte(err.Error())}
					return
				}
				var timer *time.Timer
				killDone := make(chan struct{})
				if p.kill {
					timer = time.AfterFunc(p.delay, func() {
						defer close(killDone)
						if err := p.cmd.Process.Kill(); errors.Is(err, os.ErrProcessDone) {
							late.Add(1)
						}
					})
				} else {
					close(killDone)
				}
				err := p.cmd.Wait()
				p.ran = time.Since(t0)
				if timer != nil && timer.Stop() {
					late.Add(1) // finished before the kill was due
					close(killDone)
				}
				<-killDone
				p.res = outcome(p.cmd, err)
				if ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
					p.signaled = true
				}
			}()
		}
		close(start)
		wg.Wait()
		for _, p := range procs {
			if p.kill {
				tl.tried++
			}
			switch {
			case p.signaled:
				tl.killed++
			case p.res.exitCode == 0:
				r, err := parseIPAMResult(p.res)
				if err != nil {
					t.Fatalf("ADD %s: %v", p.cid, err)
				}
				ip := r.IPs[0].Address.IP.String()
				for other, oip := range valid {
					if oip == ip {
						t.Fatalf("%s handed out to both %s and %s", ip, other, p.cid)
					}
				}
				valid[p.cid] = ip
				lifetime = max(lifetime, p.ran)
			default:
				// A failure must still be a clean CNI error.
				e, err := ipamError(p.res)
				if err != nil {
					t.Fatalf("ADD %s: %v", p.cid, err)
				}
				t.Logf("ADD %s failed: %d %s", p.cid, e.Code, e.Msg)
				failed++
			}
		}
		tl.late += int(late.Load())
		t.Logf("round %d: kill delays 0-%v, %d valid so far", round, maxDelay.Round(time.Microsecond), len(valid))
	}
	killed := short.killed + long.killed
	t.Logf("%d ADD processes: %d completed, %d SIGKILLed mid-flight, %d failed cleanly", (shortRounds+longRounds)*perRound, len(valid), killed, failed)
	t.Logf("kills at 0-5 ms: %d attempted, %d hit a running process, %d too late; kills over the lifetime (<= %v): %d attempted, %d hit, %d too late",
		short.tried, short.killed, short.late, lifetime.Round(time.Microsecond), long.tried, long.killed, long.late)
	if killed == 0 {
		t.Fatalf("no process was killed mid-flight: the test proved nothing")
	}

	// Before GC: the completed attachments are intact whatever the kills
	// left, and every owner entry points at reservations of its owner.
	before := readIPAMStore(t, n.dataDir, n.name)
	orphans := 0
	for _, o := range before.ips {
		cid, _, _ := strings.Cut(o, ":")
		if _, ok := valid[cid]; !ok {
			orphans++
		}
	}
	unindexed := 0
	for ip, o := range before.ips {
		if !slices.Contains(before.owners[o], ip) {
			unindexed++
		}
	}
	t.Logf("before GC: %d reservations (%d of attachments whose ADD did not complete, %d without owner index entry), %d owner entries, %d temp files, stray %v",
		len(before.ips), orphans, unindexed, len(before.owners), len(before.temps), before.stray)
	for cid, ip := range valid {
		if before.ips[ip] != cid+":eth0" || !slices.Equal(before.owners[cid+":eth0"], []string{ip}) {
			t.Fatalf("before GC: %s lost %s: ips/%s=%q owners=%v", cid, ip, ip, before.ips[ip], before.owners[cid+":eth0"])
		}
	}
	for o, list := range before.owners {
		for _, ip := range list {
			if before.ips[ip] != o {
				t.Fatalf("before GC: owners/%s lists %s reserved for %q", o, ip, before.ips[ip])
			}
		}
	}

	var keep []types.GCAttachment
	for cid := range valid {
		keep = append(keep, types.GCAttachment{ContainerID: cid, IfName: "eth0"})
	}
	n.gc(keep)

	after := readIPAMStore(t, n.dataDir, n.name)
	if err := after.consistent(); err != nil {
		t.Fatalf("after GC: %v\n%s", err, after)
	}
	if len(after.ips) != len(valid) || len(after.owners) != len(valid) {
		t.Fatalf("after GC: %d reservations and %d owner entries, want %d each\n%s", len(after.ips), len(after.owners), len(valid), after)
	}
	for cid, ip := range valid {
		if after.ips[ip] != cid+":eth0" {
			t.Fatalf("after GC: ips/%s = %q, want %s:eth0", ip, after.ips[ip], cid)
		}
		n.ok(ipamCall{cmd: "CHECK", cid: cid})
		// A repeated ADD returns the same address.
		if r := n.add(ipamCall{cid: cid}); r.IPs[0].Address.IP.String() != ip {
			t.Fatalf("repeated ADD of %s = %s, want %s", cid, r.IPs[0].Address.IP, ip)
		}
	}

	// New containers still get fresh, distinct addresses.
	cmds := make([]*exec.Cmd, 10)
	for i := range cmds {
		cmds[i] = n.command(ipamCall{cmd: "ADD", cid: fmt.Sprintf("fresh-%02d", i)})
	}
	taken := map[string]bool{}
	for _, ip := range valid {
		taken[ip] = true
	}
	for i, res := range runParallel(cmds) {
		r, err := parseIPAMResult(res)
		if err != nil {
			t.Fatalf("ADD fresh-%02d after GC: %v", i, err)
		}
		ip := r.IPs[0].Address.IP.String()
		if taken[ip] {
			t.Fatalf("fresh-%02d got %s, already in use", i, ip)
		}
		taken[ip] = true
	}
	final := readIPAMStore(t, n.dataDir, n.name)
	if err := final.consistent(); err != nil || len(final.ips) != len(valid)+10 {
		t.Fatalf("after fresh ADDs: %d reservations, want %d; %v", len(final.ips), len(valid)+10, err)
	}
}

func TestIPAMGC(t *testing.T) {
	n := newIPAMNet(t, "gcnet", rangesOf("10.201.4.0/24"))
	addrs := map[string]string{}
	for i := range 10 {
		cid := fmt.Sprintf("gc-%02d", i)
		addrs[cid] = n.add(ipamCall{cid: cid}).IPs[0].Address.IP.String()
	}
	keepIDs := []string{"gc-00", "gc-03", "gc-05", "gc-09"}
	var keep []types.GCAttachment
	for _, cid := range keepIDs {
		keep = append(keep, types.GCAttachment{ContainerID: cid, IfName: "eth0"})
	}
	n.gc(keep)

	s := readIPAMStore(t, n.dataDir, n.name)
	if err := s.consistent(); err != nil {
		t.Fatalf("after GC: %v", err)
	}
	var gotOwners []string
	for o := range s.owners {
		gotOwners = append(gotOwners, o)
	}
	slices.Sort(gotOwners)
	wantOwners := []string{"gc-00:eth0", "gc-03:eth0", "gc-05:eth0", "gc-09:eth0"}
	if !slices.Equal(gotOwners, wantOwners) || len(s.ips) != 4 {
		t.Fatalf("after GC: owners %v and %d reservations, want %v and 4\n%s", gotOwners, len(s.ips), wantOwners, s)
	}
	for _, cid := range keepIDs {
		if s.ips[addrs[cid]] != cid+":eth0" {
			t.Fatalf("kept %s lost %s: %s", cid, addrs[cid], s)
		}
		n.ok(ipamCall{cmd: "CHECK", cid: cid})
	}

	// The six released addresses can be requested again, by
	// runtimeConfig.ips and by CNI_ARGS IP=; the released attachments no
	// longer CHECK.
	i := 0
	for cid, ip := range addrs {
		if slices.Contains(keepIDs, cid) {
			continue
		}
		n.fails(ipamCall{cmd: "CHECK", cid: cid}, 0, "no reservation")
		c := ipamCall{cid: "re-" + cid}
		if i%2 == 0 {
			c.extra = map[string]any{"runtimeConfig": map[string]any{"ips": []string{ip + "/24"}}}
		} else {
			c.cniArgs = "IgnoreUnknown=1;IP=" + ip
		}
		if got := n.add(c).IPs[0].Address.String(); got != ip+"/24" {
			t.Fatalf("re-request of %s by %s = %s", ip, c.cid, got)
		}
		i++
	}
	// A kept address cannot be requested.
	n.fails(ipamCall{cmd: "ADD", cid: "thief", cniArgs: "IP=" + addrs["gc-03"]}, 0, "gc-03")

	// GC with no valid attachment releases everything.
	n.gc(nil)
	assertStoreEmpty(t, n.dataDir, n.name)
	n.ok(ipamCall{cmd: "STATUS"})
	if got := n.add(ipamCall{cid: "after-gc"}).IPs[0].Address.String(); !strings.HasPrefix(got, "10.201.4.") {
		t.Fatalf("ADD after GC = %s", got)
	}
}

// TestIPAMGCRepairsCrashLeftovers plants what SIGKILLed invocations can
// leave (see the store's comment) and checks that GC repairs each.
func TestIPAMGCRepairsCrashLeftovers(t *testing.T) {
	n := newIPAMNet(t, "crashnet", rangesOf("10.201.11.0/24"))
	a := n.add(ipamCall{cid: "crash-a"}).IPs[0].Address.IP.String() // .2
	b := n.add(ipamCall{cid: "crash-b"}).IPs[0].Address.IP.String() // .3
	dir := filepath.Join(n.dataDir, n.name)
	plant := func(rel, content string) {
		if err := os.WriteFile(filepath.Join(dir, rel), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// An ADD of crash-a killed between reserving .50 and writing the owner
	// index, then retried (podman restart, or any runtime retrying ADD of
	// the same attachment): crash-a holds .2, and .50 names it as well.
	plant("ips/10.201.11.50", "crash-a\neth0\n")
	// An ADD of a container that never completed, killed at the same point.
	plant("ips/10.201.11.51", "crash-gone\neth0\n")
	// A reservation that does not parse.
	plant("ips/10.201.11.52", "crash-to")
	// An owner index entry whose reservation is gone.
	plant("owners/crash-c:eth0", "10.201.11.53\n")
	// Temp files of killed writers.
	plant(".tmp-12345", "crash-x\neth0\n")
	plant(".tmp-67890", "")

	n.gc([]types.GCAttachment{{ContainerID: "crash-a", IfName: "eth0"}, {ContainerID: "crash-b", IfName: "eth0"}, {ContainerID: "crash-c", IfName: "eth0"}})

	s := readIPAMStore(t, n.dataDir, n.name)
	if err := s.consistent(); err != nil {
		t.Fatalf("after GC: %v\n%s", err, s)
	}
	want := map[string]string{a: "crash-a:eth0", b: "crash-b:eth0"}
	if fmt.Sprint(s.ips) != fmt.Sprint(want) || len(s.owners) != 2 || !slices.Equal(s.owners["crash-a:eth0"], []string{a}) {
		t.Fatalf("after GC: %s, want only %v with one address each", s, want)
	}
	if r := n.add(ipamCall{cid: "crash-a"}); len(r.IPs) != 1 || r.IPs[0].Address.IP.String() != a {
		t.Fatalf("repeated ADD of crash-a after GC = %v, want only %s", ipConfigs(r), a)
	}
	n.ok(ipamCall{cmd: "CHECK", cid: "crash-a"})
	n.fails(ipamCall{cmd: "CHECK", cid: "crash-c"}, 0, "no reservation")
	for _, ip := range []string{"10.201.11.50", "10.201.11.51", "10.201.11.52", "10.201.11.53"} {
		if got := n.add(ipamCall{cid: "re-" + strings.ReplaceAll(ip, ".", "-"), cniArgs: "IP=" + ip}).IPs[0].Address.IP.String(); got != ip {
			t.Fatalf("re-request of %s = %s", ip, got)
		}
	}
}

func TestIPAMDualStack(t *testing.T) {
	t.Run("default gateways", func(t *testing.T) {
		n := newIPAMNet(t, "dual", rangesOf("10.201.5.0/24", "fd00:201:5::/64"))
		for i, cid := range []string{"dual-a", "dual-b"} {
			r := n.add(ipamCall{cid: cid})
			want := []string{
				fmt.Sprintf("10.201.5.%d/24 gw 10.201.5.1", 2+i),
				fmt.Sprintf("fd00:201:5::%d/64 gw fd00:201:5::1", 2+i),
			}
			if got := ipConfigs(r); !slices.Equal(got, want) {
				t.Fatalf("ADD %s = %v, want %v", cid, got, want)
			}
			n.ok(ipamCall{cmd: "CHECK", cid: cid})
		}
		s := readIPAMStore(t, n.dataDir, n.name)
		if err := s.consistent(); err != nil || len(s.ips) != 4 || len(s.owners["dual-a:eth0"]) != 2 {
			t.Fatalf("store: %v\n%s", err, s)
		}
		for _, cid := range []string{"dual-a", "dual-b"} {
			n.ok(ipamCall{cmd: "DEL", cid: cid})
		}
		assertStoreEmpty(t, n.dataDir, n.name)
	})
	t.Run("explicit gateways and prefix lengths", func(t *testing.T) {
		n := newIPAMNet(t, "dualgw", map[string]any{"ranges": []any{
			[]any{map[string]any{"subnet": "10.201.15.0/25", "gateway": "10.201.15.126"}},
			[]any{map[string]any{"subnet": "fd00:201:15::/120", "gateway": "fd00:201:15::fe"}},
		}})
		r := n.add(ipamCall{cid: "dualgw"})
		want := []string{"10.201.15.1/25 gw 10.201.15.126", "fd00:201:15::1/120 gw fd00:201:15::fe"}
		if got := ipConfigs(r); !slices.Equal(got, want) {
			t.Fatalf("ADD = %v, want %v", got, want)
		}
	})
}

// ipConfigs renders a result's IPs as "addr/len gw gateway".
func ipConfigs(r *current.Result) []string {
	var out []string
	for _, c := range r.IPs {
		out = append(out, fmt.Sprintf("%s gw %s", c.Address.String(), c.Gateway))
	}
	return out
}

func TestIPAMUsePodCidr(t *testing.T) {
	stateDir := t.TempDir()
	v4 := newIPAMNet(t, "podcidr", map[string]any{"subnet": "usePodCidr", "stateDir": stateDir})
	dual := newIPAMNet(t, "podcidr-ds", map[string]any{"stateDir": stateDir, "ranges": []any{
		[]any{map[string]any{"subnet": "usePodCidr"}},
		[]any{map[string]any{"subnet": "usePodCidrIPv6"}},
	}})

	// No node.json yet.
	for _, n := range []*ipamNet{v4, dual} {
		n.fails(ipamCall{cmd: "ADD", cid: "early"}, types.ErrTryAgainLater, "node PodCIDR not known yet")
		n.fails(ipamCall{cmd: "STATUS"}, types.ErrPluginNotAvailable, "node PodCIDR not known yet")
		n.ok(ipamCall{cmd: "DEL", cid: "early"}) // nothing can be allocated: DEL succeeds
	}

	write := func(cidrs ...string) {
		b, _ := json.Marshal(map[string]any{"podCIDRs": cidrs})
		if err := os.WriteFile(filepath.Join(stateDir, "node.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Only an IPv4 PodCIDR: the IPv4 network works, the dual one waits.
	write("10.123.4.0/24")
	v4.ok(ipamCall{cmd: "STATUS"})
	dual.fails(ipamCall{cmd: "ADD", cid: "early"}, types.ErrTryAgainLater, "node PodCIDR not known yet", "IPv6")
	dual.fails(ipamCall{cmd: "STATUS"}, types.ErrPluginNotAvailable, "IPv6")

	write("10.123.4.0/24", "fd00:123:4::/64")
	if got := ipConfigs(v4.add(ipamCall{cid: "pod-a"})); !slices.Equal(got, []string{"10.123.4.2/24 gw 10.123.4.1"}) {
		t.Fatalf("usePodCidr ADD = %v, want 10.123.4.2/24 gw 10.123.4.1", got)
	}
	r := dual.add(ipamCall{cid: "pod-b"})
	if len(r.IPs) != 2 || r.IPs[0].Address.String() != "10.123.4.2/24" {
		t.Fatalf("dual usePodCidr ADD = %v", ipConfigs(r))
	}
	v6 := r.IPs[1].Address
	if ones, _ := v6.Mask.Size(); ones != 64 || !netip.MustParsePrefix("fd00:123:4::/64").Contains(netip.MustParseAddr(v6.IP.String())) || v6.IP.To4() != nil {
		t.Fatalf("IPv6 address %s, want one from fd00:123:4::/64 with /64", v6.String())
	}
	t.Logf("dual usePodCidr ADD = %v", ipConfigs(r))
	v4.ok(ipamCall{cmd: "STATUS"})
	dual.ok(ipamCall{cmd: "STATUS"})
	v4.ok(ipamCall{cmd: "CHECK", cid: "pod-a"})
	dual.ok(ipamCall{cmd: "CHECK", cid: "pod-b"})
}

func TestIPAMRequestedIPs(t *testing.T) {
	n := newIPAMNet(t, "reqnet", rangesOf("10.201.6.0/24"))
	cases := []struct {
		cid  string
		call ipamCall
		want string
	}{
		{"req-runtimeconfig", ipamCall{extra: map[string]any{"runtimeConfig": map[string]any{"ips": []string{"10.201.6.10/24"}}}}, "10.201.6.10/24"},
		{"req-args", ipamCall{extra: map[string]any{"args": map[string]any{"cni": map[string]any{"ips": []string{"10.201.6.11"}}}}}, "10.201.6.11/24"},
		{"req-cniargs", ipamCall{cniArgs: "IgnoreUnknown=1;K8S_POD_NAME=x;IP=10.201.6.12"}, "10.201.6.12/24"},
	}
	for _, c := range cases {
		c.call.cid = c.cid
		if got := n.add(c.call).IPs[0].Address.String(); got != c.want {
			t.Fatalf("ADD %s = %s, want %s", c.cid, got, c.want)
		}
		n.ok(ipamCall{cmd: "CHECK", cid: c.cid})
	}
	before := readIPAMStore(t, n.dataDir, n.name)

	// Taken: the error names the holder, by each way of asking.
	e := n.fails(ipamCall{cmd: "ADD", cid: "thief", cniArgs: "IP=10.201.6.10"}, 0, "10.201.6.10", "req-runtimeconfig")
	t.Logf("taken: code %d: %s", e.Code, e.Msg)
	n.fails(ipamCall{cmd: "ADD", cid: "thief", extra: map[string]any{"runtimeConfig": map[string]any{"ips": []string{"10.201.6.11"}}}}, 0, "req-args")
	n.fails(ipamCall{cmd: "ADD", cid: "thief", extra: map[string]any{"args": map[string]any{"cni": map[string]any{"ips": []string{"10.201.6.12/24"}}}}}, 0, "req-cniargs")
	// Outside the ranges, the gateway, the broadcast address, garbage: code 7.
	n.fails(ipamCall{cmd: "ADD", cid: "thief", cniArgs: "IP=10.99.0.5"}, types.ErrInvalidNetworkConfig, "10.99.0.5", "outside")
	n.fails(ipamCall{cmd: "ADD", cid: "thief", cniArgs: "IP=10.201.6.1"}, types.ErrInvalidNetworkConfig, "10.201.6.1")
	n.fails(ipamCall{cmd: "ADD", cid: "thief", cniArgs: "IP=10.201.6.255"}, types.ErrInvalidNetworkConfig, "10.201.6.255")
	n.fails(ipamCall{cmd: "ADD", cid: "thief", cniArgs: "IP=not-an-ip"}, types.ErrInvalidNetworkConfig, "not-an-ip")
	// Two addresses for one range set.
	n.fails(ipamCall{cmd: "ADD", cid: "thief", cniArgs: "IP=10.201.6.20,10.201.6.21"}, types.ErrInvalidNetworkConfig, "10.201.6.21")

	// The failures left the store as it was.
	after := readIPAMStore(t, n.dataDir, n.name)
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("failed ADDs changed the store:\nbefore %s\nafter  %s", before, after)
	}
	if err := after.consistent(); err != nil {
		t.Fatal(err)
	}
	// The requester that lost can still get a free address without asking.
	if got := n.add(ipamCall{cid: "thief"}).IPs[0].Address.String(); got != "10.201.6.2/24" {
		t.Fatalf("unrequested ADD = %s, want 10.201.6.2/24", got)
	}
}

func TestIPAMIdempotentAdd(t *testing.T) {
	n := newIPAMNet(t, "idem", rangesOf("10.201.7.0/24"))
	first := n.add(ipamCall{cid: "idem"}).IPs[0].Address.String()
	for range 3 {
		if again := n.add(ipamCall{cid: "idem"}).IPs[0].Address.String(); again != first {
			t.Fatalf("repeated ADD = %s, want %s", again, first)
		}
	}
	// Even when the repeat asks for another address, it keeps its own.
	if again := n.add(ipamCall{cid: "idem", cniArgs: "IP=10.201.7.50"}).IPs[0].Address.String(); again != first {
		t.Fatalf("repeated ADD with IP= = %s, want %s", again, first)
	}
	// Another interface of the same container is another attachment.
	second := n.add(ipamCall{cid: "idem", ifName: "net1"}).IPs[0].Address.String()
	if second == first {
		t.Fatalf("net1 got eth0's address %s", first)
	}
	s := readIPAMStore(t, n.dataDir, n.name)
	if err := s.consistent(); err != nil || len(s.ips) != 2 || len(s.owners) != 2 {
		t.Fatalf("store after repeated ADDs: %v\n%s", err, s)
	}

	for i := range 2 {
		if res := n.run(ipamCall{cmd: "DEL", cid: "idem"}); res.exitCode != 0 || len(bytes.TrimSpace(res.stdout)) != 0 {
			t.Fatalf("DEL %d: exit %d stdout %q", i+1, res.exitCode, res.stdout)
		}
	}
	n.fails(ipamCall{cmd: "CHECK", cid: "idem"}, 0, "no reservation")
	n.ok(ipamCall{cmd: "CHECK", cid: "idem", ifName: "net1"})
	n.ok(ipamCall{cmd: "DEL", cid: "never-added"})
	n.ok(ipamCall{cmd: "DEL", cid: "idem", ifName: "net1"})
	n.ok(ipamCall{cmd: "DEL", cid: "idem", ifName: "net1"})
	assertStoreEmpty(t, n.dataDir, n.name)
}

// podnetIPAM is the ipam JSON of podnet-ipam over subnets.
func podnetIPAM(dataDir string, subnets ...string) string {
	b, err := json.Marshal(map[string]any{"type": "podnet-ipam", "dataDir": dataDir, "ranges": rangesOf(subnets...)["ranges"]})
	if err != nil {
		panic(err)
	}
	return string(b)
}

func TestPTPWithPodnetIPAM(t *testing.T) {
	dataDir := t.TempDir()
	conflist := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"ptpnet","plugins":[{"type":"ptp","ipMasq":false,"ipam":%s}]}`,
		podnetIPAM(dataDir, "10.201.8.0/24"))
	node := nettest.NewNode(t)
	rt := nettest.NewRuntime(t, node, conflist, nettest.BinDir(t, "podnet-ipam"), nettest.RefToolsDir(t))
	if err := rt.Status(); err != nil {
		t.Fatalf("STATUS through ptp: %v", err)
	}
	var pods []*nettest.Pod
	for i := range 2 {
		podNS := nettest.NewNetNS(t)
		conf := nettest.RuntimeConf(fmt.Sprintf("ptp-%d", i), podNS, "eth0")
		res, err := rt.Add(conf)
		if err != nil {
			t.Fatalf("ADD pod %d: %v", i, err)
		}
		pods = append(pods, &nettest.Pod{NS: podNS, RT: conf, Result: res})
	}
	a, b := pods[0], pods[1]
	gotA, gotB := ipConfigs(a.Result), ipConfigs(b.Result)
	if !slices.Equal(gotA, []string{"10.201.8.2/24 gw 10.201.8.1"}) || !slices.Equal(gotB, []string{"10.201.8.3/24 gw 10.201.8.1"}) {
		t.Fatalf("addresses = %v and %v, want 10.201.8.2/24 and 10.201.8.3/24 via 10.201.8.1", gotA, gotB)
	}
	if pod := readPod(t, a.NS, "eth0"); !slices.Equal(pod.addrs, []string{"10.201.8.2/24"}) {
		t.Fatalf("pod a addresses = %v", pod.addrs)
	}
	if err := nettest.Ping(a.NS, b.Result.IPs[0].Address.IP.String()); err != nil {
		t.Fatal(err)
	}
	if err := nettest.Ping(b.NS, a.Result.IPs[0].Address.IP.String()); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		if err := rt.Check(p.RT); err != nil {
			t.Fatalf("CHECK %s: %v", p.RT.ContainerID, err)
		}
	}
	s := readIPAMStore(t, dataDir, "ptpnet")
	if err := s.consistent(); err != nil || len(s.ips) != 2 || s.ips["10.201.8.2"] != "ptp-0:eth0" {
		t.Fatalf("store: %v\n%s", err, s)
	}
	for _, p := range pods {
		if err := rt.Del(p.RT); err != nil {
			t.Fatalf("DEL %s: %v", p.RT.ContainerID, err)
		}
	}
	assertStoreEmpty(t, dataDir, "ptpnet")
	if links := node.Links(); len(links) > 0 {
		t.Fatalf("links left in the node: %v", links)
	}
}

func TestPodnetWithPodnetIPAM(t *testing.T) {
	bin := nettest.BinDir(t, "podnet", "podnet-ipam")
	for _, mode := range []struct {
		name   string
		exec   bool
		subnet string
	}{
		{"in-process", false, "10.201.9"},
		{"exec", true, "10.201.10"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			// CNI_PATH holds podnet and a podnet-ipam wrapper that logs each
			// exec and then runs the real binary.
			pathDir := t.TempDir()
			logFile := filepath.Join(t.TempDir(), "ipam-exec.log")
			if err := os.Symlink(filepath.Join(bin, "podnet"), filepath.Join(pathDir, "podnet")); err != nil {
				t.Fatal(err)
			}
			wrapper := fmt.Sprintf("#!/bin/sh\necho \"$CNI_COMMAND $CNI_CONTAINERID\" >> %q\nexec %q \"$@\"\n", logFile, filepath.Join(bin, "podnet-ipam"))
			if err := os.WriteFile(filepath.Join(pathDir, "podnet-ipam"), []byte(wrapper), 0o755); err != nil {
				t.Fatal(err)
			}
			dataDir := t.TempDir()
			extra := map[string]any{"stateDir": t.TempDir()}
			if mode.exec {
				extra["execIPAM"] = true
			}
			conflist := podnetList("1.1.0", podnetIPAM(dataDir, mode.subnet+".0/24"), extra)
			node := nettest.NewNode(t)
			rt := nettest.NewRuntime(t, node, conflist, pathDir)

			if err := rt.Status(); err != nil {
				t.Fatalf("STATUS: %v", err)
			}
			var pods []*nettest.Pod
			for i := range 3 {
				podNS := nettest.NewNetNS(t)
				conf := nettest.RuntimeConf(fmt.Sprintf("pi-%d", i), podNS, "eth0",
					[2]string{"K8S_POD_NAMESPACE", "default"}, [2]string{"K8S_POD_NAME", fmt.Sprintf("pod-%d", i)})
				res, err := rt.Add(conf)
				if err != nil {
					t.Fatalf("ADD pod %d: %v", i, err)
				}
				want := fmt.Sprintf("%s.%d/32", mode.subnet, 2+i)
				if len(res.IPs) != 1 || res.IPs[0].Address.String() != want {
					t.Fatalf("pod %d result ips = %v, want %s", i, ipConfigs(res), want)
				}
				if pod := readPod(t, podNS, "eth0"); !slices.Equal(pod.addrs, []string{want}) {
					t.Fatalf("pod %d addresses = %v, want %s", i, pod.addrs, want)
				}
				pods = append(pods, &nettest.Pod{NS: podNS, RT: conf, Result: res})
			}
			for i, p := range pods {
				if err := rt.Check(p.RT); err != nil {
					t.Fatalf("CHECK pod %d: %v", i, err)
				}
				if err := nettest.Ping(p.NS, nettest.NodeAddr); err != nil {
					t.Fatal(err)
				}
				for j, q := range pods {
					if i != j {
						if err := nettest.Ping(p.NS, q.Result.IPs[0].Address.IP.String()); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			s := readIPAMStore(t, dataDir, "podnet")
			if err := s.consistent(); err != nil || len(s.ips) != 3 {
				t.Fatalf("store: %v\n%s", err, s)
			}

			// GC from a runtime without cached attachments, so that only
			// the plugin's GC (and through it IPAM's) can release pod 2.
			gcRT := nettest.NewRuntime(t, node, conflist, pathDir)
			if err := gcRT.GC([]types.GCAttachment{{ContainerID: "pi-0", IfName: "eth0"}, {ContainerID: "pi-1", IfName: "eth0"}}); err != nil {
				t.Fatalf("GC: %v", err)
			}
			s = readIPAMStore(t, dataDir, "podnet")
			if err := s.consistent(); err != nil || len(s.ips) != 2 || s.ips[mode.subnet+".4"] != "" {
				t.Fatalf("store after GC: %v\n%s", err, s)
			}
			if links := node.Links(); len(links) != 2 {
				t.Fatalf("links after GC = %v, want the two kept pods' veths", links)
			}
			if err := nettest.Ping(pods[0].NS, pods[1].Result.IPs[0].Address.IP.String()); err != nil {
				t.Fatalf("kept pods after GC: %v", err)
			}
			// DEL of all three: pod 2's finds nothing left, which is success.
			for i, p := range pods {
				if err := rt.Del(p.RT); err != nil {
					t.Fatalf("DEL pod %d: %v", i, err)
				}
			}
			assertClean(t, rt, "")
			if routes := node.RoutesWithProto(contract.RouteProtocol); len(routes) > 0 {
				t.Fatalf("proto %d routes left: %v", contract.RouteProtocol, routes)
			}
			assertStoreEmpty(t, dataDir, "podnet")

			// Which path ran: the wrapper logs only when podnet execs it.
			log, err := os.ReadFile(logFile)
			if err != nil && !os.IsNotExist(err) {
				t.Fatal(err)
			}
			t.Logf("podnet-ipam execs: %q", log)
			if mode.exec {
				for _, want := range []string{"STATUS ", "ADD pi-0", "ADD pi-2", "CHECK pi-1", "GC ", "DEL pi-0", "DEL pi-2"} {
					if !strings.Contains(string(log), want) {
						t.Errorf("exec mode: wrapper log %q lacks %q: podnet did not exec podnet-ipam", log, want)
					}
				}
			} else if len(log) != 0 {
				t.Errorf("in-process mode: podnet exec'd podnet-ipam:\n%s", log)
			}
		})
	}
}
