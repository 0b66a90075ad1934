package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/test/nettest"
)

// execResult is what one exec of a plugin binary produced.
type execResult struct {
	exitCode int
	stdout   []byte
	stderr   []byte
}

// execPluginInNode runs the plugin binary bin inside node's netns the way a
// container runtime does: the CNI_* variables in env, stdin on its stdin. The
// child inherits the node netns because it is forked from the thread that
// ns.Do switched into it. Only PATH is taken from the test's environment.
func execPluginInNode(t *testing.T, node *nettest.Node, bin string, env map[string]string, stdin []byte) execResult {
	t.Helper()
	var res execResult
	var runErr error
	err := node.NS.Do(func(ns.NetNS) error {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin)
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		cmd.Stdin = bytes.NewReader(stdin)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		runErr = cmd.Run()
		res.stdout, res.stderr = stdout.Bytes(), stderr.Bytes()
		return nil
	})
	if err != nil {
		t.Fatalf("enter node netns: %v", err)
	}
	var exitErr *exec.ExitError
	switch {
	case runErr == nil:
		res.exitCode = 0
	case errors.As(runErr, &exitErr):
		res.exitCode = exitErr.ExitCode()
	default:
		t.Fatalf("exec %s: %v\nstderr: %s", bin, runErr, res.stderr)
	}
	return res
}

