package veth

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/internal/nodestate"
	"github.com/podnet/podnet/ipam"
)

// VersionInfo answers VERSION: the CNI versions of podnet-ipam, which runs
// in-process and so has to accept every version the plugin accepts.
func VersionInfo() version.PluginInfo { return ipam.VersionInfo() }

// MTU bounds accepted in configuration.
const (
	minMTU = 576
	maxMTU = 65535
	// defaultMTU is used when neither the config, the node state file nor
	// the node's default route tells the MTU.
	defaultMTU = 1500
)

// netConf is the configuration common to the podnet plugins.
type netConf struct {
	types.PluginConf
	// MTU of the pod interface; 0 means: from the node state file, else
	// the MTU of the node's default-route interface.
	MTU int `json:"mtu,omitempty"`
	// StateDir holds node.json (default /run/podnet).
	StateDir string `json:"stateDir,omitempty"`
	// LogFile, when set, receives the plugin's structured logs.
	LogFile string `json:"logFile,omitempty"`
	// ExecIPAM forces exec of the IPAM binary even for podnet-ipam, which
	// otherwise runs in-process.
	ExecIPAM bool `json:"execIPAM,omitempty"`
	// PolicyWait bounds how long ADD waits for the node's NetworkPolicy
	// engine to program the pod ("3s" by default, "0s": no wait).
	PolicyWait *duration `json:"policyWait,omitempty"`
}

// duration is a time.Duration written as a Go duration string in JSON.
type duration time.Duration

func (d *duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a duration string such as \"3s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	if v < 0 || v > time.Minute {
		return fmt.Errorf("%s is out of range: use 0s to 1m", s)
	}
	*d = duration(v)
	return nil
}

// cniErrorf builds a CNI error with code and a message.
func cniErrorf(code uint, format string, args ...any) *types.Error {
	return types.NewError(code, fmt.Sprintf(format, args...), "")
}

// loadConf parses and validates stdin. Errors are CNI errors with code 7 (or
// 6 for a prevResult that cannot be decoded).
func loadConf(stdin []byte) (*netConf, error) {
	var conf netConf
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return nil, cniErrorf(types.ErrInvalidNetworkConfig, "invalid network config: %v", err)
	}
	if conf.IPAM.Type == "" {
		return nil, cniErrorf(types.ErrInvalidNetworkConfig, "network %q: missing \"ipam\" section with a \"type\" (for example {\"type\": \"podnet-ipam\"} or {\"type\": \"host-local\", ...})", conf.Name)
	}
	if conf.MTU != 0 && (conf.MTU < minMTU || conf.MTU > maxMTU) {
		return nil, cniErrorf(types.ErrInvalidNetworkConfig, "network %q: mtu %d is out of range: use %d-%d, or leave it out to take the node's MTU", conf.Name, conf.MTU, minMTU, maxMTU)
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return nil, cniErrorf(types.ErrDecodingFailure, "network %q: cannot decode prevResult: %v", conf.Name, err)
	}
	return &conf, nil
}

// podArgs are the CNI_ARGS podnet uses.
type podArgs struct {
	PodNamespace string
	PodName      string
}

// parseArgs reads K8S_POD_NAMESPACE and K8S_POD_NAME from CNI_ARGS
// ("K=V;K=V"); other keys are ignored.
func parseArgs(cniArgs string) (podArgs, error) {
	var a podArgs
	if cniArgs == "" {
		return a, nil
	}
	for _, kv := range strings.Split(cniArgs, ";") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return a, cniErrorf(types.ErrInvalidEnvironmentVariables, "CNI_ARGS: %q is not KEY=VALUE", kv)
		}
		switch k {
		case "K8S_POD_NAMESPACE":
			a.PodNamespace = v
		case "K8S_POD_NAME":
			a.PodName = v
		}
	}
	return a, nil
}

// resolveMTU returns the pod MTU: from the config, else the node state file,
// else the MTU of the current netns' default-route interface (asked
// through h, a netlink handle of that netns), else 1500.
func resolveMTU(conf *netConf, h *netlink.Handle) (int, error) {
	if conf.MTU > 0 {
		return conf.MTU, nil
	}
	st, err := nodestate.Read(conf.StateDir)
	switch {
	case err == nil && st.MTU > 0:
		return st.MTU, nil
	case err != nil && !errors.Is(err, nodestate.ErrNotReady):
		return 0, cniErrorf(types.ErrTryAgainLater, "cannot take the MTU from the node state: %v", err)
	}
	return underlayMTU(h), nil
}

// underlayMTU is the MTU of the interface of the IPv4 default route. It
// asks the kernel for the route to a public address (one FIB lookup)
// rather than dumping the main table: a node with many pods has a host
// route per pod, and a dump made ADD grow with the pod count (0.3 ms at
// 100 pods, 2.2 ms at 1,000). No route there (no default route): 1500.
// h is a netlink handle of the node netns (ADD's, not a socket more).
func underlayMTU(h *netlink.Handle) int {
	routes, err := h.RouteGet(net.IPv4(1, 1, 1, 1))
	if err != nil {
		return defaultMTU
	}
	for _, r := range routes {
		if r.LinkIndex == 0 {
			continue
		}
		if l, err := h.LinkByIndex(r.LinkIndex); err == nil && l.Attrs().MTU > 0 {
			return l.Attrs().MTU
		}
	}
	return defaultMTU
}
