package veth

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// hostVethPrefix starts every host-side veth name.
const hostVethPrefix = "pn"

// nameHashLen is how many hex characters of a hash follow the prefix in
// the names podnet gives links.
const nameHashLen = 11

// aliasPrefix starts the IFLA_IFALIAS of every host veth podnet creates. The
// alias records which attachment a veth belongs to, so that DEL never deletes
// another sandbox's veth and GC can find leftovers.
const aliasPrefix = "podnet:"

// HostVethName returns the deterministic host-side veth name of an
// attachment: "pn" + 11 hex characters of a hash of the pod (namespace/name
// when the runtime passes them, else the container ID) and the interface
// name inside the pod. It is 13 characters, below the 15-character limit.
func HostVethName(podNamespace, podName, containerID, ifName string) string {
	key := containerID
	if podNamespace != "" && podName != "" {
		key = podNamespace + "/" + podName
	}
	sum := sha256.Sum256([]byte(key + "\x00" + ifName))
	return hostVethPrefix + hex.EncodeToString(sum[:])[:nameHashLen]
}

// Owner identifies the attachment a host veth belongs to.
type Owner struct {
	Network     string
	ContainerID string
	IfName      string
}

// alias is the IFLA_IFALIAS value recorded on the host veth.
func (o Owner) alias() string {
	return aliasPrefix + o.Network + ":" + o.ContainerID + ":" + o.IfName
}

// detachedAliasPrefix replaces aliasPrefix on a host veth that DEL
// detached (detach.go): still podnet's, no longer in service.
const detachedAliasPrefix = "podnet-detached:"

// detachedAlias is the alias of a host veth DEL detached.
func (o Owner) detachedAlias() string {
	return detachedAliasPrefix + strings.TrimPrefix(o.alias(), aliasPrefix)
}

// ParseAlias reverses alias. ok is false for links podnet did not create
// and for detached ones (parseAnyAlias).
func ParseAlias(alias string) (o Owner, ok bool) {
	return parseAlias(alias, aliasPrefix)
}

// parseAnyAlias reverses alias and detachedAlias: ok is true for every
// veth podnet created; detached says whether DEL has detached it.
func parseAnyAlias(alias string) (o Owner, detached, ok bool) {
	if o, ok := parseAlias(alias, detachedAliasPrefix); ok {
		return o, true, true
	}
	o, ok = parseAlias(alias, aliasPrefix)
	return o, false, ok
}

func parseAlias(alias, prefix string) (o Owner, ok bool) {
	rest, found := strings.CutPrefix(alias, prefix)
	if !found {
		return Owner{}, false
	}
	parts := strings.SplitN(rest, ":", 3)
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return Owner{}, false
	}
	return Owner{Network: parts[0], ContainerID: parts[1], IfName: parts[2]}, true
}
