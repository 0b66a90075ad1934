// Package ipam is podnet-ipam: a host-local IPAM whose verbs can run in their
// own process (bin/podnet-ipam) or inside the podnet plugin. The allocation
// logic lives in ipam/allocator, the reservations in ipam/store.
package ipam

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/ipam/allocator"
)

// PluginType is the ipam.type value of podnet-ipam.
const PluginType = "podnet-ipam"

// DefaultDataDir is on tmpfs (/run), so a node reboot, which also ends
// every pod, starts with an empty store: no stale reservations survive it.
const DefaultDataDir = "/run/podnet/ipam"

// Subnet values that stand for this node's PodCIDR from the node state file.
const (
	UsePodCIDR     = "usePodCidr"
	UsePodCIDRIPv6 = "usePodCidrIPv6"
)

// RangeConfig is one range as written in the config (host-local's form).
type RangeConfig struct {
	Subnet     string `json:"subnet"`
	RangeStart string `json:"rangeStart,omitempty"`
	RangeEnd   string `json:"rangeEnd,omitempty"`
	Gateway    string `json:"gateway,omitempty"`
}

// IPAMConfig is the "ipam" object.
type IPAMConfig struct {
	Type string `json:"type"`
	RangeConfig
	Ranges   [][]RangeConfig `json:"ranges,omitempty"`
	Exclude  []string        `json:"exclude,omitempty"`
	Routes   []*types.Route  `json:"routes,omitempty"`
	DataDir  string          `json:"dataDir,omitempty"`
	StateDir string          `json:"stateDir,omitempty"`
}

// NetConf is the part of the network config podnet-ipam reads.
type NetConf struct {
	CNIVersion    string     `json:"cniVersion"`
	Name          string     `json:"name"`
	StateDir      string     `json:"stateDir,omitempty"`
	IPAM          IPAMConfig `json:"ipam"`
	RuntimeConfig struct {
		IPs []string `json:"ips,omitempty"`
	} `json:"runtimeConfig"`
	Args struct {
		CNI struct {
			IPs []string `json:"ips,omitempty"`
		} `json:"cni"`
	} `json:"args"`
	ValidAttachments []types.GCAttachment `json:"cni.dev/valid-attachments,omitempty"`
}

// Plan is a parsed and validated config, ready to allocate from.
type Plan struct {
	Conf      NetConf
	Sets      []allocator.RangeSet
	Exclude   []netip.Prefix
	Requested []netip.Addr
	DataDir   string
	// NodePodCIDRs are the node's PodCIDRs the ranges use (usePodCidr).
	NodePodCIDRs []netip.Prefix
}

// ErrPodCIDRUnknown means a range uses usePodCidr and the node state file
// does not have the PodCIDR (yet).
var ErrPodCIDRUnknown = errors.New("node PodCIDR not known yet")

// PodCIDRSource returns this node's PodCIDRs.
type PodCIDRSource func() ([]netip.Prefix, error)

// NodeStatePodCIDRs reads the PodCIDRs from the node state file in dir.
// Every PodCIDR of the file must pass nodestate.CheckPodCIDR: a file with
// an absurd one is not trusted for any of them. Those errors wrap
// nodestate.ErrBadPodCIDR and name the file and the value.
func NodeStatePodCIDRs(dir string) PodCIDRSource { return nodeStatePodCIDRs(dir, false) }

// NodeStatePodCIDRsToRelease is NodeStatePodCIDRs for the verbs that hand
// out nothing (DEL, CHECK, GC): a node.json that says the node cannot host
// new pods still names the PodCIDRs its pods have their addresses from.
func NodeStatePodCIDRsToRelease(dir string) PodCIDRSource { return nodeStatePodCIDRs(dir, true) }

func nodeStatePodCIDRs(dir string, unusableToo bool) PodCIDRSource {
	return func() ([]netip.Prefix, error) {
		read := nodestate.Read
		if unusableToo {
			read = nodestate.ReadFile
		}
		st, err := read(dir)
		if err != nil {
			// not ErrNodeUnusable: DEL takes ErrPodCIDRUnknown for "nothing
			// was ever allocated", and this node's PodCIDR was known
			if errors.Is(err, nodestate.ErrNotReady) {
				return nil, fmt.Errorf("%w: %v", ErrPodCIDRUnknown, err)
			}
			return nil, err
		}
		out, err := st.PodCIDRPrefixes()
		if err != nil {
			return nil, fmt.Errorf("node state %s: %w", nodestate.Path(dir), err)
		}
		return out, nil
	}
}

