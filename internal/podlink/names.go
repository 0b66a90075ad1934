// Package podlink holds the link-level work shared by the podnet plugins: the
// veth pair of a pod, the pod-side addresses and routes, the host-side
// settings and routes, and their checks and teardown.
package podlink

import (
	"crypto/sha256"
	"encoding/hex"
	"net"
	"strings"
)

// HostMAC is the fixed MAC address of every routed host veth. The pod always
// resolves its gateway to it, so a host veth can be recreated without the pod
// having to re-learn a neighbor.
const HostMAC = "ee:ee:ee:ee:ee:ee"

// GatewayV4 is the link-local IPv4 gateway every routed pod uses. Nothing
// owns it: the host veth answers for it by proxy ARP, and the pod also gets a
// permanent neighbor entry for it.
const GatewayV4 = "169.254.1.1"

// GatewayV6 is the link-local address of every routed host veth, the EUI-64
// address of HostMAC. It is the pod's IPv6 default gateway.
const GatewayV6 = "fe80::ecee:eeff:feee:eeee"

// hostVethPrefix starts every host-side veth name.
const hostVethPrefix = "pn"

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
	return hostVethPrefix + hex.EncodeToString(sum[:])[:11]
}

// Owner identifies the attachment a host veth belongs to.
type Owner struct {
	Network     string
	ContainerID string
	IfName      string
}

// Alias is the IFLA_IFALIAS value recorded on the host veth.
func (o Owner) Alias() string {
	return aliasPrefix + o.Network + ":" + o.ContainerID + ":" + o.IfName
}

// ParseAlias reverses Alias. ok is false for links podnet did not create.
func ParseAlias(alias string) (o Owner, ok bool) {
	rest, found := strings.CutPrefix(alias, aliasPrefix)
	if !found {
		return Owner{}, false
	}
	parts := strings.SplitN(rest, ":", 3)
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return Owner{}, false
	}
	return Owner{Network: parts[0], ContainerID: parts[1], IfName: parts[2]}, true
}

func mustParseMAC(s string) net.HardwareAddr {
	mac, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return mac
}
