// Command podnet-bridge is podnet's bridge-mode CNI plugin: the pods of a
// node share a Linux bridge (default podnet0) that holds their gateway
// address; podnet-routed still carries traffic between nodes. The verb flow
// and the pod side are shared with podnet (plugins/veth, bridged mode).
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/podnet/podnet/internal/oneshot"
	"github.com/podnet/podnet/plugins/veth"
)

func main() {
	oneshot.Start()
	skel.PluginMainFuncs(veth.Bridged(), veth.VersionInfo(), "podnet-bridge: bridge-mode CNI plugin")
}
