package veth

import (
	"errors"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// refuseOwnNetns fails with code 8 (invalid netns) when path is the
// plugin's own network namespace, the node's: every verb would then act on
// the node itself (ADD would leave pod routes on it; DEL's fallback could
// delete the uplink named by CNI_IFNAME). An empty or missing path is not
// the plugin's netns (DEL must still succeed for a pod that is gone).
func refuseOwnNetns(path string) error {
	if path == "" {
		return nil
	}
	var target, self unix.Stat_t
	if err := unix.Stat(path, &target); err != nil {
		return nil // missing or unreadable: openNetns reports it where it matters
	}
	if err := unix.Stat("/proc/self/ns/net", &self); err != nil {
		return cniErrorf(types.ErrInternal, "cannot read the plugin's own network namespace: %v", err)
	}
	if target.Dev == self.Dev && target.Ino == self.Ino {
		return cniErrorf(types.ErrInvalidNetNS, "CNI_NETNS %s is the network namespace the plugin runs in (the node's), not a pod's: refusing to touch it", path)
	}
	return nil
}

// openNetns opens the pod netns. A path that does not exist or is not a
// netns is error code 3 (the container is gone or unknown).
func openNetns(path string) (ns.NetNS, error) {
	podNS, err := ns.GetNS(path)
	if err == nil {
		return podNS, nil
	}
	var notExist ns.NSPathNotExistErr
	if errors.As(err, &notExist) {
		return nil, cniErrorf(types.ErrUnknownContainer, "CNI_NETNS %s does not exist (has the container exited?)", path)
	}
	var notNS ns.NSPathNotNSErr
	if errors.As(err, &notNS) {
		return nil, cniErrorf(types.ErrUnknownContainer, "CNI_NETNS %s is not a network namespace", path)
	}
	return nil, cniErrorf(types.ErrUnknownContainer, "cannot open CNI_NETNS %s: %v", path, err)
}

// openNetnsForDel opens CNI_NETNS for DEL, or returns nil when there is
// none to open (empty, gone, not a netns): DEL must succeed for a pod that
// is gone, and then simply deletes what is left on the node.
func openNetnsForDel(path string) ns.NetNS {
	if path == "" {
		return nil
	}
	podNS, err := ns.GetNS(path)
	if err != nil {
		return nil
	}
	return podNS
}
