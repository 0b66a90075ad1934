// Package install puts podnet on a node: it copies the CNI plugin binaries
// into the runtime's plugin directory atomically and writes podnet's
// conflist last, and it prepares the node's sysctls and tunnel devices for
// an unprivileged podnet-routed with podnet-routed's own dataplane code
// (see nodeprep.go). It backs the podnet-install command that the
// podnet-node DaemonSet runs as init containers, and scripts/install.sh on
// hosts without Kubernetes.
package install

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/containernetworking/cni/libcni"
)

// NetworkName is the name of the network in every conflist podnet ships.
const NetworkName = "podnet"

// PluginTypes are the CNI plugin types that make a config file podnet's own.
var PluginTypes = []string{"podnet", "podnet-bridge"}

// DefaultCNIVersion is the conflist version written unless told otherwise:
// 1.0.0 is the newest that containerd 1.6/1.7 and CRI-O of the same age
// (libcni < 1.2) accept. 1.1.0 adds GC and STATUS.
const DefaultCNIVersion = "1.0.0"

// CNIVersions are the conflist versions the installer writes.
var CNIVersions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// Conf is what goes into the conflist (the ConfigMap's values).
type Conf struct {
	CNIVersion string // default DefaultCNIVersion
	Plugin     string // "podnet" (default) or "podnet-bridge"
	MTU        int    // 0: the plugin takes it from node.json (podnet-routed) or the underlay
	// Subnet is the IPAM range. Empty means "usePodCidr": the node's PodCIDR
	// as published by podnet-routed. Hosts without Kubernetes give one.
	Subnet string
	// ClusterCIDRs, with Subnet empty, give the families of the pod
	// addresses: one IPAM range set per family, "usePodCidr" for IPv4 and
	// "usePodCidrIPv6" for IPv6 (a dual-stack pod gets one of each). None
	// means "usePodCidr" alone.
	ClusterCIDRs []netip.Prefix
	// StateDir is where node.json and (under ipam/) the IPAM store live.
	// Empty means the plugins' default, /run/podnet.
	StateDir string
	// Portmap chains the reference portmap plugin (hostPort support); its
	// binary must be in the CNI bin dir, podnet does not ship it.
	Portmap bool
}

type rangeConf struct {
	Subnet string `json:"subnet"`
}

type ipamConf struct {
	Type    string        `json:"type"`
	Ranges  [][]rangeConf `json:"ranges"`
	DataDir string        `json:"dataDir,omitempty"`
}

type pluginConf struct {
	Type        string   `json:"type"`
	Bridge      string   `json:"bridge,omitempty"`
	IsGateway   *bool    `json:"isGateway,omitempty"`
	HairpinMode *bool    `json:"hairpinMode,omitempty"`
	MTU         int      `json:"mtu,omitempty"`
	StateDir    string   `json:"stateDir,omitempty"`
	IPAM        ipamConf `json:"ipam"`
}

type portmapConf struct {
	Type         string          `json:"type"`
	Capabilities map[string]bool `json:"capabilities"`
}

type confList struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	Plugins    []any  `json:"plugins"`
}