// NodeAddrSource lists the node's own addresses of the families asked for.
type NodeAddrSource func(v4, v6 bool) ([]netip.Addr, error)

// Families says which address families the plan's ranges hand out.
func (p *Plan) Families() (v4, v6 bool) {
	for _, set := range p.Sets {
		for _, r := range set {
			if r.Subnet.Addr().Is4() {
				v4 = true
			} else {
				v6 = true
			}
		}
	}
	return v4, v6
}

// CheckNodeAddrs refuses a plan that could hand out one of addrs, the
// node's own addresses, to a pod: an address among a range's candidates
// that is neither the range's gateway nor excluded. The network address
// (podnet-routed puts it on its VXLAN device) and the gateway
// (podnet-bridge puts it on the bridge) are never handed out, so those
// addresses of podnet itself do not count. A range from the node's
// PodCIDR fails with an error wrapping nodestate.ErrBadPodCIDR that names
// stateFile; a configured range with code 7.
func (p *Plan) CheckNodeAddrs(addrs []netip.Addr, stateFile string) error {
	for i, set := range p.Sets {
		for _, r := range set {
			for _, a := range addrs {
				if !r.Contains(a) || a == r.Gateway || slices.ContainsFunc(p.Exclude, func(e netip.Prefix) bool { return e.Contains(a) }) {
					continue
				}
				if slices.Contains(p.NodePodCIDRs, r.Subnet) {
					return fmt.Errorf("node state %s: podCIDR %s: %w: it holds %s, an address of this node, which would be handed out to a pod", stateFile, r.Subnet, nodestate.ErrBadPodCIDR, a)
				}
				return configError("podnet-ipam: range set %d: subnet %s holds %s, an address of this node, which would be handed out to a pod: use a pod range apart from the node's addresses, or keep the address out with \"exclude\" or \"rangeStart\"/\"rangeEnd\"", i, r.Subnet, a)
			}
		}
	}
	return nil
}

// configError is a CNI "invalid network config" error.
func configError(format string, args ...any) *types.Error {
	return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf(format, args...), "")
}

// ParseConfig parses stdin and CNI_ARGS into a Plan. podCIDRs is only
// called when a range says usePodCidr; an unknown PodCIDR is returned as an
// error wrapping ErrPodCIDRUnknown, every config problem as a CNI error
// with code 7.
func ParseConfig(stdin []byte, cniArgs string, podCIDRs PodCIDRSource) (*Plan, error) {
	var conf NetConf
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return nil, configError("podnet-ipam: invalid config: %v", err)
	}
	plan := &Plan{Conf: conf, DataDir: conf.IPAM.DataDir}
	if plan.DataDir == "" {
		plan.DataDir = DefaultDataDir
	}
	if !filepath.IsAbs(plan.DataDir) {
		// Relative to the runtime's working directory, which differs
		// between callers: two stores, duplicate addresses.
		return nil, configError("podnet-ipam: dataDir %q: want an absolute path", plan.DataDir)
	}
	plan.DataDir = filepath.Clean(plan.DataDir)
	rangeSets := conf.IPAM.Ranges
	if conf.IPAM.Subnet != "" {
		rangeSets = append([][]RangeConfig{{conf.IPAM.RangeConfig}}, rangeSets...)
	}
	if len(rangeSets) == 0 {
		return nil, configError("podnet-ipam: no ranges: set \"ranges\" (or \"subnet\"), e.g. \"ranges\": [[{\"subnet\": \"usePodCidr\"}]]")
	}
	var cidrs []netip.Prefix
	cidrsRead := false
	for i, rs := range rangeSets {
		var set allocator.RangeSet
		for _, rc := range rs {
			subnetText := rc.Subnet
			if subnetText == UsePodCIDR || subnetText == UsePodCIDRIPv6 {
				if !cidrsRead {
					var err error
					if cidrs, err = podCIDRs(); err != nil {
						return nil, err
					}
					cidrsRead = true
				}
				p, ok := pickCIDR(cidrs, subnetText == UsePodCIDRIPv6)
				if !ok {
					return nil, fmt.Errorf("%w: the node has no %s PodCIDR (podCIDRs %v)", ErrPodCIDRUnknown, family(subnetText == UsePodCIDRIPv6), cidrs)
				}
				// NodeStatePodCIDRs checked it already; other sources too
				// must not make the node's PodCIDR a config error.
				if err := nodestate.CheckPodCIDR(p); err != nil {
					return nil, fmt.Errorf("node PodCIDR %s: %w", p, err)
				}
				p = p.Masked()
				if !slices.Contains(plan.NodePodCIDRs, p) {
					plan.NodePodCIDRs = append(plan.NodePodCIDRs, p)
				}
				subnetText = p.String()
			}
			r, err := parseRange(rc, subnetText)
			if err != nil {
				return nil, configError("podnet-ipam: range set %d: %v", i, err)
			}
			set = append(set, r)
		}
		plan.Sets = append(plan.Sets, set)
	}
	if err := allocator.Validate(plan.Sets); err != nil {
		return nil, configError("podnet-ipam: %v", err)
	}
	for _, e := range conf.IPAM.Exclude {
		p, err := parsePrefixOrAddr(e)
		if err != nil {
			return nil, configError("podnet-ipam: exclude %q: %v", e, err)
		}
		plan.Exclude = append(plan.Exclude, p)
	}
	requested, err := requestedIPs(conf, cniArgs)
	if err != nil {
		return nil, err
	}
	plan.Requested = requested
	return plan, nil
}

