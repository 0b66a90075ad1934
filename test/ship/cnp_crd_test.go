package ship

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/podnet/podnet/test/kapi"
)

const (
	cnpCRDPath = "conf/k8s/cnp-crds.yaml"
	cnpCRDName = "clusternetworkpolicies.policy.networking.k8s.io"
	// the file in sigs.k8s.io/network-policy-api
	moduleCRD = "config/crd/experimental/policy.networking.k8s.io_clusternetworkpolicies.yaml"
)

// TestCNPCRDIsTheModules: conf/k8s/cnp-crds.yaml is, byte for byte, the
// experimental ClusterNetworkPolicy CRD of sigs.k8s.io/network-policy-api at
// the version go.mod pins (the version podnet's engine is built with).
func TestCNPCRDIsTheModules(t *testing.T) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}} {{.Version}}", "sigs.k8s.io/network-policy-api")
	cmd.Dir = repo(t)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m sigs.k8s.io/network-policy-api: %v", err)
	}
	dir, ver, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	want := readFile(t, dir, moduleCRD)
	got := readFile(t, repo(t), cnpCRDPath)
	if !bytes.Equal(got, want) {
		t.Fatalf("%s differs from %s of sigs.k8s.io/network-policy-api %s (%d vs %d bytes): copy it again", cnpCRDPath, moduleCRD, ver, len(got), len(want))
	}
	objs := readObjects(t, filepath.Join(repo(t), cnpCRDPath))
	if len(objs) != 1 || objs[0].GetName() != cnpCRDName {
		t.Fatalf("%s: want the one CRD %s", cnpCRDPath, cnpCRDName)
	}
	if a := objs[0].GetAnnotations(); a["policy.networking.k8s.io/bundle-version"] != ver || a["policy.networking.k8s.io/channel"] != "experimental" {
		t.Errorf("annotations %v, want bundle-version %s, channel experimental", a, ver)
	}
}

// TestCNPCRDInstall does what README and conf/k8s/podnet.yaml tell an
// operator, against a real kube-apiserver: `kubectl create -f
// conf/k8s/cnp-crds.yaml` when the CRD is absent makes the API serve
// ClusterNetworkPolicies (one is created and read back); on a cluster
// that already has the CRD (here: a "newer" one, its bundle-version
// annotation changed) create fails with AlreadyExists and leaves it as it
// was: no downgrade.
func TestCNPCRDInstall(t *testing.T) {
	crd := readObjects(t, filepath.Join(repo(t), cnpCRDPath))[0]
	s := kapi.Start(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig(kapi.AdminUser, ""))
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	cnps := dyn.Resource(schema.GroupVersionResource{Group: "policy.networking.k8s.io", Version: "v1beta1", Resource: "clusternetworkpolicies"})

	if _, err := crds.Create(ctx, crd.DeepCopy(), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create the CRD: %v", err)
	}
	cnp := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
		"metadata": map[string]any{"name": "ship-test"},
		"spec": map[string]any{
			"tier": "Admin", "priority": int64(10),
			"subject": map[string]any{"namespaces": map[string]any{}},
			"ingress": []any{map[string]any{"action": "Deny", "from": []any{map[string]any{"namespaces": map[string]any{}}}}},
		},
	}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err = cnps.Create(ctx, cnp, metav1.CreateOptions{})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // the CRD is not served yet
	}
	if err != nil {
		t.Fatalf("create a ClusterNetworkPolicy after installing the CRD: %v", err)
	}
	got, err := cnps.Get(ctx, "ship-test", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tier, _, _ := unstructured.NestedString(got.Object, "spec", "tier"); tier != "Admin" {
		t.Errorf("stored ClusterNetworkPolicy tier %q", tier)
	}

	// a cluster with a newer CRD: create leaves it alone
	stored, err := crds.Get(ctx, cnpCRDName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a := stored.GetAnnotations()
	a["policy.networking.k8s.io/bundle-version"] = "v9.9.9"
	stored.SetAnnotations(a)
	if _, err := crds.Update(ctx, stored, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := crds.Create(ctx, crd.DeepCopy(), metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create over an existing CRD: %v, want AlreadyExists", err)
	}
	after, err := crds.Get(ctx, cnpCRDName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v := after.GetAnnotations()["policy.networking.k8s.io/bundle-version"]; v != "v9.9.9" {
		t.Errorf("the existing CRD's bundle-version is %q after create, want v9.9.9 (left alone)", v)
	}
}
