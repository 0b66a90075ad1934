package runtimee2e

// Issue 31, "must show 4" with a real runtime: podnet-routed's leak
// reconcile pointed at the wrong runtime (a second containerd with CRI
// enabled and no pods, as a containerd left on a CRI-O node would be)
// while the pods of the real one run.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/test/nettest"
	"github.com/podnet/podnet/test/runtime/criclient"
)

// wrongRuntimeIntervals is how many reconcile intervals podnet-routed
// runs against the wrong runtime (each pass would free every live pod on
// the code before issue 31).
const wrongRuntimeIntervals = 4

// reconcileWrongRuntime: podnet-routed restarts with --cri-socket of a
// second containerd (its own scratch dirs and netns, CRI enabled, no
// pods), live being the pods of the real one, all past the grace. For
// wrongRuntimeIntervals passes no live pod loses its reservation, owner
// index entry, host veth or host route, nor a ping (every 100 ms); the
// refusal is logged once, podnet_reconcile_runtime_mismatch is 1 and
// podnet_reconcile_runtime_refused_total counts every pass, and /readyz
// answers 200 with the warning. podnet-routed is stopped at the end (the
// reboot phase starts it again, asking the real containerd).
func (h *harness) reconcileWrongRuntime(t *testing.T, r *routed, live []*criclient.Sandbox) {
	wrong := h.startWrongContainerd(t)
	c, err := criclient.Dial(wrong)
	must(t, err)
	defer c.Close()
	nettest.Eventually(t, 30*time.Second, "the second containerd's CRI answering", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		sbs, err := c.List(ctx)
		if err == nil && len(sbs) != 0 {
			return fmt.Errorf("the second containerd lists %d sandboxes, want none", len(sbs))
		}
		return err
	})
	pr := h.probe(t, live)
	r.stop(t)
	r.criSocket = "unix://" + wrong
	defer func() { r.criSocket = "" }()
	r.start(t, reconcileInterval, reconcileGrace)
	ready := r.waitReady(t)
	h.note(t, "podnet-routed restarted with --cri-socket of a second containerd (CRI enabled, no pods, own netns and dirs) while %d pods of the real one run; ready in %v",
		len(live), ready.Round(time.Millisecond))

	c0, err := r.counts()
	must(t, err)
	start := time.Now()
	for {
		h.checkAddresses(t, live)
		c, err := r.counts()
		must(t, err)
		if c.passes >= c0.passes+wrongRuntimeIntervals+1 {
			break
		}
		if time.Since(start) > waitLimit {
			t.Fatalf("%d reconcile passes in %v, want %d", c.passes-c0.passes, waitLimit, wrongRuntimeIntervals+1)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if problems := h.poolProblems(live); len(problems) > 0 {
		t.Errorf("after %d passes against the wrong runtime:\n  %s", wrongRuntimeIntervals, strings.Join(problems, "\n  "))
	}
	res := pr.stop()
	if res.Lost > 0 || len(res.Wrong) > 0 || res.Sent == 0 {
		t.Errorf("the live pods did not answer every ping: %s", res)
	}
	m, err := r.metrics()
	must(t, err)
	// (A pass counts when it begins, its refusal once it has asked.)
	passes, refused := int(m["podnet_reconcile_passes_total"]), int(m["podnet_reconcile_runtime_refused_total"])
	if m["podnet_reconcile_runtime_mismatch"] != 1 || refused < passes-1 || refused > passes {
		t.Errorf("podnet_reconcile_runtime_mismatch %v, podnet_reconcile_runtime_refused_total %d after %d passes: want 1 and every pass",
			m["podnet_reconcile_runtime_mismatch"], refused, passes)
	}
	r.checkReclaimed(t, nil)
	logs := r.proc.LogRecords("leak reconcile: the runtime lists none of the node's live pods; taken for the wrong runtime, its answer is ignored")
	if len(logs) != 1 || logs[0]["livePods"] != float64(len(live)) || logs[0]["socket"] != r.criSocket {
		t.Errorf("mismatch log records %v: want one, with socket %s and livePods %d", logs, r.criSocket, len(live))
	}
	code, body, err := nettest.GetIn(h.node.NS, "http://"+routedHealth+"/readyz")
	must(t, err)
	want := fmt.Sprintf("warning: leak reconcile: the runtime at %s lists none of the node's %d live pods", r.criSocket, len(live))
	if code != http.StatusOK || !strings.Contains(body, want) {
		t.Errorf("/readyz %d %q, want 200 with %q", code, body, want)
	}
	h.note(t, "against the wrong runtime for %d passes: every live pod kept its address, veth and route (%s); the refusal logged once, "+
		"podnet_reconcile_runtime_mismatch 1, podnet_reconcile_runtime_refused_total %d, /readyz 200 with %q",
		passes, res, refused, strings.TrimSpace(strings.SplitN(body, "\n", 2)[1]))
	r.stop(t)
}

// startWrongContainerd starts a second containerd with CRI enabled and no
// CNI config, on scratch dirs of its own under h.dir and in a netns of
// its own, stopped when the test ends. It returns its socket.
func (h *harness) startWrongContainerd(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(h.dir, "wrong-runtime")
	must(t, os.MkdirAll(filepath.Join(dir, "net.d"), 0o755))
	tmpl, err := os.ReadFile(filepath.Join(h.repo, "scripts/runtime/containerd.toml.in"))
	must(t, err)
	cfg := filepath.Join(dir, "containerd.toml")
	must(t, os.WriteFile(cfg, []byte(strings.NewReplacer(
		"@DIR@", dir, "@BIN_DIR@", h.binDir, "@CONF_DIR@", filepath.Join(dir, "net.d"), "@SANDBOX_IMAGE@", sandboxImage,
	).Replace(string(tmpl))), 0o644))
	netns := nettest.NewNetNS(t)
	nettest.Do(t, netns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	})
	logFile, err := os.OpenFile(filepath.Join(dir, "containerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	must(t, err)
	defer logFile.Close()
	cmd := exec.Command("nsenter", "--net="+netns.Path(), "containerd", "--config", cfg, "--log-level", "info")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	must(t, cmd.Start())
	h.writeMeta(t, wrongContainerdPID, strconv.Itoa(cmd.Process.Pid))
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("second containerd log (tail):\n%s", nettest.Tail(filepath.Join(dir, "containerd.log"), 20))
		}
	})
	sock := filepath.Join(dir, "containerd.sock")
	nettest.Eventually(t, 30*time.Second, "the second containerd's socket", func() error {
		select {
		case <-done:
			return errors.New("the second containerd exited")
		default:
		}
		_, err := os.Stat(sock)
		return err
	})
	return sock
}

