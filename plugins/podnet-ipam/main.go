// Command podnet-ipam is the host-local IPAM plugin of podnet, usable by any
// CNI plugin: `"ipam": {"type": "podnet-ipam", ...}`.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/podnet/podnet/internal/cniresult"
	"github.com/podnet/podnet/internal/oneshot"
	"github.com/podnet/podnet/ipam"
)

func main() {
	oneshot.Start()
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add: func(args *skel.CmdArgs) error {
			res, err := ipam.Add(ipam.RequestFrom(args))
			if err != nil {
				return err
			}
			return cniresult.Print(os.Stdout, res, ipam.CNIVersion(args.StdinData))
		},
		Del:    func(args *skel.CmdArgs) error { return ipam.Del(ipam.RequestFrom(args)) },
		Check:  func(args *skel.CmdArgs) error { return ipam.Check(ipam.RequestFrom(args)) },
		GC:     func(args *skel.CmdArgs) error { return ipam.GC(ipam.RequestFrom(args)) },
		Status: func(args *skel.CmdArgs) error { return ipam.Status(ipam.RequestFrom(args)) },
	}, ipam.VersionInfo(), "podnet-ipam: host-local IPAM with PodCIDR, GC and STATUS")
}
