package veth

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

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
}

// cniErrorf builds a CNI error with code and a message.
func cniErrorf(code uint, format string, args ...any) *types.Error {
	return types.NewError(code, fmt.Sprintf(format, args...), "")
}

// loadConf parses and validates stdin into conf (which embeds netConf in
// the caller's type). Errors are CNI errors with code 7 (or 6 for a
// prevResult that cannot be decoded).
func loadConf(stdin []byte, conf any, base *netConf) error {
	if err := json.Unmarshal(stdin, conf); err != nil {
		return cniErrorf(types.ErrInvalidNetworkConfig, "invalid network config: %v", err)
	}
	if base.IPAM.Type == "" {
		return cniErrorf(types.ErrInvalidNetworkConfig, "network %q: missing \"ipam\" section with a \"type\" (for example {\"type\": \"podnet-ipam\"} or {\"type\": \"host-local\", ...})", base.Name)
	}
	if base.MTU != 0 && (base.MTU < minMTU || base.MTU > maxMTU) {
		return cniErrorf(types.ErrInvalidNetworkConfig, "network %q: mtu %d is out of range: use %d-%d, or leave it out to take the node's MTU", base.Name, base.MTU, minMTU, maxMTU)
	}
	if err := version.ParsePrevResult(&base.PluginConf); err != nil {
		return cniErrorf(types.ErrDecodingFailure, "network %q: cannot decode prevResult: %v", base.Name, err)
	}
	return nil
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

// refuseOwnNetns fails with code 8 (invalid netns) when path is the
// plugin's own network namespace, the node's: every verb would then act on
// the node itself (ADD would leave pod routes on it; DEL's fallback could
// delete the uplink named by CNI_IFNAME). An empty or missing path is not
// the plugin's netns (DEL must still succeed for a pod that is gone).
func refuseOwnNetns(path string) error {
	if path == "" {
		return nil
	}
	var target, self unix.Stat_t
	if err := unix.Stat(path, &target); err != nil {
		return nil // missing or unreadable: openNetns reports it where it matters
	}
	if err := unix.Stat("/proc/self/ns/net", &self); err != nil {
		return cniErrorf(types.ErrInternal, "cannot read the plugin's own network namespace: %v", err)
	}
	if target.Dev == self.Dev && target.Ino == self.Ino {
		return cniErrorf(types.ErrInvalidNetNS, "CNI_NETNS %s is the network namespace the plugin runs in (the node's), not a pod's: refusing to touch it", path)
	}
	return nil
}

// openNetns opens the pod netns. A path that does not exist or is not a
// netns is error code 3 (the container is gone or unknown).
func openNetns(path string) (ns.NetNS, error) {
	podNS, err := ns.GetNS(path)
	if err == nil {
		return podNS, nil
	}
	var notExist ns.NSPathNotExistErr
	if errors.As(err, &notExist) {
		return nil, cniErrorf(types.ErrUnknownContainer, "CNI_NETNS %s does not exist (has the container exited?)", path)
	}
	var notNS ns.NSPathNotNSErr
	if errors.As(err, &notNS) {
		return nil, cniErrorf(types.ErrUnknownContainer, "CNI_NETNS %s is not a network namespace", path)
	}
	return nil, cniErrorf(types.ErrUnknownContainer, "cannot open CNI_NETNS %s: %v", path, err)
}

// resolveMTU returns the pod MTU: from the config, else the node state file,
// else the MTU of the current netns' default-route interface, else 1500.
func resolveMTU(conf *netConf) (int, error) {
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
	return underlayMTU(), nil
}

// underlayMTU is the MTU of the interface of the IPv4 default route. It
// asks the kernel for the route to a public address (one FIB lookup)
// rather than dumping the main table: a node with many pods has a host
// route per pod, and a dump made ADD grow with the pod count (0.3 ms at
// 100 pods, 2.2 ms at 1,000). No route there (no default route): 1500.
func underlayMTU() int {
	routes, err := netlink.RouteGet(net.IPv4(1, 1, 1, 1))
	if err != nil {
		return defaultMTU
	}
	for _, r := range routes {
		if r.LinkIndex == 0 {
			continue
		}
		if l, err := netlink.LinkByIndex(r.LinkIndex); err == nil && l.Attrs().MTU > 0 {
			return l.Attrs().MTU
		}
	}
	return defaultMTU
}

// newLogger returns a logger writing to conf.LogFile, or one that discards.
// The returned closer must be called when the plugin is done.
func newLogger(conf *netConf, plugin string) (*slog.Logger, func()) {
	if conf.LogFile == "" {
		return slog.New(slog.NewTextHandler(io.Discard, nil)), func() {}
	}
	// O_NOFOLLOW, O_NONBLOCK (a FIFO must not hang ADD) and a regular-file
	// check: a symlink, FIFO or device planted at the log path must not make
	// a root process append to another file.
	f, err := os.OpenFile(conf.LogFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0o600)
	if err == nil {
		if st, serr := f.Stat(); serr != nil || !st.Mode().IsRegular() {
			_ = f.Close()
			err = fmt.Errorf("not a regular file")
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: not logging to logFile %s: %v\n", plugin, conf.LogFile, err)
		return slog.New(slog.NewTextHandler(io.Discard, nil)), func() {}
	}
	l := slog.New(slog.NewJSONHandler(f, nil)).With("plugin", plugin, "network", conf.Name)
	return l, func() { _ = f.Close() }
}

// undoStack is the undo stack of an ADD: each successful step pushes its
// undo; on failure run undoes them in reverse order.
type undoStack struct {
	undo []func() error
	log  *slog.Logger
}

// push records how to undo a step that succeeded.
func (r *undoStack) push(undo func() error) { r.undo = append(r.undo, undo) }

// run undoes every recorded step, newest first, and logs undo failures.
func (r *undoStack) run() {
	for i := len(r.undo) - 1; i >= 0; i-- {
		if err := r.undo[i](); err != nil && r.log != nil {
			r.log.Error("rollback step failed", "err", err)
		}
	}
	r.undo = nil
}