// keptWhileInService checks, over two whole reconcile passes, that the
// sandboxes the runtime forgot (leaked) keep their address, veth and
// route while their netns lives (their host veths in service), as do the
// live pods; podnet_reconcile_overruled{rule="runtime"} counts them and
// each is logged once.
func (h *harness) keptWhileInService(t *testing.T, r *routed, live, leaked []*criclient.Sandbox) {
	t.Helper()
	c0, err := r.counts()
	must(t, err)
	all := append(append([]*criclient.Sandbox{}, live...), leaked...)
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		h.checkAddresses(t, all)
		c, err := r.counts()
		must(t, err)
		if c.passes >= c0.passes+3 {
			break
		}
		if time.Since(start) > waitLimit {
			t.Fatalf("%d reconcile passes in %v, want 3", c.passes-c0.passes, waitLimit)
		}
	}
	if problems := h.poolProblems(all); len(problems) > 0 {
		t.Fatalf("the forgotten sandboxes with their netns, after 2 whole passes:\n  %s", strings.Join(problems, "\n  "))
	}
	m, err := r.metrics()
	must(t, err)
	if v := m[`podnet_reconcile_overruled{rule="runtime"}`]; int(v) != len(leaked) {
		t.Errorf(`podnet_reconcile_overruled{rule="runtime"} = %v, want %d`, v, len(leaked))
	}
	if v := m["podnet_reconcile_runtime_mismatch"]; v != 0 {
		t.Errorf("podnet_reconcile_runtime_mismatch = %v with the right runtime, want 0", v)
	}
	for _, p := range leaked {
		n := 0
		for _, rec := range r.proc.LogRecords("leak reconcile: kept an attachment whose runtime says its pod is dead: its host veth is in service") {
			if rec["container"] == p.ID {
				n++
			}
		}
		if n != 1 {
			t.Errorf("forgotten sandbox %s: %d \"kept an attachment\" log records, want 1", p.Name, n)
		}
	}
	r.checkReclaimed(t, nil)
	h.note(t, "the %d sandboxes containerd forgot, their netns and veths still there, were kept over 2 whole passes (their host veths in service): "+
		"podnet_reconcile_overruled{rule=\"runtime\"} %d, one log line each", len(leaked), int(m[`podnet_reconcile_overruled{rule="runtime"}`]))
}

// dropNetns unmounts and removes the netns of pods (no process is left
// in them) and waits until their host veths are gone with them. It
// returns when they were.
func (h *harness) dropNetns(t *testing.T, pods []*criclient.Sandbox) time.Time {
	t.Helper()
	for _, p := range pods {
		if err := unmount(p.NetNS); err != nil {
			t.Fatalf("unmount the netns of %s: %v", p.Name, err)
		}
		_ = os.Remove(p.NetNS)
	}
	nettest.Eventually(t, 10*time.Second, "the forgotten sandboxes' veths gone with their netns", func() error {
		veths := h.hostVeths()
		for _, p := range pods {
			for _, o := range veths {
				if o == p.ID+":"+podIfName {
					return fmt.Errorf("veth of %s still there", p.Name)
				}
			}
		}
		return nil
	})
	return time.Now()
}
