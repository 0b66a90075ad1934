package runtimee2e

// podnet-routed on the harness's node, against a real kube-apiserver: it
// hosts the leak reconcile, which asks this harness's containerd (CRI
// ListPodSandbox) which pods are alive.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/nodestate"
	tcluster "github.com/podnet/podnet/test/cluster"
	"github.com/podnet/podnet/test/kapi"
	"github.com/podnet/podnet/test/nettest"
)

const (
	// routedNode is the Node podnet-routed runs as (the name the harness
	// writes in node.json too).
	routedNode = "runtime-node"
	// underlayDev carries the node's InternalIP (podnet-routed takes the
	// pod MTU from it): a bridge without ports, as there is no other node
	// to reach (this kernel has no dummy links, and a veth would count
	// among the node's pod veths).
	underlayDev  = "ul0"
	underlayAddr = "10.99.0.1"
	clusterCIDR  = "10.244.0.0/16"
	routedHealth = "127.0.0.1:9099"
	routedMetric = "127.0.0.1:9098"
)

// routed is podnet-routed on the harness's node.
type routed struct {
	h          *harness
	bin        string
	kubeconfig string
	log        string
	proc       *nettest.Proc
	started    time.Time
	// criSocket is the --cri-socket start passes ("": the harness's
	// containerd).
	criSocket string
}

