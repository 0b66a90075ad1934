package veth

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
)

// fakePlugin writes an executable script named name into a new CNI_PATH
// directory and points CNI_PATH at it.
func fakePlugin(t *testing.T, name, script string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"+script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("CNI_PATH", dir)
}

func TestDelegateAdd(t *testing.T) {
	t.Setenv("CNI_COMMAND", "ADD")
	t.Setenv("CNI_CONTAINERID", "c1")
	// the plugin sees the verb and the rest of the CNI environment, and
	// leaves cniVersion out of its result: the config's version applies
	fakePlugin(t, "fake-ipam", `[ "$CNI_COMMAND" = ADD ] && [ "$CNI_CONTAINERID" = c1 ] || exit 9
cat >/dev/null
echo '{"ips":[{"address":"10.9.0.5/24"}]}'
`)
	args := &skel.CmdArgs{StdinData: []byte(`{"cniVersion":"1.0.0","name":"n","ipam":{"type":"fake-ipam"}}`)}
	res, err := delegateAdd("fake-ipam", args.StdinData)
	if err != nil {
		t.Fatal(err)
	}
	r, err := current.NewResultFromResult(res)
	if err != nil || res.Version() != "1.0.0" || len(r.IPs) != 1 || r.IPs[0].Address.String() != "10.9.0.5/24" {
		t.Fatalf("result %+v (version %s), %v", r, res.Version(), err)
	}
}

func TestDelegateErrors(t *testing.T) {
	t.Setenv("CNI_COMMAND", "ADD")
	args := &skel.CmdArgs{StdinData: []byte(`{"cniVersion":"1.0.0","name":"n"}`)}
	for _, tc := range []struct {
		name, script string
		code         uint
		msg          string
	}{
		{"cni-error", `echo '{"cniVersion":"1.0.0","code":11,"msg":"no free address"}'; exit 1`, 11, "no free address"},
		{"stderr-only", `echo boom >&2; exit 3`, 0, "boom"},
		{"silent", `exit 4`, 0, "no error message"},
		{"garbage", `echo 'not json'; exit 1`, 0, "error parsing its diagnostic message"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fakePlugin(t, "fake-ipam", tc.script)
			err := ipamVerb("DEL", nil, &netConf{PluginConf: types.PluginConf{IPAM: types.IPAM{Type: "fake-ipam"}}}, args)
			var te *types.Error
			if !errors.As(err, &te) || te.Code != tc.code || !strings.Contains(te.Msg, tc.msg) {
				t.Fatalf("err %v, want code %d with %q", err, tc.code, tc.msg)
			}
		})
	}
	t.Run("not-found", func(t *testing.T) {
		t.Setenv("CNI_PATH", t.TempDir())
		if _, err := delegate("missing", "STATUS", args.StdinData); err == nil || !strings.Contains(err.Error(), `failed to find plugin "missing"`) {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("path-in-name", func(t *testing.T) {
		if _, err := delegate("../sbin/evil", "GC", args.StdinData); err == nil || !strings.Contains(err.Error(), "invalid plugin name") {
			t.Fatalf("err %v", err)
		}
	})
}

func TestWithCommand(t *testing.T) {
	got := withCommand([]string{"A=1", "CNI_COMMAND=ADD", "CNI_PATH=/x"}, "DEL")
	if strings.Join(got, " ") != "A=1 CNI_PATH=/x CNI_COMMAND=DEL" {
		t.Fatalf("%v", got)
	}
}

func TestInProcessIPAM(t *testing.T) {
	conf := func(ipamType string, execIPAM bool) *netConf {
		return &netConf{PluginConf: types.PluginConf{IPAM: types.IPAM{Type: ipamType}}, ExecIPAM: execIPAM}
	}
	if !inProcessIPAM(conf("podnet-ipam", false)) {
		t.Error("podnet-ipam is exec'd, want it in-process")
	}
	if inProcessIPAM(conf("podnet-ipam", true)) {
		t.Error("podnet-ipam with execIPAM runs in-process, want it exec'd")
	}
	if inProcessIPAM(conf("host-local", false)) {
		t.Error("host-local runs in-process, want it exec'd")
	}
}
