package veth

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// writeSysctl sets a per-netns kernel setting such as
// "net/ipv4/conf/eth0/proxy_arp" for the calling thread's netns.
func writeSysctl(name, value string) error {
	p := filepath.Join("/proc/sys", name)
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("set %s=%s: %w", name, value, err)
	}
	return nil
}

func readSysctl(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", name))
	if err != nil {
		return "", fmt.Errorf("read %s: %w", name, err)
	}
	return strings.TrimSpace(string(b)), nil
}
