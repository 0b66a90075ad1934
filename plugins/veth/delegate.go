package veth

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/podnet/podnet/ipam"
)

// The IPAM delegation. podnet-ipam runs in-process (saving the start of a
// second Go process per pod) unless the config sets "execIPAM"; results and
// errors are the same as the podnet-ipam binary's. Any other IPAM plugin is
// exec'd as the CNI spec describes (the plugin found in CNI_PATH, the same
// config on stdin and the same CNI_* environment, CNI_COMMAND set to the
// verb, the result or error on stdout): the IPAM plugin sees the same config
// and CNI environment as the plugin that delegates to it. libcni's invoke
// package does the same, but importing it links net/http, crypto/tls and
// OpenTelemetry into every plugin binary, whose package initialisation and
// larger image every ADD and DEL then pays at exec time.

// inProcessIPAM reports whether conf's IPAM plugin runs in this process.
func inProcessIPAM(conf *netConf) bool {
	return conf.IPAM.Type == ipam.PluginType && !conf.ExecIPAM
}

// ipamAdd runs ADD of conf's IPAM plugin.
func ipamAdd(conf *netConf, args *skel.CmdArgs) (types.Result, error) {
	if !inProcessIPAM(conf) {
		return delegateAdd(conf.IPAM.Type, args.StdinData)
	}
	res, err := ipam.Add(ipam.RequestFrom(args))
	if err != nil {
		return nil, err // not a nil *current.Result in a non-nil types.Result
	}
	return res, nil
}

// ipamVerb runs verb (DEL, CHECK, GC or STATUS) of conf's IPAM plugin:
// podnet-ipam's function for it (inProcess) or the plugin binary.
func ipamVerb(verb string, inProcess func(ipam.Request) error, conf *netConf, args *skel.CmdArgs) error {
	if inProcessIPAM(conf) {
		return inProcess(ipam.RequestFrom(args))
	}
	_, err := delegate(conf.IPAM.Type, verb, args.StdinData)
	return err
}

// delegate runs the IPAM plugin pluginType for verb and returns its stdout.
func delegate(pluginType, verb string, stdin []byte) ([]byte, error) {
	path, err := findPlugin(pluginType, filepath.SplitList(os.Getenv("CNI_PATH")))
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(path)
	cmd.Env = withCommand(os.Environ(), verb)
	cmd.Stdin = bytes.NewReader(stdin)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, pluginError(err, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// delegateAdd runs ADD and decodes the result in its own version (the
// config's when the plugin leaves cniVersion out).
func delegateAdd(pluginType string, stdin []byte) (types.Result, error) {
	out, err := delegate(pluginType, "ADD", stdin)
	if err != nil {
		return nil, err
	}
	var ver struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(out, &ver); err != nil {
		return nil, fmt.Errorf("decode the result of %s: %w", pluginType, err)
	}
	if ver.CNIVersion == "" {
		confVersion, err := (&version.ConfigDecoder{}).Decode(stdin)
		if err != nil {
			return nil, err
		}
		var raw map[string]any
		if err := json.Unmarshal(out, &raw); err != nil || raw == nil {
			return nil, fmt.Errorf("decode the result of %s: %q is not a JSON object", pluginType, out)
		}
		raw["cniVersion"] = confVersion
		if out, err = json.Marshal(raw); err != nil {
			return nil, err
		}
		ver.CNIVersion = confVersion
	}
	return create.Create(ver.CNIVersion, out)
}

// findPlugin looks for the executable name in the CNI_PATH directories.
func findPlugin(name string, dirs []string) (string, error) {
	if name == "" || strings.ContainsRune(name, os.PathSeparator) {
		return "", fmt.Errorf("invalid plugin name %q", name)
	}
	for _, dir := range dirs {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("failed to find plugin %q in path %s", name, dirs)
}

// withCommand is env with CNI_COMMAND set to verb (replacing the one the
// delegating plugin was run with).
func withCommand(env []string, verb string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, "CNI_COMMAND=") {
			out = append(out, kv)
		}
	}
	return append(out, "CNI_COMMAND="+verb)
}

// pluginError is the CNI error a failed plugin printed on stdout, or one
// built from its stderr and exit status when it printed none.
func pluginError(runErr error, stdout, stderr []byte) error {
	e := &types.Error{}
	switch {
	case len(stdout) > 0:
		if err := json.Unmarshal(stdout, e); err != nil {
			e.Msg = fmt.Sprintf("netplugin failed but error parsing its diagnostic message %q: %v", stdout, err)
		}
	case len(stderr) > 0:
		e.Msg = fmt.Sprintf("netplugin failed: %q: %v", stderr, runErr)
	default:
		e.Msg = fmt.Sprintf("netplugin failed with no error message: %v", runErr)
	}
	return e
}

// ipamError turns an IPAM plugin failure into a CNI error that names the
// plugin and verb. The IPAM plugin's own code is kept when it is a specific
// one; otherwise fallback is used (11 for ADD/DEL, 50 for STATUS).
func ipamError(verb, pluginType string, err error, fallback uint) *types.Error {
	var te *types.Error
	if errors.As(err, &te) {
		code := te.Code
		if code == types.ErrUnknown || code == types.ErrInternal {
			code = fallback
		}
		msg := te.Msg
		if te.Details != "" {
			msg += ": " + te.Details
		}
		return types.NewError(code, fmt.Sprintf("IPAM plugin %q %s failed: %s", pluginType, verb, msg), "")
	}
	return types.NewError(fallback, fmt.Sprintf("IPAM plugin %q %s failed: %v", pluginType, verb, err), "")
}
