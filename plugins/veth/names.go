package veth

import "github.com/podnet/podnet/internal/contract"

// HostVethName returns the deterministic host-side veth name of an
// attachment (contract.HostVethName).
func HostVethName(podNamespace, podName, containerID, ifName string) string {
	return contract.HostVethName(podNamespace, podName, containerID, ifName)
}

// Owner identifies the attachment a veth belongs to; its veths' alias
// records it (contract.VethOwner.Alias).
type Owner = contract.VethOwner

// ParseAlias reverses Owner.Alias. ok is false for links podnet did not
// create and for detached ones (contract.ParseVethAlias).
func ParseAlias(alias string) (o Owner, ok bool) {
	o, detached, ok := contract.ParseVethAlias(alias)
	if !ok || detached {
		return Owner{}, false
	}
	return o, true
}
