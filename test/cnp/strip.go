package cnp

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// sctpServerEnv is the environment variable prefix with which agnhost's
// porter serves SCTP (SERVE_SCTP_PORT_9003=...).
const sctpServerEnv = "SERVE_SCTP_PORT_"

// WithoutSCTPServers is the suite's client with one change: the pods it
// creates (its base StatefulSets) leave out the containers that serve
// SCTP. On a kernel without SCTP such a container's socket(...,
// IPPROTO_SCTP) fails, agnhost porter exits, the container restarts for
// ever and the suite's setup waits in vain for Ready pods. Only the SCTP
// probes talk to those containers, and they are skipped with their reason.
type WithoutSCTPServers struct {
	client.Client
	// Removed counts the containers left out, for the log.
	Removed *int
}

// Create creates obj without its SCTP server containers.
func (c WithoutSCTPServers) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if err := c.strip(obj); err != nil {
		return err
	}
	return c.Client.Create(ctx, obj, opts...)
}

// Update updates obj without its SCTP server containers.
func (c WithoutSCTPServers) Update(ctx context.Context, obj client.Object, opts ...client.UpdateOption) error {
	if err := c.strip(obj); err != nil {
		return err
	}
	return c.Client.Update(ctx, obj, opts...)
}

func (c WithoutSCTPServers) strip(obj client.Object) error {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil
	}
	n, err := StripSCTPServers(u)
	if c.Removed != nil {
		*c.Removed += n
	}
	return err
}

// StripSCTPServers removes from a workload's pod template (StatefulSet,
// Deployment, DaemonSet) or a Pod every container that serves SCTP, and
// says how many it removed.
func StripSCTPServers(u *unstructured.Unstructured) (int, error) {
	var path []string
	switch u.GetKind() {
	case "StatefulSet", "Deployment", "DaemonSet", "ReplicaSet":
		path = []string{"spec", "template", "spec", "containers"}
	case "Pod":
		path = []string{"spec", "containers"}
	default:
		return 0, nil
	}
	cs, found, err := unstructured.NestedSlice(u.Object, path...)
	if err != nil || !found {
		return 0, fmt.Errorf("%s %s/%s: containers: %v", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	var keep []any
	for _, c := range cs {
		if !servesSCTP(c) {
			keep = append(keep, c)
		}
	}
	if len(keep) == len(cs) {
		return 0, nil
	}
	if err := unstructured.SetNestedSlice(u.Object, keep, path...); err != nil {
		return 0, fmt.Errorf("%s %s/%s: set containers: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	return len(cs) - len(keep), nil
}

// servesSCTP: the container has an SCTP port or agnhost's SCTP server
// variable.
func servesSCTP(c any) bool {
	m, ok := c.(map[string]any)
	if !ok {
		return false
	}
	env, _, _ := unstructured.NestedSlice(m, "env")
	for _, e := range env {
		if em, ok := e.(map[string]any); ok {
			if name, _ := em["name"].(string); strings.HasPrefix(name, sctpServerEnv) {
				return true
			}
		}
	}
	ports, _, _ := unstructured.NestedSlice(m, "ports")
	for _, p := range ports {
		if pm, ok := p.(map[string]any); ok {
			if proto, _ := pm["protocol"].(string); proto == "SCTP" {
				return true
			}
		}
	}
	return false
}