// newRouted starts a kube-apiserver (on the machine's loopback, reached
// from the node netns through a forwarder at the same address), gives the
// node an underlay link with its InternalIP and creates its Node with the
// PodCIDR of the network in use. podnet-routed is started by start.
func (h *harness) newRouted(t *testing.T) *routed {
	t.Helper()
	r := &routed{h: h, bin: filepath.Join(nettest.BinDir(t, "podnet-routed"), "podnet-routed"), log: filepath.Join(h.dir, "podnet-routed.log")}
	start := time.Now()
	api := kapi.Start(t) // fails (never skips) without PODNET_KAPI_DIR
	t.Logf("kube-apiserver + etcd up in %v", time.Since(start).Round(time.Millisecond))
	apiAddr := fmt.Sprintf("127.0.0.1:%d", api.Port)
	nettest.Forward(t, h.node.NS, apiAddr, apiAddr, nil)
	r.kubeconfig = api.Kubeconfig(kapi.AdminUser, "")

	nettest.Do(t, h.node.NS, func() error {
		l := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: underlayDev, MTU: 1500}}
		if err := netlink.LinkAdd(l); err != nil {
			return fmt.Errorf("add %s: %w", underlayDev, err)
		}
		a, _ := netlink.ParseAddr(underlayAddr + "/24")
		if err := netlink.AddrAdd(l, a); err != nil {
			return err
		}
		return netlink.LinkSetUp(l)
	})
	t.Cleanup(func() {
		_ = h.node.NS.Do(func(ns.NetNS) error {
			if l, err := netlink.LinkByName(underlayDev); err == nil {
				return netlink.LinkDel(l)
			}
			return nil
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := tcluster.CreateNode(ctx, api.Client(), routedNode, underlayAddr, h.net.podCIDR); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if r.proc != nil {
			if err := r.proc.Stop(10 * time.Second); err != nil {
				t.Errorf("podnet-routed: %v", err)
			}
		}
		if t.Failed() {
			t.Logf("podnet-routed log (tail):\n%s", nettest.Tail(r.log, 40))
		}
	})
	return r
}

// start starts podnet-routed with the leak reconcile every interval
// (grace grace) over the IPAM store of the network in use, asking this
// harness's containerd.
func (r *routed) start(t *testing.T, interval, grace time.Duration) {
	t.Helper()
	h := r.h
	socket := r.criSocket
	if socket == "" {
		socket = "unix://" + h.socket()
	}
	p, err := nettest.StartProc(h.node.NS, true, r.log, r.bin,
		"--kubeconfig="+r.kubeconfig, "--node-name="+routedNode, "--encap=none", "--cluster-cidr="+clusterCIDR,
		"--state-dir="+h.net.stateDir, "--ipam-data-dir="+h.net.dataDir, "--cri-socket="+socket,
		"--reconcile-interval="+interval.String(), "--reconcile-grace="+grace.String(),
		"--health-addr="+routedHealth, "--metrics-addr="+routedMetric, "--log-level=info")
	if err != nil {
		t.Fatal(err)
	}
	r.proc, r.started = p, time.Now()
}

// waitReady waits until podnet-routed has written node.json (its own:
// encap none) with the node's PodCIDR and answers /readyz.
func (r *routed) waitReady(t *testing.T) time.Duration {
	t.Helper()
	return nettest.Eventually(t, 60*time.Second, "podnet-routed ready", func() error {
		if err := r.proc.Alive(); err != nil {
			return err
		}
		st, err := nodestate.Read(r.h.net.stateDir)
		if err != nil {
			return err
		}
		if st.NodeName != routedNode || st.Encap != "none" || len(st.PodCIDRs) != 1 || st.PodCIDRs[0] != r.h.net.podCIDR {
			return fmt.Errorf("node.json %+v is not podnet-routed's for %s", st, r.h.net.podCIDR)
		}
		code, body, err := nettest.GetIn(r.h.node.NS, "http://"+routedHealth+"/readyz")
		if err != nil {
			return err
		}
		if code != http.StatusOK {
			return fmt.Errorf("/readyz %d: %s", code, strings.TrimSpace(body))
		}
		return nil
	})
}

// kill SIGKILLs podnet-routed (as a reboot does).
func (r *routed) kill() {
	if r.proc == nil {
		return
	}
	_ = r.proc.Cmd.Process.Kill()
	<-r.proc.Done()
	r.proc = nil
}

// stop stops podnet-routed with SIGTERM.
func (r *routed) stop(t *testing.T) {
	t.Helper()
	if r.proc == nil {
		return
	}
	err := r.proc.Stop(10 * time.Second)
	r.proc = nil
	if err != nil {
		t.Errorf("podnet-routed: %v\n%s", err, nettest.Tail(r.log, 20))
	}
}

// cleanup runs `podnet-routed --cleanup` in the node netns (stopped
// first): its routes, nft table and node.json go.
func (r *routed) cleanup(t *testing.T) {
	t.Helper()
	r.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if out, err := nettest.ExecIn(ctx, r.h.node.NS, r.bin, "--cleanup", "--state-dir="+r.h.net.stateDir); err != nil {
		t.Errorf("podnet-routed --cleanup: %v\n%s", err, out)
	}
}

// metrics scrapes podnet-routed's /metrics.
func (r *routed) metrics() (map[string]float64, error) {
	code, body, err := nettest.GetIn(r.h.node.NS, "http://"+routedMetric+"/metrics")
	if err != nil {
		return nil, err
	}
	if code != http.StatusOK {
		return nil, fmt.Errorf("/metrics %d", code)
	}
	return nettest.ParseMetrics(body)
}

// reconcileCounts are the reconcile's counters: passes begun and
// attachments reclaimed by kind.
type reconcileCounts struct {
	passes    int
	reclaimed map[string]int
}

var reclaimKinds = []string{"reboot", "runtime", "netns", "orphan"}

func (r *routed) counts() (reconcileCounts, error) {
	m, err := r.metrics()
	if err != nil {
		return reconcileCounts{}, err
	}
	passes, ok := m["podnet_reconcile_passes_total"]
	if !ok {
		return reconcileCounts{}, errors.New("no podnet_reconcile_passes_total in /metrics (reconcile off?)")
	}
	c := reconcileCounts{passes: int(passes), reclaimed: map[string]int{}}
	for _, k := range reclaimKinds {
		c.reclaimed[k] = int(m[`podnet_leaks_reclaimed_total{kind="`+k+`"}`])
	}
	return c, nil
}

// checkReclaimed fails the test unless the reclaim counters are want
// (kinds not in want: 0).
func (r *routed) checkReclaimed(t *testing.T, want map[string]int) reconcileCounts {
	t.Helper()
	c, err := r.counts()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range reclaimKinds {
		if c.reclaimed[k] != want[k] {
			t.Errorf(`podnet_leaks_reclaimed_total{kind=%q} = %d, want %d`, k, c.reclaimed[k], want[k])
		}
	}
	return c
}
