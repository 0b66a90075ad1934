//go:build cnpsuite

// The suite itself, built only with -tags cnpsuite: scripts/k8s/
// conformance.sh builds it so and runs it against a cluster (make cnp,
// make test). A plain `go test` here runs the checks of the skips, the
// subset and the pods' stripping, which need no cluster.

package cnp

import (
	"os"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	api "sigs.k8s.io/network-policy-api/apis/v1beta1"
	confv1a1 "sigs.k8s.io/network-policy-api/conformance/apis/v1alpha1"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/network-policy-api/conformance/utils/suite"
)

// TestClusterNetworkPolicy runs upstream's conformance tests with the
// profile ClusterNetworkPolicy and every feature (standard and
// experimental), as upstream's own runner does with
// --conformance-profiles=ClusterNetworkPolicy --all-features.
func TestClusterNetworkPolicy(t *testing.T) {
	if *kubeconfig == "" {
		t.Fatal("no -cnp.kubeconfig: scripts/k8s/conformance.sh runs this against a cluster (make cnp)")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		t.Fatalf("kubeconfig %s: %v", *kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, api.Install, apiextensionsv1.AddToScheme} {
		if err := add(scheme); err != nil {
			t.Fatalf("scheme: %v", err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatalf("controller-runtime client: %v", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("clientset: %v", err)
	}
	removed := 0
	s, err := suite.NewConformanceProfileTestSuite(suite.ConformanceProfileOptions{
		Options: suite.Options{
			Client:                     WithoutSCTPServers{Client: c, Removed: &removed},
			ClientSet:                  cs,
			KubeConfig:                 *cfg,
			CleanupBaseResources:       true,
			EnableAllSupportedFeatures: true,
		},
		Implementation: confv1a1.Implementation{
			Organization:          "podnet",
			Project:               "podnet",
			URL:                   "https://github.com/podnet/podnet",
			Version:               *version,
			Contact:               []string{"podnet maintainers"},
			AdditionalInformation: "make cnp (scripts/k8s/conformance.sh SUITE=cnp): test/conformance/REPORT-cnp.md",
		},
		ConformanceProfiles: sets.New(suite.CNPConformanceProfileName),
	})
	if err != nil {
		t.Fatalf("conformance suite: %v", err)
	}
	s.Setup(t)
	t.Logf("base manifests applied without %d SCTP server containers (this kernel has no SCTP)", removed)
	if err := s.Run(t, tests.ConformanceTests); err != nil {
		t.Fatalf("run: %v", err)
	}
	if *profileOut == "" {
		return
	}
	r, err := s.Report()
	if err != nil {
		t.Fatalf("profile report: %v", err)
	}
	b, err := yaml.Marshal(r)
	if err != nil {
		t.Fatalf("profile report: %v", err)
	}
	if err := os.WriteFile(*profileOut, b, 0o644); err != nil {
		t.Fatalf("profile report: %v", err)
	}
}