func family(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

func pickCIDR(cidrs []netip.Prefix, v6 bool) (netip.Prefix, bool) {
	for _, p := range cidrs {
		if p.Addr().Is6() == v6 {
			return p, true
		}
	}
	return netip.Prefix{}, false
}

func parseRange(rc RangeConfig, subnetText string) (allocator.Range, error) {
	subnet, err := netip.ParsePrefix(subnetText)
	if err != nil {
		return allocator.Range{}, fmt.Errorf("subnet %q: want a CIDR, %q or %q", subnetText, UsePodCIDR, UsePodCIDRIPv6)
	}
	if err := nodestate.CheckPodCIDR(subnet); err != nil {
		return allocator.Range{}, fmt.Errorf("subnet %q: %w", subnetText, err)
	}
	var addrs [3]netip.Addr
	for i, s := range []string{rc.RangeStart, rc.RangeEnd, rc.Gateway} {
		if s == "" {
			continue
		}
		if addrs[i], err = netip.ParseAddr(s); err != nil {
			return allocator.Range{}, fmt.Errorf("bad address %q: %v", s, err)
		}
		addrs[i] = addrs[i].Unmap()
	}
	return allocator.NewRange(subnet, addrs[0], addrs[1], addrs[2])
}

func parsePrefixOrAddr(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// requestedIPs collects specific addresses asked for by runtimeConfig.ips,
// args.cni.ips or CNI_ARGS IP= (comma-separated). Each may carry a prefix
// length, which is ignored.
func requestedIPs(conf NetConf, cniArgs string) ([]netip.Addr, error) {
	raw := append([]string{}, conf.RuntimeConfig.IPs...)
	raw = append(raw, conf.Args.CNI.IPs...)
	for _, kv := range strings.Split(cniArgs, ";") {
		if v, ok := strings.CutPrefix(kv, "IP="); ok && v != "" {
			raw = append(raw, strings.Split(v, ",")...)
		}
	}
	var out []netip.Addr
	for _, s := range raw {
		s = strings.TrimSpace(s)
		if p, err := netip.ParsePrefix(s); err == nil {
			s = p.Addr().String()
		}
		a, err := netip.ParseAddr(s)
		if err != nil {
			return nil, configError("podnet-ipam: requested address %q is not an IP address", s)
		}
		out = append(out, a.Unmap())
	}
	return out, nil
}

// VersionInfo lists the CNI versions podnet-ipam accepts.
func VersionInfo() version.PluginInfo {
	return version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")
}

// CNIVersion is the cniVersion of a config ("" when it does not parse).
func CNIVersion(stdin []byte) string {
	var c struct {
		CNIVersion string `json:"cniVersion"`
	}
	_ = json.Unmarshal(stdin, &c)
	return c.CNIVersion
}