// Render returns the conflist for c, checked by libcni.
func Render(c Conf) ([]byte, error) {
	if c.CNIVersion == "" {
		c.CNIVersion = DefaultCNIVersion
	}
	if !slices.Contains(CNIVersions, c.CNIVersion) {
		return nil, fmt.Errorf("cniVersion %q: want one of %v", c.CNIVersion, CNIVersions)
	}
	if c.Plugin == "" {
		c.Plugin = "podnet"
	}
	if c.MTU != 0 && (c.MTU < 576 || c.MTU > 65535) {
		return nil, fmt.Errorf("mtu %d: want 0 (automatic) or 576-65535", c.MTU)
	}
	var ranges [][]rangeConf
	if c.Subnet != "" {
		p, err := netip.ParsePrefix(c.Subnet)
		if err != nil {
			return nil, fmt.Errorf("subnet: %w", err)
		}
		ranges = [][]rangeConf{{{Subnet: p.Masked().String()}}}
	} else {
		has4 := slices.ContainsFunc(c.ClusterCIDRs, func(p netip.Prefix) bool { return p.Addr().Is4() })
		has6 := slices.ContainsFunc(c.ClusterCIDRs, func(p netip.Prefix) bool { return p.Addr().Is6() })
		if has4 || !has6 {
			ranges = append(ranges, []rangeConf{{Subnet: "usePodCidr"}})
		}
		if has6 {
			ranges = append(ranges, []rangeConf{{Subnet: "usePodCidrIPv6"}})
		}
	}
	p := pluginConf{Type: c.Plugin, MTU: c.MTU, IPAM: ipamConf{Type: "podnet-ipam", Ranges: ranges}}
	switch c.Plugin {
	case "podnet":
	case "podnet-bridge":
		t := true
		p.Bridge, p.IsGateway, p.HairpinMode = "podnet0", &t, &t
	default:
		return nil, fmt.Errorf("plugin %q: want one of %v", c.Plugin, PluginTypes)
	}
	if c.StateDir != "" {
		if !filepath.IsAbs(c.StateDir) {
			return nil, fmt.Errorf("state dir %q is not absolute", c.StateDir)
		}
		p.StateDir = filepath.Clean(c.StateDir)
		p.IPAM.DataDir = filepath.Join(p.StateDir, "ipam")
	}
	list := confList{CNIVersion: c.CNIVersion, Name: NetworkName, Plugins: []any{p}}
	if c.Portmap {
		list.Plugins = append(list.Plugins, portmapConf{Type: "portmap", Capabilities: map[string]bool{"portMappings": true}})
	}
	out, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return nil, err
	}
	out = append(out, '\n')
	if _, err := libcni.ConfListFromBytes(out); err != nil {
		return nil, fmt.Errorf("rendered conflist does not parse: %w", err)
	}
	return out, nil
}

// ConfExtensions are the file extensions container runtimes load from the
// CNI config directory; the first file in lexical order wins.
var ConfExtensions = []string{".conf", ".conflist", ".json"}

// IsPodnetConf reports whether the CNI config file at path is podnet's own:
// a conflist or single-plugin config whose plugins include a podnet type.
// Files that do not parse are not podnet's.
func IsPodnetConf(path string) bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	var doc struct {
		Type    string `json:"type"`
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		return false
	}
	if slices.Contains(PluginTypes, doc.Type) {
		return true
	}
	for _, p := range doc.Plugins {
		if slices.Contains(PluginTypes, p.Type) {
			return true
		}
	}
	return false
}

// ErrForeignConf is wrapped by the error Install returns when a config
// file that is not podnet's would be overwritten, or would be used by the
// container runtime instead of podnet's (it sorts first).
var ErrForeignConf = errors.New("foreign CNI config")

// checkConfDir returns an error naming every config file that would shadow
// confName in dir (sorts before it) and a foreign file under confName itself.
func checkConfDir(dir, confName string) error {
	files, err := libcni.ConfFiles(dir, ConfExtensions)
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	slices.Sort(files)
	var errs []error
	for _, f := range files {
		base := filepath.Base(f)
		switch {
		case base < confName && IsPodnetConf(f):
			errs = append(errs, fmt.Errorf("%w: %s is an older podnet config that sorts before %s, so the container runtime would use it instead; remove it, or pass --force to install anyway", ErrForeignConf, f, confName))
		case base < confName:
			errs = append(errs, fmt.Errorf("%w: %s sorts before %s, so the container runtime would use it and ignore podnet; remove it if podnet should be the pod network, or pass --force to install anyway", ErrForeignConf, f, confName))
		case base == confName && !IsPodnetConf(f):
			errs = append(errs, fmt.Errorf("%w: %s exists and is not a podnet config; refusing to overwrite it (pass --force to replace it)", ErrForeignConf, f))
		}
	}
	return errors.Join(errs...)
}

func sameContent(path string, data []byte) bool {
	cur, err := os.ReadFile(path)
	return err == nil && bytes.Equal(cur, data)
}
