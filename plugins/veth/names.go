package veth

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/podnet/podnet/internal/contract"
)

// nameHashLen is how many hex characters of a hash follow the prefix in
// the names podnet gives links.
const nameHashLen = 11

// HostVethName returns the deterministic host-side veth name of an
// attachment: contract.HostVethPrefix ("pn") + 11 hex characters of a hash
// of the pod (namespace/name when the runtime passes them, else the
// container ID) and the interface name inside the pod. It is 13
// characters, below the 15-character limit.
func HostVethName(podNamespace, podName, containerID, ifName string) string {
	key := containerID
	if podNamespace != "" && podName != "" {
		key = podNamespace + "/" + podName
	}
	sum := sha256.Sum256([]byte(key + "\x00" + ifName))
	return contract.HostVethPrefix + hex.EncodeToString(sum[:])[:nameHashLen]
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
