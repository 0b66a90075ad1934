package runtimee2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/plugins/veth"
)

// storeDir is the podnet-ipam store of the network in use.
func (h *harness) storeDir() string {
	return filepath.Join(h.net.dataDir, networkName(h.net))
}

// networkName is the "name" of the shipped conflists.
func networkName(*network) string { return "podnet" }

// reservations reads the podnet-ipam store: address -> "containerID:ifname"
// from ips/, and the owner index entries (owners/), sorted. Files that
// should never be seen (temp files) are returned among the owners.
func (h *harness) reservations() (map[string]string, []string) {
	ips := map[string]string{}
	entries, _ := os.ReadDir(filepath.Join(h.storeDir(), "ips"))
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(h.storeDir(), "ips", e.Name()))
		if err != nil {
			ips[e.Name()] = "unreadable: " + err.Error()
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		ips[e.Name()] = strings.Join(lines, ":")
	}
	var owners []string
	entries, _ = os.ReadDir(filepath.Join(h.storeDir(), "owners"))
	for _, e := range entries {
		owners = append(owners, e.Name())
	}
	sort.Strings(owners)
	return ips, owners
}

// hostVeths lists the node's veths in service: name -> owner
// ("containerID:ifname" from the alias podnet sets, or the raw alias).
// Pairs that DEL detached are not listed: the kernel removes them with
// their pod netns (waitDetachedGone).
func (h *harness) hostVeths() map[string]string {
	return h.veths(func(l netlink.Link) bool { return !veth.IsDetached(l) })
}

// waitDetachedGone waits until the node has no detached veth left, and
// returns those still there after limit.
func (h *harness) waitDetachedGone(limit time.Duration) []string {
	deadline := time.Now().Add(limit)
	for {
		left := keys(h.veths(veth.IsDetached))
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *harness) veths(keep func(netlink.Link) bool) map[string]string {
	out := map[string]string{}
	// Not node.Do: this also runs on worker goroutines, where a t.Fatal
	// must not happen; an error shows up as a leftover instead.
	err := h.node.NS.Do(func(ns.NetNS) error {
		links, err := netlink.LinkList()
		if err != nil {
			return err
		}
		for _, l := range links {
			if _, ok := l.(*netlink.Veth); !ok || !keep(l) {
				continue
			}
			if o, ok := veth.ParseAlias(l.Attrs().Alias); ok {
				out[l.Attrs().Name] = o.ContainerID + ":" + o.IfName
			} else {
				out[l.Attrs().Name] = "alias " + l.Attrs().Alias
			}
		}
		return nil
	})
	if err != nil {
		out["(error listing the node's links: "+err.Error()+")"] = ""
	}
	return out
}

// podRoutes lists the destinations of the node's podnet routes (proto 77).
func (h *harness) podRoutes() []string {
	var out []string
	for _, r := range h.node.RoutesWithProto(contract.RouteProtocol) {
		if r.Dst != nil {
			out = append(out, r.Dst.String())
		} else {
			out = append(out, "default")
		}
	}
	sort.Strings(out)
	return out
}

// netnsLeft lists the pod netns containerd still has: nsfs mounts and
// files in its netns dir (netns_mounts_under_state_dir).
func (h *harness) netnsLeft() []string {
	var out []string
	for _, m := range mountsUnder(h.dir) {
		if m.fsType == "nsfs" {
			out = append(out, m.point)
		}
	}
	files, _ := filepath.Glob(filepath.Join(h.dir, "state", "io.containerd.grpc.v1.cri", "netns", "*"))
	for _, f := range files {
		if !contains(out, f) {
			out = append(out, f+" (file)")
		}
	}
	sort.Strings(out)
	return out
}

// leftovers describes everything a torn-down network should not have
// left: CNI state (sandboxes, veths, podnet routes, reservations) and
// runtime state (netns, runc containers, sandbox cgroups, libcni cache
// entries). Empty means clean.
func (h *harness) leftovers() []string {
	return append(h.cniLeftovers(), h.runtimeLeftovers()...)
}

// cniLeftovers is what podnet is answerable for: sandboxes the runtime
// still lists, node veths, podnet routes, podnet-ipam reservations.
func (h *harness) cniLeftovers() []string {
	var out []string
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if pods, err := h.cri.List(ctx); err != nil {
		out = append(out, "list sandboxes: "+err.Error())
	} else {
		var ids []string
		for _, p := range pods {
			ids = append(ids, fmt.Sprintf("%.12s(%s,%s)", p.Id, p.Metadata.Name, p.State))
		}
		out = appendItems(out, "containerd sandboxes", ids)
	}
	out = appendItems(out, "veths", keys(h.hostVeths()))
	out = appendItems(out, "detached veths 10 s after their pod netns was removed", h.waitDetachedGone(10*time.Second))
	out = appendItems(out, "proto-77 routes", h.podRoutes())
	ips, owners := h.reservations()
	out = appendItems(out, "reservation files", keys(ips))
	return appendItems(out, "owner index entries", owners)
}

// runtimeLeftovers is what the runtime is answerable for: pod netns, runc
// containers, sandbox cgroups and libcni cache entries of this run's pods.
func (h *harness) runtimeLeftovers() []string {
	var out []string
	out = appendItems(out, "containerd shims", h.shimsLeft())
	out = appendItems(out, "pod netns", h.netnsLeft())
	out = appendItems(out, "runc containers", runcContainers(h.runcRoot()))
	out = appendItems(out, "sandbox cgroups", cgroupChildren(h.cgroupParent))
	return appendItems(out, "libcni cache entries", keys(cacheEntries(h.podNamespace)))
}

// shimsLeft lists the shims of this run's containerd, waiting up to 3 s
// for those of just-removed sandboxes to exit.
func (h *harness) shimsLeft() []string {
	deadline := time.Now().Add(3 * time.Second)
	for {
		pids := shimPIDs(h.dir)
		if len(pids) == 0 || time.Now().After(deadline) {
			var out []string
			for _, pid := range pids {
				out = append(out, fmt.Sprintf("pid %d (%s)", pid, shimID(pid)))
			}
			return out
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// shimID is the sandbox a shim serves (its -id), abbreviated.
func shimID(pid int) string {
	return fmt.Sprintf("%.12s", shimArg(pid, "-id"))
}

func appendItems(out []string, what string, items []string) []string {
	if len(items) == 0 {
		return out
	}
	return append(out, fmt.Sprintf("%d %s: %s", len(items), what, abbreviate(items)))
}

func (h *harness) runcRoot() string { return filepath.Join(h.dir, "runc", criNamespace) }

// cgroupChildren lists the sandbox cgroups under parent in the memory
// hierarchy (runc creates one per sandbox in every hierarchy).
func cgroupChildren(parent string) []string {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/memory", parent, "*"))
	var out []string
	for _, d := range dirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			out = append(out, filepath.Base(d))
		}
	}
	return out
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func abbreviate(items []string) string {
	if len(items) > 6 {
		return strings.Join(items[:6], ", ") + fmt.Sprintf(", ... (%d more)", len(items)-6)
	}
	return strings.Join(items, ", ")
}
