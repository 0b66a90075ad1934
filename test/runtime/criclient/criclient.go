// Package criclient is a small kubelet-like client of the CRI runtime
// service (k8s.io/cri-api, runtime.v1): it runs, inspects, stops and
// removes pod sandboxes the way kubelet does, which makes the runtime exec
// the CNI plugins (ADD on run, DEL on stop and again on remove).
package criclient

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Client talks to one runtime's CRI socket.
type Client struct {
	conn    *grpc.ClientConn
	Runtime cri.RuntimeServiceClient
}

// Dial connects to the CRI unix socket at path. The connection is lazy:
// the first call fails when nothing listens.
func Dial(path string) (*Client, error) {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("CRI client for %s: %w", path, err)
	}
	return &Client{conn: conn, Runtime: cri.NewRuntimeServiceClient(conn)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// NetworkReady reports the runtime's NetworkReady condition (false with
// the runtime's reason when its CNI config is not loaded).
func (c *Client) NetworkReady(ctx context.Context) (bool, string, error) {
	st, err := c.Runtime.Status(ctx, &cri.StatusRequest{})
	if err != nil {
		return false, "", err
	}
	for _, cond := range st.GetStatus().GetConditions() {
		if cond.Type == cri.NetworkReady {
			return cond.Status, cond.Reason + ": " + cond.Message, nil
		}
	}
	return false, "no NetworkReady condition", nil
}

// Pod names a pod the way kubelet fills PodSandboxMetadata; the runtime
// passes Namespace and Name to the CNI plugins as K8S_POD_NAMESPACE and
// K8S_POD_NAME.
type Pod struct {
	Name, Namespace, UID string
	Attempt              uint32
	// CgroupParent is the parent cgroup of the sandbox (cgroupfs path).
	CgroupParent string
}

// RunPod creates and starts a pod sandbox with its own network namespace
// and returns the sandbox ID.
func (c *Client) RunPod(ctx context.Context, pod Pod) (string, error) {
	cfg := &cri.PodSandboxConfig{
		Metadata: &cri.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: pod.UID, Attempt: pod.Attempt},
		Hostname: pod.Name,
		Linux: &cri.LinuxPodSandboxConfig{
			CgroupParent: pod.CgroupParent,
			SecurityContext: &cri.LinuxSandboxSecurityContext{
				NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_POD, Pid: cri.NamespaceMode_POD, Ipc: cri.NamespaceMode_POD},
			},
		},
	}
	r, err := c.Runtime.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return "", fmt.Errorf("RunPodSandbox %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return r.PodSandboxId, nil
}

// StopPod stops a sandbox (the runtime runs CNI DEL with the netns and the
// cached result, then removes the netns).
func (c *Client) StopPod(ctx context.Context, id string) error {
	if _, err := c.Runtime.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("StopPodSandbox %.12s: %w", id, err)
	}
	return nil
}

// RemovePod removes a stopped sandbox (containerd 1.6 runs CNI DEL once
// more, without netns or cached result).
func (c *Client) RemovePod(ctx context.Context, id string) error {
	if _, err := c.Runtime.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("RemovePodSandbox %.12s: %w", id, err)
	}
	return nil
}

// StopAndRemove is kubelet's teardown of a deleted pod.
func (c *Client) StopAndRemove(ctx context.Context, id string) error {
	if err := c.StopPod(ctx, id); err != nil {
		return err
	}
	return c.RemovePod(ctx, id)
}

// Sandbox is what PodSandboxStatus tells about one sandbox.
type Sandbox struct {
	ID        string
	Name      string
	Namespace string
	Ready     bool
	// IP is the pod IP the runtime took from the CNI result.
	IP string
	// NetNS is the path of the pod's network namespace, Pid the pause
	// process (both from the verbose info; empty/0 once stopped).
	NetNS string
	Pid   int
}

// Inspect returns the status of sandbox id.
func (c *Client) Inspect(ctx context.Context, id string) (*Sandbox, error) {
	st, err := c.Runtime.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		return nil, fmt.Errorf("PodSandboxStatus %.12s: %w", id, err)
	}
	s := st.GetStatus()
	sb := &Sandbox{
		ID:        s.GetId(),
		Name:      s.GetMetadata().GetName(),
		Namespace: s.GetMetadata().GetNamespace(),
		Ready:     s.GetState() == cri.PodSandboxState_SANDBOX_READY,
		IP:        s.GetNetwork().GetIp(),
	}
	var info struct {
		Pid         int `json:"pid"`
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct {
					Type string `json:"type"`
					Path string `json:"path"`
				} `json:"namespaces"`
			} `json:"linux"`
		} `json:"runtimeSpec"`
	}
	if raw, ok := st.GetInfo()["info"]; ok {
		if err := json.Unmarshal([]byte(raw), &info); err != nil {
			return nil, fmt.Errorf("PodSandboxStatus %.12s: verbose info: %w", id, err)
		}
	}
	sb.Pid = info.Pid
	for _, n := range info.RuntimeSpec.Linux.Namespaces {
		if n.Type == "network" {
			sb.NetNS = n.Path
		}
	}
	return sb, nil
}

// List returns every sandbox the runtime knows, in any state.
func (c *Client) List(ctx context.Context) ([]*cri.PodSandbox, error) {
	r, err := c.Runtime.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return nil, fmt.Errorf("ListPodSandbox: %w", err)
	}
	return r.Items, nil
}

// WaitReady polls the runtime until it answers and its network is ready,
// or ctx ends.
func (c *Client) WaitReady(ctx context.Context) error {
	var last error
	for {
		callCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		ready, why, err := c.NetworkReady(callCtx)
		cancel()
		switch {
		case err != nil:
			last = err
		case !ready:
			last = fmt.Errorf("network not ready: %s", why)
		default:
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("CRI not ready: %w", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
