package main

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestDependencies keeps out of podnet-routed what would make most of
// its binary resident for nothing (its pages are half of its RSS):
// text/template (through golang.org/x/net/trace, say), whose
// reflect.Value.Method calls make the linker keep every exported method
// of every type; gRPC and the generated CRI API (reconcile's one CRI
// call is made by hand); the typed clientset, which links every API
// group.
func TestDependencies(t *testing.T) {
	out, err := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 {
		t.Fatalf("go list -deps: %d packages: %q", len(deps), out)
	}
	for _, d := range deps {
		for _, bad := range []string{"text/template", "html/template", "google.golang.org/grpc", "k8s.io/cri-api/", "k8s.io/client-go/kubernetes"} {
			if d == bad || strings.HasPrefix(d, bad+"/") || (strings.HasSuffix(bad, "/") && strings.HasPrefix(d, bad)) {
				t.Errorf("podnet-routed links %s", d)
			}
		}
	}
}
