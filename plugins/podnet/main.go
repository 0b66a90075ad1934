// Command podnet is the routed-veth (Calico-style) CNI plugin: one veth pair
// per pod, the pod's addresses as /32 and /128 with default routes via a
// link-local gateway that the host veth answers for, and a host route per pod
// address to the host veth.
package main

import (
	"context"
	"net"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/podnet/podnet/internal/cnicore"
	"github.com/podnet/podnet/internal/podlink"
	"github.com/podnet/podnet/ipam"
)

// plugin holds what the verbs need from outside. failAfter, set only by
// tests, is called after each ADD step and makes ADD fail there.
type plugin struct {
	ipam      cnicore.IPAM
	failAfter func(step string) error
}

func main() {
	p := &plugin{ipam: ipam.Auto{}}
	skel.PluginMainFuncs(skel.CNIFuncs{
		Add:    p.cmdAdd,
		Del:    p.cmdDel,
		Check:  p.cmdCheck,
		GC:     p.cmdGC,
		Status: p.cmdStatus,
	}, cnicore.VersionInfo(), "podnet: routed veth CNI plugin")
}

// ipamFor is the IPAM runner for conf: podnet-ipam in-process unless the
// config sets "execIPAM", every other IPAM plugin by exec.
func (p *plugin) ipamFor(conf *cnicore.NetConf) cnicore.IPAM {
	if conf.ExecIPAM {
		return cnicore.ExecIPAM{}
	}
	return p.ipam
}

func (p *plugin) step(name string) error {
	if p.failAfter == nil {
		return nil
	}
	return p.failAfter(name)
}

func (p *plugin) cmdAdd(args *skel.CmdArgs) (err error) {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	podArgs, err := cnicore.ParseArgs(args.Args)
	if err != nil {
		return err
	}
	podNS, err := cnicore.OpenNetns(args.Netns)
	if err != nil {
		return err
	}
	defer podNS.Close()
	mtu, err := cnicore.ResolveMTU(conf)
	if err != nil {
		return err
	}
	log, closeLog := cnicore.Logger(conf, "podnet")
	defer closeLog()

	rollback := &cnicore.Rollback{Log: log}
	defer func() {
		if err != nil {
			log.Warn("ADD failed, rolling back", "container", args.ContainerID, "err", err)
			rollback.Run()
		}
	}()

	ctx := context.Background()
	ipam := p.ipamFor(conf)
	ipamResult, err := ipam.Add(ctx, conf.IPAM.Type, args)
	if err != nil {
		return cnicore.IPAMError("ADD", conf.IPAM.Type, err, types.ErrTryAgainLater)
	}
	rollback.Push(func() error { return ipam.Del(ctx, conf.IPAM.Type, args) })
	if err = p.step("ipam"); err != nil {
		return err
	}
	alloc, err := current.NewResultFromResult(ipamResult)
	if err != nil {
		return cnicore.Errorf(types.ErrDecodingFailure, "cannot read the result of IPAM plugin %q: %v", conf.IPAM.Type, err)
	}
	if len(alloc.IPs) == 0 {
		return cnicore.Errorf(types.ErrTryAgainLater, "IPAM plugin %q returned no IP address", conf.IPAM.Type)
	}
	ips := make([]net.IP, 0, len(alloc.IPs))
	for _, c := range alloc.IPs {
		ips = append(ips, c.Address.IP)
	}

	owner := podlink.Owner{Network: conf.Name, ContainerID: args.ContainerID, IfName: args.IfName}
	spec := podlink.VethSpec{
		HostName: podlink.HostVethName(podArgs.PodNamespace, podArgs.PodName, args.ContainerID, args.IfName),
		PodName:  args.IfName,
		MTU:      mtu,
		HostMAC:  podlink.RoutedHostMAC(),
		Owner:    owner,
	}
	if err = podlink.DeleteStaleHostVeth(spec.HostName, owner); err != nil {
		return cnicore.Errorf(types.ErrTryAgainLater, "%v", err)
	}
	host, err := podlink.CreateVeth(spec)
	if err != nil {
		return err
	}
	rollback.Push(func() error { _, err := podlink.DeleteHostVeth(spec.HostName, owner); return err })
	if err = p.step("veth"); err != nil {
		return err
	}
	if err = podlink.MoveToPod(spec, podNS); err != nil {
		return err
	}
	if err = p.step("move"); err != nil {
		return err
	}
	side := podlink.RoutedPodSide(args.IfName, ips, podlink.PodSide{Routes: alloc.Routes})
	if err = podlink.ConfigureRoutedHost(host, podlink.HasIPv6(ips)); err != nil {
		return err
	}
	if err = p.step("host"); err != nil {
		return err
	}
	podIface, err := podlink.ConfigurePodAddresses(podNS, side)
	if err != nil {
		return err
	}
	if err = p.step("address"); err != nil {
		return err
	}
	if err = podlink.ConfigurePodRoutes(podNS, side); err != nil {
		return err
	}
	if err = p.step("route"); err != nil {
		return err
	}
	if err = podlink.AddHostRoutes(host, ips); err != nil {
		return cnicore.Errorf(types.ErrTryAgainLater, "%v", err)
	}
	if err = p.step("host-route"); err != nil {
		return err
	}

	result, err := podlink.RoutedResult(conf.PrevResult, alloc, spec.HostName, podIface, side)
	if err != nil {
		return cnicore.Errorf(types.ErrDecodingFailure, "prevResult: %v", err)
	}
	if len(conf.DNS.Nameservers) > 0 {
		result.DNS = conf.DNS
	}
	log.Info("pod attached", "container", args.ContainerID, "ifname", args.IfName, "hostVeth", spec.HostName, "ips", ips, "mtu", mtu)
	return types.PrintResult(result, conf.CNIVersion)
}

