// Command podnet is the routed-veth (Calico-style) CNI plugin: one veth pair
// per pod, the pod's addresses as /32 and /128 with default routes via a
// link-local gateway that the host veth answers for, and a host route per pod
// address to the host veth. The verbs are plugins/veth's routed mode.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/podnet/podnet/internal/oneshot"
	"github.com/podnet/podnet/plugins/veth"
)

func main() {
	oneshot.Start()
	skel.PluginMainFuncs(veth.Routed(), veth.VersionInfo(), "podnet: routed veth CNI plugin")
}
