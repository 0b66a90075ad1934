package veth

import (
	"errors"
	"fmt"
	"io/fs"
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

// hostIfaceSetting is a setting every host-side interface the plugins
// create gets before it comes up.
type hostIfaceSetting struct {
	family, key, value string
}

// hostIfaceSettings keep a pod from changing its node's routes and
// addresses through the interface: no Router Advertisement is accepted (a
// default route via the pod, CVE-2020-10749), no SLAAC address is made from
// a pod's prefix, no ICMP redirect is followed. accept_ra=0 also holds when
// IPv6 forwarding is off (an IPv4-only cluster), where the kernel's default
// 1 accepts RAs.
var hostIfaceSettings = []hostIfaceSetting{
	{"ipv4", "accept_redirects", "0"},
	{"ipv6", "accept_ra", "0"},
	{"ipv6", "autoconf", "0"},
	{"ipv6", "accept_redirects", "0"},
}

func (s hostIfaceSetting) name(dev string) string {
	return "net/" + s.family + "/conf/" + dev + "/" + s.key
}

// hardenHostIface writes hostIfaceSettings for dev. An interface without
// IPv6 (IPv6 off in the kernel, or an MTU below 1280) has no IPv6 settings
// and takes no Router Advertisement: that is not an error.
func hardenHostIface(dev string) error {
	for _, s := range hostIfaceSettings {
		if err := writeSysctl(s.name(dev), s.value); err != nil {
			if s.family == "ipv6" && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return fmt.Errorf("interface %s: %w", dev, err)
		}
	}
	return nil
}

// checkHostIface reports the first of hostIfaceSettings dev does not have.
func checkHostIface(dev string) error {
	for _, s := range hostIfaceSettings {
		v, err := readSysctl(s.name(dev))
		if err != nil {
			if s.family == "ipv6" && errors.Is(err, fs.ErrNotExist) {
				continue
			}
			return fmt.Errorf("interface %s: %w", dev, err)
		}
		if v != s.value {
			return fmt.Errorf("interface %s has %s=%s, want %s", dev, s.name(dev), v, s.value)
		}
	}
	return nil
}

// noKernelLinkLocal keeps the kernel from giving host veth dev an IPv6
// link-local address of its own when it comes up (addr_gen_mode 1), and
// with it the address's DAD, MLD report and fe80::/64 route: a routed
// pod's gateway address is added by hand, and a bridge port needs no
// address. The node's IPv6 state would otherwise grow with its pods. No
// such sysctl (no IPv6 on the interface) is fine.
func noKernelLinkLocal(dev string) error {
	if err := writeSysctl("net/ipv6/conf/"+dev+"/addr_gen_mode", "1"); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}
