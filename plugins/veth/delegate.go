package veth

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/containernetworking/cni/pkg/version"
)

// The delegation to an IPAM binary, as the CNI spec describes it (the
// plugin found in CNI_PATH, the same config on stdin and the same CNI_*
// environment, CNI_COMMAND set to the verb, the result or error on
// stdout). libcni's invoke package does the same, but importing it links
// net/http, crypto/tls and OpenTelemetry into every plugin binary, whose
// package initialisation and larger image every ADD and DEL then pays at
// exec time.

// delegate runs the IPAM plugin pluginType for verb and returns its stdout.
func delegate(ctx context.Context, pluginType, verb string, stdin []byte) ([]byte, error) {
	path, err := findPlugin(pluginType, filepath.SplitList(os.Getenv("CNI_PATH")))
	if err != nil {
		return nil, err
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path)
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
func delegateAdd(ctx context.Context, pluginType string, stdin []byte) (types.Result, error) {
	out, err := delegate(ctx, pluginType, "ADD", stdin)
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
