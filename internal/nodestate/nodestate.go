// Package nodestate reads and writes the node state file that podnet-routed
// publishes for the plugins: this node's PodCIDRs, the pod MTU and the
// encapsulation in use.
package nodestate

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
)

// DefaultDir is where podnet-routed writes node.json on a real node.
const DefaultDir = "/run/podnet"

// FileName is the name of the state file inside the state directory.
const FileName = "node.json"

// State is the content of node.json.
type State struct {
	NodeName string   `json:"nodeName,omitempty"`
	PodCIDRs []string `json:"podCIDRs,omitempty"`
	MTU      int      `json:"mtu,omitempty"`
	Encap    string   `json:"encap,omitempty"`
	// Error, when set, says why this node cannot host new pods now (its
	// Node object is deleted, has no PodCIDR, or was refused): Read returns
	// it as an error wrapping ErrNodeUnusable. PodCIDRs are then the last
	// ones the node had, for releasing the addresses of its pods (ReadFile).
	Error string `json:"error,omitempty"`
}

// ErrNodeUnusable is returned by Read when podnet-routed wrote why this
// node cannot host pods now.
var ErrNodeUnusable = errors.New("podnet-routed reports this node cannot host pods")

// Equal tells whether s and o say the same.
func (s *State) Equal(o *State) bool {
	return s.NodeName == o.NodeName && s.MTU == o.MTU && s.Encap == o.Encap && s.Error == o.Error &&
		len(s.PodCIDRs) == len(o.PodCIDRs) && func() bool {
		for i := range s.PodCIDRs {
			if s.PodCIDRs[i] != o.PodCIDRs[i] {
				return false
			}
		}
		return true
	}()
}

// ErrNotReady is returned by Read when the state file does not exist yet.
var ErrNotReady = errors.New("node state not published yet (is podnet-routed running on this node?)")

// Path returns the state file path for dir (DefaultDir when empty).
func Path(dir string) string {
	if dir == "" {
		dir = DefaultDir
	}
	return filepath.Join(dir, FileName)
}

// Read loads the state file from dir. A missing file yields an error wrapping
// ErrNotReady, a file that says the node cannot host pods one wrapping
// ErrNodeUnusable with the reason; every other error names the file.
func Read(dir string) (*State, error) {
	s, err := ReadFile(dir)
	if err == nil && s.Error != "" {
		return nil, fmt.Errorf("%s: %w: %s", Path(dir), ErrNodeUnusable, s.Error)
	}
	return s, err
}

// ReadFile loads the state file from dir as it is, Error included.
func ReadFile(dir string) (*State, error) {
	p := Path(dir)
	data, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: %w", p, ErrNotReady)
	}
	if err != nil {
		return nil, fmt.Errorf("read node state %s: %w", p, err)
	}
	s, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("parse node state %s: %w", p, err)
	}
	return s, nil
}

// Parse decodes the content of a state file. It checks the JSON only: the
// PodCIDRs are checked by PodCIDRPrefixes, so that a reader that needs only
// the MTU is not refused for them.
func Parse(data []byte) (*State, error) {
	var s State
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// PodCIDRPrefixes parses the PodCIDRs and checks each one with
// CheckPodCIDR; the error quotes the value refused. The prefixes are
// returned masked.
func (s *State) PodCIDRPrefixes() ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(s.PodCIDRs))
	for _, c := range s.PodCIDRs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("podCIDR %q: %w: %v", c, ErrBadPodCIDR, err)
		}
		if err := CheckPodCIDR(p); err != nil {
			return nil, fmt.Errorf("podCIDR %q: %w", c, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Write stores s atomically (temp file, fsync, rename) in dir.
func Write(dir string, s *State) error {
	p := Path(dir)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("encode node state: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(p), ".node.json.*")
	if err != nil {
		return fmt.Errorf("create temp state file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(data, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("write temp state file: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("chmod temp state file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("sync temp state file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close temp state file: %w", err)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fmt.Errorf("install node state %s: %w", p, err)
	}
	return nil
}

// Remove deletes the state file in dir; a missing file is fine.
func Remove(dir string) error {
	if err := os.Remove(Path(dir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove node state: %w", err)
	}
	return nil
}
