package veth

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// writeSysctl sets a per-netns kernel setting such as
// "net/ipv4/conf/eth0/proxy_arp" for the calling thread's netns.
func writeSysctl(name, value string) error {
	var w sysctlWriter
	defer w.close()
	return w.write(name, value)
}

// sysctlWriter sets several settings of the calling thread's netns,
// opening each directory once and each setting from it. Every netns that
// touched /proc/sys/net/ipv4 or ipv6 keeps a dentry of that name under the
// one /proc/sys/net, and the kernel compares a lookup with each of them
// (proc_sys_compare): with a pod netns per pod, a path walked from the top
// costs time in the pods on the node (the ADD of the thousandth pod took
// 1.5 times the first's, most of it in these walks).
type sysctlWriter struct {
	dirs map[string]int
}

func (w *sysctlWriter) write(name, value string) error {
	dir, key := path.Split(name)
	fd, ok := w.dirs[dir]
	if !ok {
		var err error
		fd, err = unix.Open(filepath.Join("/proc/sys", dir), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("set %s=%s: %w", name, value, &fs.PathError{Op: "open", Path: filepath.Join("/proc/sys", dir), Err: err})
		}
		if w.dirs == nil {
			w.dirs = map[string]int{}
		}
		w.dirs[dir] = fd
	}
	f, err := unix.Openat(fd, key, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("set %s=%s: %w", name, value, &fs.PathError{Op: "open", Path: filepath.Join("/proc/sys", name), Err: err})
	}
	_, err = unix.Write(f, []byte(value))
	unix.Close(f)
	if err != nil {
		return fmt.Errorf("set %s=%s: %w", name, value, &fs.PathError{Op: "write", Path: filepath.Join("/proc/sys", name), Err: err})
	}
	return nil
}

func (w *sysctlWriter) close() {
	for _, fd := range w.dirs {
		unix.Close(fd)
	}
	w.dirs = nil
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
	var w sysctlWriter
	defer w.close()
	return hardenHostIfaceWith(&w, dev)
}

// hardenHostIfaceWith is hardenHostIface with w.
func hardenHostIfaceWith(w *sysctlWriter, dev string) error {
	for _, s := range hostIfaceSettings {
		if err := w.write(s.name(dev), s.value); err != nil {
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

// noKernelLinkLocal keeps the kernel from giving host veth link an IPv6
// link-local address of its own when it comes up (addr_gen_mode 1), and
// with it the address's DAD, MLD report and fe80::/64 route: a routed
// pod's gateway address is added by hand, and a bridge port needs no
// address. The node's IPv6 state would otherwise grow with its pods. No
// IPv6 on the interface is fine. h is a netlink handle of link's netns.
func noKernelLinkLocal(h *netlink.Handle, link netlink.Link) error {
	return setAddrGenMode(h, link, addrGenModeNone)
}

// IPv6 address generation modes (IN6_ADDR_GEN_MODE_*).
const (
	addrGenModeEUI64 = 0
	addrGenModeNone  = 1
)

// setAddrGenMode sets link's IPv6 addr_gen_mode by netlink (no walk of
// /proc/sys, see sysctlWriter), in the calling thread's netns; an
// interface without IPv6 (IPv6 off, an MTU below 1280) is left as it is.
// h is a netlink handle of link's netns (&netlink.Handle{}: a socket of
// the thread's netns for the one request).
// A kernel that refuses the attribute gets the sysctl.
func setAddrGenMode(h *netlink.Handle, link netlink.Link, mode int) error {
	err := h.LinkSetIP6AddrGenMode(link, mode)
	switch {
	case err == nil, errors.Is(err, unix.EAFNOSUPPORT):
		return nil
	case errors.Is(err, unix.EINVAL), errors.Is(err, unix.EOPNOTSUPP):
		name := link.Attrs().Name
		if err := writeSysctl("net/ipv6/conf/"+name+"/addr_gen_mode", strconv.Itoa(mode)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return nil
	}
	return fmt.Errorf("set addr_gen_mode %d on %s: %w", mode, link.Attrs().Name, err)
}