// decodeCNIErrorOutput parses stdout as exactly one CNI error object
// ({"code":N,"msg":"...","details":"..."}) and nothing else.
func decodeCNIErrorOutput(stdout []byte) (*types.Error, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(stdout, &raw); err != nil {
		return nil, fmt.Errorf("stdout is not one JSON object: %v", err)
	}
	for _, k := range []string{"code", "msg"} {
		if _, ok := raw[k]; !ok {
			return nil, fmt.Errorf("stdout has no %q field", k)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(stdout))
	dec.DisallowUnknownFields()
	var e types.Error
	if err := dec.Decode(&e); err != nil {
		return nil, fmt.Errorf("stdout is not a CNI error: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("stdout has more than the error object")
	}
	if strings.TrimSpace(e.Msg) == "" {
		return nil, fmt.Errorf("error has an empty msg")
	}
	return &e, nil
}

// badInputConf is the valid base network config of TestBadInput: podnet
// with host-local over 10.244.20.0/24. stateDir is a private empty dir so
// that no node.json of the machine is read.
func badInputConf(dataDir, stateDir string) map[string]any {
	return map[string]any{
		"cniVersion": "1.0.0",
		"name":       "podnet",
		"type":       "podnet",
		"stateDir":   stateDir,
		"ipam": map[string]any{
			"type":    "host-local",
			"dataDir": dataDir,
			"ranges":  []any{[]any{map[string]any{"subnet": "10.244.20.0/24"}}},
		},
	}
}

// TestBadInput execs bin/podnet directly, as a runtime would, with one bad
// input at a time, and checks that it fails with the right CNI error and
// leaves nothing behind.
func TestBadInput(t *testing.T) {
	setEnv := func(k, v string) func(*testing.T, map[string]string) {
		return func(_ *testing.T, env map[string]string) { env[k] = v }
	}
	setConf := func(k string, v any) func(map[string]any) {
		return func(c map[string]any) { c[k] = v }
	}
	cases := []struct {
		name string
		// rawStdin, when set, is sent instead of the (edited) base config.
		rawStdin string
		// editConf changes the base config.
		editConf func(conf map[string]any)
		// editEnv changes the base CNI_* environment.
		editEnv func(t *testing.T, env map[string]string)
		code    uint
		msg     []string // substrings of the error's msg
		details []string // substrings of the error's details
	}{
		{
			name:     "invalid JSON",
			rawStdin: `{"cniVersion":"1.0.0","name":"podnet","type":"podnet",`,
			code:     types.ErrDecodingFailure,
			msg:      []string{"network config"},
		},
		{
			name:     "unknown cniVersion",
			editConf: setConf("cniVersion", "9.9.9"),
			code:     types.ErrIncompatibleCNIVersion,
			msg:      []string{"incompatible CNI versions"},
			details:  []string{"9.9.9", "1.1.0"},
		},
		{
			name:     "missing ipam",
			editConf: func(c map[string]any) { delete(c, "ipam") },
			code:     types.ErrInvalidNetworkConfig,
			msg:      []string{`missing "ipam"`},
		},
		{
			name:     "mtu -1",
			editConf: setConf("mtu", -1),
			code:     types.ErrInvalidNetworkConfig,
			msg:      []string{"mtu -1 is out of range", "576-65535"},
		},
		{
			name:     "mtu 100",
			editConf: setConf("mtu", 100),
			code:     types.ErrInvalidNetworkConfig,
			msg:      []string{"mtu 100 is out of range", "576-65535"},
		},
		{
			name:     "mtu 70000",
			editConf: setConf("mtu", 70000),
			code:     types.ErrInvalidNetworkConfig,
			msg:      []string{"mtu 70000 is out of range", "576-65535"},
		},
		{
			name:     "mtu string",
			editConf: setConf("mtu", "abc"),
			code:     types.ErrInvalidNetworkConfig,
			msg:      []string{"mtu"},
		},
		{
			name:    "ifname empty",
			editEnv: setEnv("CNI_IFNAME", ""),
			code:    types.ErrInvalidEnvironmentVariables,
			msg:     []string{"CNI_IFNAME", "missing"},
		},
		{
			name:    "ifname 16 chars",
			editEnv: setEnv("CNI_IFNAME", "eth0123456789abc"),
			code:    types.ErrInvalidEnvironmentVariables,
			msg:     []string{"interface name is too long"},
			details: []string{"less than 16 characters"},
		},
		{
			name:    "ifname with slash",
			editEnv: setEnv("CNI_IFNAME", "eth/0"),
			code:    types.ErrInvalidEnvironmentVariables,
			msg:     []string{"interface name contains /"},
		},
		{
			name:    "ifname dotdot",
			editEnv: setEnv("CNI_IFNAME", ".."),
			code:    types.ErrInvalidEnvironmentVariables,
			msg:     []string{"interface name is . or .."},
		},
		{
			name:    "containerid with path characters",
			editEnv: setEnv("CNI_CONTAINERID", "../../etc"),
			code:    types.ErrInvalidEnvironmentVariables,
			msg:     []string{"invalid characters in containerID"},
			details: []string{"../../etc"},
		},
		{
			name: "netns does not exist",
			editEnv: func(t *testing.T, env map[string]string) {
				env["CNI_NETNS"] = filepath.Join(t.TempDir(), "no-such-netns")
			},
			code: types.ErrUnknownContainer,
			msg:  []string{"no-such-netns does not exist"},
		},
		{
			name: "netns is a regular file",
			editEnv: func(t *testing.T, env map[string]string) {
				p := filepath.Join(t.TempDir(), "notans")
				if err := os.WriteFile(p, []byte("not a netns\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				env["CNI_NETNS"] = p
			},
			code: types.ErrUnknownContainer,
			msg:  []string{"notans is not a network namespace"},
		},
		{
			name: "IPAM fails",
			editConf: setConf("ipam", map[string]any{
				"type": "fakeipam",
				"ips":  []string{"10.244.20.5/24"},
				"fail": map[string]any{"ADD": map[string]any{"code": 11, "msg": "range exhausted"}},
			}),
			code: types.ErrTryAgainLater,
			msg:  []string{"fakeipam", "range exhausted"},
		},
		{
			name:     "IPAM plugin missing",
			editConf: setConf("ipam", map[string]any{"type": "no-such-ipam"}),
			code:     types.ErrTryAgainLater,
			msg:      []string{`"no-such-ipam"`, "failed to find plugin"},
		},
		{
			name:    "unknown CNI_COMMAND",
			editEnv: setEnv("CNI_COMMAND", "FOO"),
			code:    types.ErrInvalidEnvironmentVariables,
			msg:     []string{"unknown CNI_COMMAND: FOO"},
		},
		{
			// Not a bad input for skel: host-local hands out an address
			// and podnet creates the veth before the rename inside the pod
			// fails, so this one proves the rollback of ADD.
			name:    "ifname taken in the pod",
			editEnv: setEnv("CNI_IFNAME", "lo"),
			code:    types.ErrInvalidEnvironmentVariables,
			msg:     []string{`already has an interface named "lo"`},
		},
	}

	bin := nettest.BinDir(t, "podnet")
	cniPath := strings.Join([]string{bin, nettest.RefToolsDir(t), fakeIPAMDir}, ":")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			node := nettest.NewNode(t)
			podNS := nettest.NewNetNS(t)
			dataDir := t.TempDir()
			conf := badInputConf(dataDir, t.TempDir())
			if tc.editConf != nil {
				tc.editConf(conf)
			}
			stdin, err := json.Marshal(conf)
			if err != nil {
				t.Fatal(err)
			}
			if tc.rawStdin != "" {
				stdin = []byte(tc.rawStdin)
			}
			env := map[string]string{
				"CNI_COMMAND":     "ADD",
				"CNI_CONTAINERID": "bad-input-0123",
				"CNI_NETNS":       podNS.Path(),
				"CNI_IFNAME":      "eth0",
				"CNI_PATH":        cniPath,
			}
			if tc.editEnv != nil {
				tc.editEnv(t, env)
			}

			res := execPluginInNode(t, node, filepath.Join(bin, "podnet"), env, stdin)
			t.Logf("exit %d, stdout: %s", res.exitCode, bytes.TrimSpace(res.stdout))

			if res.exitCode == 0 {
				t.Errorf("exit status 0, want non-zero")
			}
			for _, s := range []string{"panic", "goroutine"} {
				if bytes.Contains(res.stderr, []byte(s)) {
					t.Errorf("stderr contains %q:\n%s", s, res.stderr)
				}
			}
			cniErr, err := decodeCNIErrorOutput(res.stdout)
			if err != nil {
				t.Errorf("%v\nstdout: %s\nstderr: %s", err, res.stdout, res.stderr)
			} else {
				if cniErr.Code != tc.code {
					t.Errorf("code = %d, want %d (msg %q, details %q)", cniErr.Code, tc.code, cniErr.Msg, cniErr.Details)
				}
				for _, want := range tc.msg {
					if !strings.Contains(cniErr.Msg, want) {
						t.Errorf("msg = %q, want it to contain %q", cniErr.Msg, want)
					}
				}
				for _, want := range tc.details {
					if !strings.Contains(cniErr.Details, want) {
						t.Errorf("details = %q, want it to contain %q", cniErr.Details, want)
					}
				}
			}

			// Nothing left behind in the node, in IPAM or in the pod.
			if links := node.Links(); len(links) > 0 {
				t.Errorf("links left in node netns: %v", links)
			}
			if routes := node.RoutesWithProto(contract.RouteProtocol); len(routes) > 0 {
				t.Errorf("podnet routes left in node netns: %v", routes)
			}
			// Empty for the cases that do not use host-local.
			if r := reservations(t, dataDir); len(r) > 0 {
				t.Errorf("host-local reservations left: %v", r)
			}
			links, err := nettest.LinkNames(podNS)
			if err != nil {
				t.Fatalf("list pod links: %v", err)
			}
			if len(links) > 0 {
				t.Errorf("links left in pod netns: %v", links)
			}
		})
	}
}

// TestVersionCommand checks the answer to CNI_COMMAND=VERSION.
func TestVersionCommand(t *testing.T) {
	bin := nettest.BinDir(t, "podnet")
	node := nettest.NewNode(t)
	res := execPluginInNode(t, node, filepath.Join(bin, "podnet"), map[string]string{"CNI_COMMAND": "VERSION"}, nil)
	if res.exitCode != 0 {
		t.Fatalf("VERSION exit status %d\nstdout: %s\nstderr: %s", res.exitCode, res.stdout, res.stderr)
	}
	var out struct {
		CNIVersion        string   `json:"cniVersion"`
		SupportedVersions []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(res.stdout, &out); err != nil {
		t.Fatalf("VERSION output is not JSON: %v\n%s", err, res.stdout)
	}
	if out.CNIVersion == "" {
		t.Errorf("VERSION output has no cniVersion: %s", res.stdout)
	}
	for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		if !slices.Contains(out.SupportedVersions, v) {
			t.Errorf("supportedVersions = %v, want it to include %s", out.SupportedVersions, v)
		}
	}
}
