// Package runtimee2e proves podnet under a real container runtime: Debian's
// containerd 1.6 with runc, started inside a throwaway "node" netns on
// scratch paths, with its CNI bin_dir and conf_dir pointing at the podnet
// build and the conflists shipped in conf/. Pod sandboxes are driven through
// the CRI API like kubelet does (test/runtime/criclient); the pause image is
// built locally (scripts/runtime/pause-image.sh) and imported, as no
// registry is reachable.
//
// It needs root, containerd, ctr, runc and nsenter (scripts/runtime/install-deps.sh
// installs them), the built binaries (`make`), the reference CNI tools
// (PODNET_CNI_TOOLS, for the loopback plugin containerd runs) and
// kube-apiserver + etcd (PODNET_KAPI_DIR: the leak reconcile test runs
// podnet-routed, which needs an API server for its Node). It fails, never
// skips, when one is missing.
package runtimee2e

import (
	"fmt"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	// A run killed before its cleanup (test timeout, SIGKILL) leaves its
	// scratch dir behind with everything it started; undo those first.
	if os.Geteuid() == 0 {
		for _, msg := range sweepStaleRuns() {
			fmt.Fprintln(os.Stderr, "runtime test: stale run:", msg)
		}
	}
	os.Exit(m.Run())
}
