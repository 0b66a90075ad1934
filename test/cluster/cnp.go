package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
)

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// InstallClusterPolicyCRD creates the CustomResourceDefinitions of the
// shipped conf/k8s/cnp-crds.yaml (ClusterNetworkPolicy,
// policy.networking.k8s.io) in the cluster's API server and waits until
// they are established. podnet-routed's engine notices them through
// discovery (every 5 s) and starts watching ClusterNetworkPolicies; the
// shipped RBAC already lets it.
func (c *Cluster) InstallClusterPolicyCRD(ctx context.Context) error {
	cfg, err := c.API.AdminConfig()
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	path := filepath.Join(c.Cfg.RepoRoot, "conf", "k8s", "cnp-crds.yaml")
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read the CRDs: %w", err)
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	var names []string
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if obj.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if _, err := dyn.Resource(crdGVR).Create(ctx, &obj, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create CRD %s: %w", obj.GetName(), err)
		}
		names = append(names, obj.GetName())
	}
	if len(names) == 0 {
		return fmt.Errorf("%s: no CustomResourceDefinition", path)
	}
	for _, name := range names {
		if err := waitEstablished(ctx, dyn, name); err != nil {
			return err
		}
	}
	return nil
}

func waitEstablished(ctx context.Context, dyn dynamic.Interface, name string) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, cd := range conds {
				if m, ok := cd.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("CRD %s not established in 30 s (%v)", name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// clusterPolicies is the typed ClusterNetworkPolicy client, made once.
func (c *Cluster) clusterPolicies() (cnpclient.Interface, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cnpClient != nil {
		return c.cnpClient, nil
	}
	cfg, err := c.API.AdminConfig()
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 1000, 1000
	cl, err := cnpclient.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("ClusterNetworkPolicy client: %w", err)
	}
	c.cnpClient = cl
	return cl, nil
}

// CreateClusterPolicy creates a ClusterNetworkPolicy (its CRD installed:
// InstallClusterPolicyCRD).
func (c *Cluster) CreateClusterPolicy(ctx context.Context, p *cnpv1.ClusterNetworkPolicy) error {
	cl, err := c.clusterPolicies()
	if err != nil {
		return err
	}
	if _, err := cl.PolicyV1beta1().ClusterNetworkPolicies().Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ClusterNetworkPolicy %s: %w", p.Name, err)
	}
	return nil
}

// DeleteClusterPolicy deletes a ClusterNetworkPolicy.
func (c *Cluster) DeleteClusterPolicy(ctx context.Context, name string) error {
	cl, err := c.clusterPolicies()
	if err != nil {
		return err
	}
	if err := cl.PolicyV1beta1().ClusterNetworkPolicies().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		return fmt.Errorf("delete ClusterNetworkPolicy %s: %w", name, err)
	}
	return nil
}