// cmdDel releases the addresses first, then deletes the veth pair (its
// routes go with it). Everything already gone counts as done.
func (p *plugin) cmdDel(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	podArgs, err := cnicore.ParseArgs(args.Args)
	if err != nil {
		return err
	}
	if err := p.ipamFor(conf).Del(context.Background(), conf.IPAM.Type, args); err != nil {
		return cnicore.IPAMError("DEL", conf.IPAM.Type, err, types.ErrTryAgainLater)
	}
	owner := podlink.Owner{Network: conf.Name, ContainerID: args.ContainerID, IfName: args.IfName}
	hostName := podlink.HostVethName(podArgs.PodNamespace, podArgs.PodName, args.ContainerID, args.IfName)
	deleted, err := podlink.DeleteHostVeth(hostName, owner)
	if err != nil {
		return cnicore.Errorf(types.ErrTryAgainLater, "%v", err)
	}
	if !deleted {
		if err := podlink.DeletePodLink(args.Netns, args.IfName); err != nil {
			return cnicore.Errorf(types.ErrTryAgainLater, "%v", err)
		}
	}
	return nil
}

// cmdCheck compares the pod and host side with prevResult.
func (p *plugin) cmdCheck(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	if conf.PrevResult == nil {
		return cnicore.Errorf(types.ErrInvalidNetworkConfig, "CHECK needs the prevResult of ADD in the network config")
	}
	podArgs, err := cnicore.ParseArgs(args.Args)
	if err != nil {
		return err
	}
	if err := p.ipamFor(conf).Check(context.Background(), conf.IPAM.Type, args); err != nil {
		return cnicore.IPAMError("CHECK", conf.IPAM.Type, err, types.ErrInternal)
	}
	prev, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return cnicore.Errorf(types.ErrDecodingFailure, "prevResult: %v", err)
	}
	ips, err := podlink.PodIPs(prev, args.IfName, args.Netns)
	if err != nil {
		return cnicore.Errorf(types.ErrInternal, "CHECK: %v", err)
	}
	podNS, err := cnicore.OpenNetns(args.Netns)
	if err != nil {
		return err
	}
	defer podNS.Close()
	hostName := podlink.HostVethName(podArgs.PodNamespace, podArgs.PodName, args.ContainerID, args.IfName)
	host, err := podlink.CheckRoutedHost(hostName, ips)
	if err != nil {
		return cnicore.Errorf(types.ErrInternal, "CHECK: %v", err)
	}
	side := podlink.RoutedPodSide(args.IfName, ips, podlink.PodSide{Routes: prev.Routes})
	if err := podlink.CheckPod(podNS, side, host.Attrs().Index); err != nil {
		return cnicore.Errorf(types.ErrInternal, "CHECK: %v", err)
	}
	return nil
}

// cmdGC removes the veths (and so the routes) of attachments the runtime no
// longer knows, then lets IPAM release their addresses.
func (p *plugin) cmdGC(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	if _, err := podlink.GCHostVeths(conf.Name, conf.ValidAttachments); err != nil {
		return cnicore.Errorf(types.ErrTryAgainLater, "GC: %v", err)
	}
	if err := p.ipamFor(conf).GC(context.Background(), conf.IPAM.Type, args); err != nil {
		return cnicore.IPAMError("GC", conf.IPAM.Type, err, types.ErrTryAgainLater)
	}
	return nil
}

// cmdStatus reports whether ADD can be served: it can when IPAM can.
func (p *plugin) cmdStatus(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	if err := p.ipamFor(conf).Status(context.Background(), conf.IPAM.Type, args); err != nil {
		return cnicore.IPAMError("STATUS", conf.IPAM.Type, err, types.ErrPluginNotAvailable)
	}
	return nil
}

func loadConf(stdin []byte) (*cnicore.NetConf, error) {
	var conf cnicore.NetConf
	if err := cnicore.LoadConf(stdin, &conf, &conf); err != nil {
		return nil, err
	}
	return &conf, nil
}
