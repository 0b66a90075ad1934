package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// Pod is a pod sandbox: a netns attached to its node's network by the
// plugins of conf/10-podnet.conflist.
type Pod struct {
	Name string // also K8S_POD_NAME
	// Namespace is K8S_POD_NAMESPACE ("default" unless AddPodSpec says).
	Namespace   string
	Node        *Node
	NS          *NetNS
	IP          netip.Addr // IPv6 in an IPv6-only cluster
	IP6         netip.Addr // dual-stack clusters only
	ContainerID string
	Result      *current.Result
	// ADD is how long the CNI ADD took (the plugin chain through libcni,
	// the plugin's wait for the node's NetworkPolicy engine included).
	ADD time.Duration

	rt      *libcni.RuntimeConf
	mu      sync.Mutex
	servers []io.Closer
}

// conflist reads the shipped conflist; initCNI changes only its
// directories for each node.
func conflist(path string) ([]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if _, err := libcni.ConfListFromBytes(data); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return data, nil
}

// NodeConflist is the shipped conflist with the node's stateDir (node.json)
// and IPAM dataDir, so that nodes sharing this machine's filesystem keep
// their files apart, and in a dual-stack cluster a second range,
// usePodCidrIPv6; in an IPv6-only cluster its usePodCidr reads
// usePodCidrIPv6 (the node has no IPv4 PodCIDR), and the IPAM's exclude
// (ExcludeAddrs). Nothing else changes.
func (n *Node) NodeConflist() ([]byte, error) {
	var conf map[string]any
	if err := json.Unmarshal(n.c.conflist, &conf); err != nil {
		return nil, err
	}
	plugins, _ := conf["plugins"].([]any)
	found := false
	for _, p := range plugins {
		plugin, _ := p.(map[string]any)
		if plugin["type"] != "podnet" && plugin["type"] != "podnet-bridge" {
			continue
		}
		found = true
		plugin["stateDir"] = n.StateDir
		ipam, _ := plugin["ipam"].(map[string]any)
		if ipam == nil {
			return nil, errors.New("conflist: podnet plugin without ipam")
		}
		ipam["dataDir"] = n.DataDir
		if len(n.exclude) > 0 {
			ipam["exclude"] = n.exclude
		}
		ranges, _ := ipam["ranges"].([]any)
		switch {
		case n.c.Cfg.IPv6Only():
			found6 := false
			for _, set := range ranges {
				rs, _ := set.([]any)
				for _, r := range rs {
					if rc, _ := r.(map[string]any); rc != nil && rc["subnet"] == "usePodCidr" {
						rc["subnet"] = "usePodCidrIPv6"
						found6 = true
					}
				}
			}
			if !found6 {
				return nil, errors.New("conflist: no usePodCidr range to make usePodCidrIPv6")
			}
		case n.c.Cfg.ClusterCIDR6 != "":
			// dual-stack: an address of each family, as ipam/README shows
			ipam["ranges"] = append(ranges, []any{map[string]any{"subnet": "usePodCidrIPv6"}})
		}
	}
	if !found {
		return nil, errors.New("conflist: no podnet or podnet-bridge plugin")
	}
	return json.MarshalIndent(conf, "", "  ")
}

// ExcludeAddrs keeps the node's IPAM from handing out cidrs (addresses or
// CIDRs: podnet-ipam's exclude) from the node's next pod on: for a test
// that gives Pod objects without a sandbox addresses of the node's
// PodCIDR, which the IPAM would otherwise hand out again.
func (n *Node) ExcludeAddrs(cidrs ...string) error {
	n.exclude = slices.Clone(cidrs)
	return n.initCNI()
}

func (n *Node) initCNI() error {
	data, err := n.NodeConflist()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(n.Dir, "10-podnet.conflist"), data, 0o644); err != nil {
		return err
	}
	if n.list, err = libcni.ConfListFromBytes(data); err != nil {
		return err
	}
	n.cni = libcni.NewCNIConfigWithCacheDir([]string{n.c.Cfg.BinDir}, filepath.Join(n.Dir, "cni-cache"), nil)
	return nil
}

// AddPod creates a pod netns and runs CNI ADD for it in the node netns,
// as a runtime does (eth0, K8S_POD_* args, result cache), in namespace
// "default". With Config.NetworkPolicy or Config.PodObjects the pod also
// has its Pod object (see AddPodSpec).
func (n *Node) AddPod(ctx context.Context, name string) (*Pod, error) {
	return n.AddPodSpec(ctx, PodSpec{Name: name})
}

