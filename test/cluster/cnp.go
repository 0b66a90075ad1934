package cluster

// ClusterNetworkPolicy support (issue 33): the CRD of
// sigs.k8s.io/network-policy-api podnet ships (conf/k8s/cnp-crds.yaml)
// installed into and deleted from the cluster's API server, and
// ClusterNetworkPolicies created and deleted with the typed client.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/dynamic"
	cnpv1 "sigs.k8s.io/network-policy-api/apis/v1beta1"
	cnpclient "sigs.k8s.io/network-policy-api/pkg/client/clientset/versioned"
)

// CNPCRD is the name of the ClusterNetworkPolicy CRD.
const CNPCRD = "clusternetworkpolicies.policy.networking.k8s.io"

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

func (c *Cluster) dynamicClient() (dynamic.Interface, error) {
	cfg, err := c.API.AdminConfig()
	if err != nil {
		return nil, err
	}
	return dynamic.NewForConfig(cfg)
}

// CNPClient is the typed client of ClusterNetworkPolicies (admin), made
// once.
func (c *Cluster) CNPClient() (cnpclient.Interface, error) {
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

// InstallClusterPolicyCRD is InstallCNPCRD with 30 s to get established.
func (c *Cluster) InstallClusterPolicyCRD(ctx context.Context) error {
	return c.InstallCNPCRD(ctx, 30*time.Second)
}

// InstallCNPCRD creates the ClusterNetworkPolicy CRD of
// conf/k8s/cnp-crds.yaml unless it is there, and waits (up to limit)
// until it is established.
func (c *Cluster) InstallCNPCRD(ctx context.Context, limit time.Duration) error {
	dyn, err := c.dynamicClient()
	if err != nil {
		return err
	}
	path := filepath.Join(c.Cfg.RepoRoot, "conf", "k8s", "cnp-crds.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	for {
		var obj map[string]any
		if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if obj["kind"] != "CustomResourceDefinition" {
			continue
		}
		crd := &unstructured.Unstructured{Object: obj}
		_, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create CRD %s: %w", crd.GetName(), err)
		}
	}
	return poll(ctx, limit, func() error {
		got, err := dyn.Resource(crdGVR).Get(ctx, CNPCRD, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got.GetDeletionTimestamp() != nil {
			return errors.New("CRD " + CNPCRD + " is being deleted")
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, cond := range conds {
			if m, ok := cond.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				return nil
			}
		}
		return fmt.Errorf("CRD %s not established: %v", CNPCRD, conds)
	})
}

// DeleteCNPCRD deletes the ClusterNetworkPolicy CRD (and so every
// ClusterNetworkPolicy) and waits (up to limit) until it is gone.
func (c *Cluster) DeleteCNPCRD(ctx context.Context, limit time.Duration) error {
	dyn, err := c.dynamicClient()
	if err != nil {
		return err
	}
	if err := dyn.Resource(crdGVR).Delete(ctx, CNPCRD, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete CRD %s: %w", CNPCRD, err)
	}
	return poll(ctx, limit, func() error {
		_, err := dyn.Resource(crdGVR).Get(ctx, CNPCRD, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("CRD %s still there (%v)", CNPCRD, err)
	})
}

// CreateClusterPolicy creates a ClusterNetworkPolicy.
func (c *Cluster) CreateClusterPolicy(ctx context.Context, p *cnpv1.ClusterNetworkPolicy) error {
	client, err := c.CNPClient()
	if err != nil {
		return err
	}
	if _, err := client.PolicyV1beta1().ClusterNetworkPolicies().Create(ctx, p, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create ClusterNetworkPolicy %s: %w", p.Name, err)
	}
	return nil
}

// DeleteClusterPolicy deletes a ClusterNetworkPolicy (gone already: nothing
// to do).
func (c *Cluster) DeleteClusterPolicy(ctx context.Context, name string) error {
	client, err := c.CNPClient()
	if err != nil {
		return err
	}
	err = client.PolicyV1beta1().ClusterNetworkPolicies().Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete ClusterNetworkPolicy %s: %w", name, err)
	}
	return nil
}