// AddPodSpec is AddPod with the pod's namespace, labels and container
// ports. With Config.NetworkPolicy or Config.PodObjects it does what the
// scheduler and kubelet do around the CNI ADD: the Pod object (namespace,
// name, labels, spec.nodeName, one container with the ports) exists before
// the ADD, and its status.podIPs are set after it.
func (n *Node) AddPodSpec(ctx context.Context, spec PodSpec) (*Pod, error) {
	name := spec.Name
	if spec.Namespace == "" {
		spec.Namespace = "default"
	}
	if name == "" {
		n.podSeq++
		name = fmt.Sprintf("%s-%c", n.Name, 'a'+rune(n.podSeq-1)%26)
	}
	netns, err := n.c.newNetNS("pod-" + name)
	if err != nil {
		return nil, err
	}
	id := make([]byte, 32)
	_, _ = rand.Read(id)
	p := &Pod{Name: name, Namespace: spec.Namespace, Node: n, NS: netns, ContainerID: hex.EncodeToString(id)}
	spec.Name = name
	if n.c.podObjects() {
		if err := n.c.createPodObject(ctx, n, spec); err != nil {
			return nil, errors.Join(err, n.c.dropNetNS(netns))
		}
	}
	p.rt = &libcni.RuntimeConf{
		ContainerID: p.ContainerID, NetNS: netns.Path(), IfName: "eth0",
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", spec.Namespace},
			{"K8S_POD_NAME", name},
			{"K8S_POD_INFRA_CONTAINER_ID", p.ContainerID},
		},
	}
	var res types.Result
	err = n.NS.Do(func() error {
		var err error
		start := time.Now()
		res, err = n.cni.AddNetworkList(ctx, n.list, p.rt)
		p.ADD = time.Since(start)
		return err
	})
	if err != nil {
		// As a runtime does after a failed ADD: DEL, then drop the sandbox.
		_ = n.NS.Do(func() error { return n.cni.DelNetworkList(ctx, n.list, p.rt) })
		return nil, errors.Join(fmt.Errorf("CNI ADD %s on %s: %w", name, n.Name, err), n.c.dropNetNS(netns), n.c.deletePodObject(ctx, p))
	}
	if p.Result, err = current.NewResultFromResult(res); err != nil {
		return nil, err
	}
	for _, ip := range p.Result.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok && a.Unmap().Is4() {
			p.IP = a.Unmap()
		} else if ok && a.Is6() {
			p.IP6 = a
		}
	}
	if n.c.Cfg.IPv6Only() {
		if p.IP.IsValid() {
			return nil, fmt.Errorf("pod %s got %v in an IPv6-only cluster", name, p.Result.IPs)
		}
		p.IP, p.IP6 = p.IP6, netip.Addr{}
	}
	if !p.IP.IsValid() || !n.PodCIDR.Contains(p.IP) {
		return nil, fmt.Errorf("pod %s got %v, want an address in %s", name, p.Result.IPs, n.PodCIDR)
	}
	if n.PodCIDR6.IsValid() && !n.PodCIDR6.Contains(p.IP6) {
		return nil, fmt.Errorf("pod %s got %v, want an address in %s too", name, p.Result.IPs, n.PodCIDR6)
	}
	n.Pods = append(n.Pods, p)
	if n.c.podObjects() && !spec.LateStatus {
		if err := n.c.setPodIPs(ctx, p); err != nil {
			return p, err
		}
	}
	return p, nil
}

// DelPod runs CNI DEL for the pod (with the cached result, as a runtime
// does) and removes its netns.
func (n *Node) DelPod(ctx context.Context, p *Pod) error {
	p.closeServers()
	err := n.NS.Do(func() error { return n.cni.DelNetworkList(ctx, n.list, p.rt) })
	if err != nil {
		return fmt.Errorf("CNI DEL %s on %s: %w", p.Name, n.Name, err)
	}
	n.Pods = slices.DeleteFunc(n.Pods, func(q *Pod) bool { return q == p })
	return errors.Join(n.c.dropNetNS(p.NS), n.c.deletePodObject(ctx, p))
}

// Check runs CNI CHECK for the pod.
func (n *Node) Check(ctx context.Context, p *Pod) error {
	return n.NS.Do(func() error { return n.cni.CheckNetworkList(ctx, n.list, p.rt) })
}

func (p *Pod) addServer(s io.Closer) {
	p.mu.Lock()
	p.servers = append(p.servers, s)
	p.mu.Unlock()
}

// closeServers closes the pod's listeners: an open socket would keep the
// pod's netns alive after its name is removed.
func (p *Pod) closeServers() {
	p.mu.Lock()
	s := p.servers
	p.servers = nil
	p.mu.Unlock()
	for _, c := range s {
		c.Close()
	}
}

// MTU is the MTU of the pod's eth0.
func (p *Pod) MTU() (int, error) { return linkMTU(p.NS, "eth0") }
