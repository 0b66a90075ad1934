// Package veth is podnet's veth CNI plugin in its two modes: routed (the
// podnet binary, Calico-style: a /32 per pod, routed by the node) and bridged
// (podnet-bridge: the node's pods share a Linux bridge). One file per idea:
// verbs.go the verbs and the rollback stack of ADD; routed.go and bridged.go
// what each mode does on the node; vethpair.go and detach.go the veth pair;
// pod.go the pod side; names.go host veth names and aliases; result.go the
// ADD result; config.go the network config and MTU; netns.go opening the
// pod netns; sysctl.go per-netns kernel settings and those of every
// host-side interface; internal/podfilter the pod filter (pods send only as
// themselves); delegate.go the IPAM delegation; log.go and trace.go the
// optional log and step trace.
package veth

import (
	"errors"
	"log/slog"
	"net"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/attachment"
	"github.com/podnet/podnet/internal/cniresult"
	"github.com/podnet/podnet/internal/podfilter"
	"github.com/podnet/podnet/ipam"
)

// mode is what one plugin does differently.
type mode interface {
	// hostMAC is the host veth's MAC (nil: the kernel picks one).
	hostMAC() net.HardwareAddr
	// describePod says how the pod end is addressed and routed.
	describePod(ifName string, alloc *current.Result) (podSide, error)
	// prepareNode runs before the veth exists (e.g. ensure the bridge,
	// with the pod MTU). It must be idempotent: nothing it creates is rolled
	// back, as other pods share it.
	prepareNode(side podSide, mtu int) error
	// attachHost runs right after the veth pair is created, before
	// podnet-routed hears of the pod (e.g. the bridge port: the engine
	// judges a bridge's pods by their addresses); the host end is down.
	// h, in these three, is the ADD's netlink handle of the node netns.
	attachHost(h *netlink.Handle, host netlink.Link) error
	// setupHost configures the host end and brings it up.
	setupHost(h *netlink.Handle, host netlink.Link, side podSide) error
	// finishHost runs after the pod is configured (e.g. node routes to it).
	finishHost(h *netlink.Handle, host netlink.Link, side podSide) error
	// checkHost verifies the host end for CHECK and returns it.
	checkHost(hostName string, side podSide) (netlink.Link, error)
	// guard is the pod filter of the mode (internal/podfilter).
	guard() podfilter.Guard
	// result builds the ADD result on top of prev (the chained
	// prevResult, nil when podnet is first).
	result(prev *current.Result, hostName string, podIface *current.Interface, side podSide) *current.Result
}

// plugin runs the verbs of one plugin.
type plugin struct {
	name string
	// newMode builds the mode from the network config of an invocation.
	newMode func(stdin []byte, conf *netConf) (mode, error)
	// failAfter, set only by tests, is called after each ADD step
	// ("ipam", "veth", "address", "route", "guard", "host", "host-route";
	// the pod end of the veth is born in the pod netns, so "veth" includes
	// the move) and makes ADD fail there.
	failAfter func(step string) error
}

// funcs returns the verbs for skel.
func (p *plugin) funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.add, Del: p.del, Check: p.check, GC: p.gc, Status: p.status}
}

func (p *plugin) step(name string) error {
	if p.failAfter == nil {
		return nil
	}
	return p.failAfter(name)
}

// invocation is what every verb starts from.
type invocation struct {
	conf  *netConf
	mode  mode
	owner Owner
	host  string
	pod   podArgs
	// nl is ADD's netlink handle of the node netns: one socket for the
	// verb's requests there, not one each
	nl *netlink.Handle
}

func (p *plugin) begin(args *skel.CmdArgs) (*invocation, error) {
	// before anything else: never act on the node's own netns as a pod's
	if err := refuseOwnNetns(args.Netns); err != nil {
		return nil, err
	}
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return nil, err
	}
	m, err := p.newMode(args.StdinData, conf)
	if err != nil {
		return nil, err
	}
	pod, err := parseArgs(args.Args)
	if err != nil {
		return nil, err
	}
	return &invocation{
		conf:  conf,
		mode:  m,
		owner: Owner{Network: conf.Name, ContainerID: args.ContainerID, IfName: args.IfName},
		host:  HostVethName(pod.PodNamespace, pod.PodName, args.ContainerID, args.IfName),
		pod:   pod,
	}, nil
}

// add attaches the pod. Every step that succeeded is undone, newest first,
// when a later one fails.
func (p *plugin) add(args *skel.CmdArgs) (err error) {
	tr := newTrace("ADD")
	defer tr.write(&err)
	inv, err := p.begin(args)
	if err != nil {
		return err
	}
	tr.mark("config")
	podNS, err := openNetns(args.Netns)
	if err != nil {
		return err
	}
	defer podNS.Close()
	nl, err := netlinksafe.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return cniErrorf(types.ErrTryAgainLater, "netlink socket: %v", err)
	}
	defer nl.Close()
	inv.nl = nl.Handle
	tr.mark("netns")
	mtu, err := resolveMTU(inv.conf, inv.nl)
	if err != nil {
		return err
	}
	tr.mark("mtu")
	log, closeLog := newLogger(inv.conf, p.name)
	defer closeLog()
	rollback := &undoStack{log: log}
	defer func() {
		if err != nil {
			log.Warn("ADD failed, rolling back", "container", args.ContainerID, "err", err)
			rollback.run()
		}
	}()

	alloc, side, err := p.allocate(inv, args, mtu, rollback, tr)
	if err != nil {
		return err
	}
	spec := vethSpec{HostName: inv.host, PodName: args.IfName, MTU: mtu, HostMAC: inv.mode.hostMAC(), Owner: inv.owner}
	host, port, err := p.plumbVeth(inv, spec, side, podNS, rollback, tr)
	if err != nil {
		return err
	}
	// the engine's wait goes out once the veth pair exists, asking
	// podnet-routed to guard the port too; the plugin sets up the pod side
	// meanwhile (no packet passes while the host end is down), reads the
	// guard's answer before the host end comes up, and the policy's at the
	// end: the engine writes meanwhile
	pw := startPolicyWait(inv, args.ContainerID, side.ips(), log, guardPort(inv.mode.guard(), port))
	defer func() {
		if err != nil {
			pw.abandon()
		}
	}()
	podIface, err := p.configure(inv, host, side, podNS, tr, func() error { return p.guard(inv, port, pw, tr) })
	if err != nil {
		return err
	}
	pw.finish()
	tr.mark("policy")

	result, err := addResult(inv, alloc, spec.HostName, podIface, side)
	if err != nil {
		return err
	}
	log.Info("pod attached", "container", args.ContainerID, "ifname", args.IfName, "hostVeth", spec.HostName, "addrs", side.Addrs, "mtu", mtu)
	err = cniresult.Print(os.Stdout, result, inv.conf.CNIVersion)
	tr.mark("result")
	return err
}

// passed marks the step name of ADD done in the trace and fails it when a
// test says so (failAfter).
func (p *plugin) passed(tr *trace, name string) error {
	tr.mark(name)
	return p.step(name)
}

// allocate asks the IPAM plugin for the pod's addresses (undone by an IPAM
// DEL), says how the pod end is addressed and prepares the node for it.
func (p *plugin) allocate(inv *invocation, args *skel.CmdArgs, mtu int, rollback *undoStack, tr *trace) (*current.Result, podSide, error) {
	ipamResult, err := ipamAdd(inv.conf, args)
	if err != nil {
		return nil, podSide{}, ipamError("ADD", inv.conf.IPAM.Type, err, types.ErrTryAgainLater)
	}
	rollback.push(func() error { return ipamVerb("DEL", ipam.Del, inv.conf, args) })
	if err = p.passed(tr, "ipam"); err != nil {
		return nil, podSide{}, err
	}
	alloc, err := current.NewResultFromResult(ipamResult)
	if err != nil {
		return nil, podSide{}, cniErrorf(types.ErrDecodingFailure, "cannot read the result of IPAM plugin %q: %v", inv.conf.IPAM.Type, err)
	}
	if len(alloc.IPs) == 0 {
		return nil, podSide{}, cniErrorf(types.ErrTryAgainLater, "IPAM plugin %q returned no IP address", inv.conf.IPAM.Type)
	}
	side, err := inv.mode.describePod(args.IfName, alloc)
	if err != nil {
		return nil, podSide{}, err
	}
	if err = inv.mode.prepareNode(side, mtu); err != nil {
		return nil, podSide{}, err
	}
	tr.mark("prepare")
	return alloc, side, nil
}

// plumbVeth replaces a stale host veth of the same name and creates the
// veth pair (undone on a later failure, with the pod filter's elements of
// its host end). It returns the host end and the port the pod filter is
// to guard.
func (p *plugin) plumbVeth(inv *invocation, spec vethSpec, side podSide, podNS ns.NetNS, rollback *undoStack, tr *trace) (netlink.Link, podfilter.Port, error) {
	g := inv.mode.guard().At(inv.conf.StateDir)
	host, podMAC, err := createVeth(inv.nl, spec, podNS)
	if errors.Is(err, errHostNameTaken) {
		// only then look for a stale one (a lookup takes the RTNL lock,
		// which every pod being set up on the node queues for)
		stale, serr := deleteStaleHostVeth(spec.HostName)
		if serr == nil && stale > 0 {
			serr = g.RemovePort(stale)
		}
		if serr != nil {
			return nil, podfilter.Port{}, cniErrorf(types.ErrTryAgainLater, "%v", serr)
		}
		tr.mark("stale-veth")
		host, podMAC, err = createVeth(inv.nl, spec, podNS)
	}
	if err != nil {
		if errors.Is(err, errIfNameTaken) {
			return nil, podfilter.Port{}, cniErrorf(types.ErrInvalidEnvironmentVariables, "%v", err)
		}
		return nil, podfilter.Port{}, err
	}
	port := podfilter.Port{Index: host.Attrs().Index, Name: spec.HostName, Alias: inv.owner.Alias(), IPs: side.ips(), MAC: podMAC}
	rollback.push(func() error {
		_, err := deleteHostVeth(spec.HostName, inv.owner)
		// after the veth, so that no live port is ever left unguarded
		return errors.Join(err, g.RemoveExact(port))
	})
	if err = inv.mode.attachHost(inv.nl, host); err != nil {
		return nil, podfilter.Port{}, err
	}
	if err = p.passed(tr, "veth"); err != nil {
		return nil, podfilter.Port{}, err
	}
	return host, port, nil
}

// guard puts the host end in the pod filter before it comes up: from its
// first packet on, the pod sends only as itself. podnet-routed does it
// when the policy wait asked it to and it says so in time (its nftables
// socket stays open; a plugin's closes at its exit, and the kernel holds
// the node's nftables commit lock through that close until what earlier
// transactions removed is freed, a grace period every other writer
// waits for); else the plugin writes the elements itself.
func (p *plugin) guard(inv *invocation, port podfilter.Port, pw *policyWait, tr *trace) error {
	if !pw.guarded() {
		if err := inv.mode.guard().At(inv.conf.StateDir).Install(port); err != nil {
			return cniErrorf(types.ErrTryAgainLater, "%v", err)
		}
	}
	return p.passed(tr, "guard")
}

// configure sets up the pod's addresses and routes (its interface comes
// up, but no packet passes while the host end is down), puts the host end
// in the pod filter (guard), sets it up, then the node's route to the pod.
// It returns the pod's interface for the result.
func (p *plugin) configure(inv *invocation, host netlink.Link, side podSide, podNS ns.NetNS, tr *trace, guard func() error) (*current.Interface, error) {
	podIface, err := configurePod(podNS, side, inv.owner.Alias(), func(step string) error { return p.passed(tr, step) })
	if err != nil {
		return nil, err
	}
	if err := guard(); err != nil {
		return nil, err
	}
	if err := inv.mode.setupHost(inv.nl, host, side); err != nil {
		return nil, err
	}
	if err := p.passed(tr, "host"); err != nil {
		return nil, err
	}
	if err = inv.mode.finishHost(inv.nl, host, side); err != nil {
		return nil, cniErrorf(types.ErrTryAgainLater, "%v", err)
	}
	if err = p.passed(tr, "host-route"); err != nil {
		return nil, err
	}
	return podIface, nil
}

// addResult is the result ADD prints: the mode's, on top of prevResult,
// with the network config's DNS, else the IPAM plugin's.
func addResult(inv *invocation, alloc *current.Result, hostName string, podIface *current.Interface, side podSide) (*current.Result, error) {
	var prev *current.Result
	if inv.conf.PrevResult != nil {
		var err error
		if prev, err = current.NewResultFromResult(inv.conf.PrevResult); err != nil {
			return nil, cniErrorf(types.ErrDecodingFailure, "prevResult: %v", err)
		}
	}
	result := inv.mode.result(prev, hostName, podIface, side)
	switch {
	case len(inv.conf.DNS.Nameservers) > 0:
		result.DNS = inv.conf.DNS
	case len(alloc.DNS.Nameservers) > 0:
		result.DNS = alloc.DNS
	}
	return result, nil
}

// del takes the veth pair out of service, removes its elements from the
// pod filter, then releases the addresses.
// When the pod end is still in CNI_NETNS the pair is detached rather than
// deleted (detachOrDeleteVeth: both ends down, the node's routes
// through it gone, CNI_IFNAME free again; the kernel removes the pair with
// the pod netns), which spares DEL the ~20 ms a veth delete costs. Without
// a usable netns it is deleted. Everything already gone counts as done.
func (p *plugin) del(args *skel.CmdArgs) (err error) {
	tr := newTrace("DEL")
	defer tr.write(&err)
	inv, err := p.begin(args)
	if err != nil {
		return err
	}
	tr.mark("config")
	podNS := openNetnsForDel(args.Netns)
	if podNS != nil {
		defer podNS.Close()
	}
	gone, hostIndex, err := detachOrDeleteVeth(inv.host, inv.owner, podNS, args.IfName)
	if err != nil {
		return cniErrorf(types.ErrTryAgainLater, "%v", err)
	}
	switch gone {
	case vethDetached, vethWasDetached:
		tr.mark("veth-detach")
	case vethDeleted:
		tr.mark("veth-delete")
	default:
		if err := deletePodLink(args.Netns, args.IfName, inv.owner); err != nil {
			return cniErrorf(types.ErrTryAgainLater, "%v", err)
		}
		tr.mark("pod-link")
	}
	// after the veth is down or gone, so that its port is never open
	// unguarded; not when an earlier DEL detached it (and removed them)
	if gone == vethDetached || gone == vethDeleted {
		if err := unguard(inv, args, hostIndex); err != nil {
			return cniErrorf(types.ErrTryAgainLater, "%v", err)
		}
		tr.mark("guard")
	}
	// after the host side: the addresses are free only once no route of
	// the node sends them to this pod any more
	if err := ipamVerb("DEL", ipam.Del, inv.conf, args); err != nil {
		return ipamError("DEL", inv.conf.IPAM.Type, err, types.ErrTryAgainLater)
	}
	tr.mark("ipam")
	return nil
}

// unguard removes the pod filter's elements of the attachment whose host
// veth had index hostIndex: exactly those of prevResult when there is one
// (one transaction), else whatever the sets hold for the index.
// podnet-routed does when it listens on the node (unguardByRouted), else
// the plugin.
func unguard(inv *invocation, args *skel.CmdArgs, hostIndex int) error {
	g := inv.mode.guard().At(inv.conf.StateDir)
	port := delPort(inv, args, hostIndex)
	if unguardByRouted(inv, g, port) {
		return nil
	}
	if len(port.IPs) == 0 {
		return g.RemovePort(hostIndex)
	}
	return g.RemoveExact(port)
}

// delPort is the port DEL takes out of the pod filter: host veth index
// hostIndex with the interface's addresses and MAC in prevResult, when
// it has them.
func delPort(inv *invocation, args *skel.CmdArgs, hostIndex int) podfilter.Port {
	port := podfilter.Port{Index: hostIndex}
	if inv.conf.PrevResult == nil {
		return port
	}
	prev, err := current.NewResultFromResult(inv.conf.PrevResult)
	if err != nil {
		return port
	}
	for i, iface := range prev.Interfaces {
		if iface.Name != args.IfName || iface.Sandbox != args.Netns {
			continue
		}
		port.MAC, _ = net.ParseMAC(iface.Mac)
		for _, c := range prev.IPs {
			if c.Interface != nil && *c.Interface == i {
				port.IPs = append(port.IPs, c.Address.IP)
			}
		}
	}
	if port.MAC == nil {
		port.IPs = nil // the exact elements need the MAC: the index's, then
	}
	return port
}

// check compares the pod and the host side with prevResult.
func (p *plugin) check(args *skel.CmdArgs) error {
	inv, err := p.begin(args)
	if err != nil {
		return err
	}
	if inv.conf.PrevResult == nil {
		return cniErrorf(types.ErrInvalidNetworkConfig, "CHECK needs the prevResult of ADD in the network config")
	}
	if err := ipamVerb("CHECK", ipam.Check, inv.conf, args); err != nil {
		return ipamError("CHECK", inv.conf.IPAM.Type, err, types.ErrInternal)
	}
	prev, err := current.NewResultFromResult(inv.conf.PrevResult)
	if err != nil {
		return cniErrorf(types.ErrDecodingFailure, "prevResult: %v", err)
	}
	alloc, err := podAllocation(prev, args.IfName, args.Netns)
	if err != nil {
		return cniErrorf(types.ErrInternal, "CHECK: %v", err)
	}
	side, err := inv.mode.describePod(args.IfName, alloc)
	if err != nil {
		return err
	}
	podNS, err := openNetns(args.Netns)
	if err != nil {
		return err
	}
	defer podNS.Close()
	host, err := inv.mode.checkHost(inv.host, side)
	if err != nil {
		return cniErrorf(types.ErrInternal, "CHECK: %v", err)
	}
	podMAC, err := checkPod(podNS, side, host.Attrs().Index)
	if err != nil {
		return cniErrorf(types.ErrInternal, "CHECK: %v", err)
	}
	if err := checkHostIface(inv.host); err != nil {
		return cniErrorf(types.ErrInternal, "CHECK: host veth: %v", err)
	}
	if err := inv.mode.guard().At(inv.conf.StateDir).Verify(podfilter.Port{Index: host.Attrs().Index, IPs: side.ips(), MAC: podMAC}); err != nil {
		return cniErrorf(types.ErrInternal, "CHECK: %v", err)
	}
	return nil
}

// gc frees the host side of the attachments the runtime no longer knows
// (internal/attachment, as podnet-routed's leak reconcile does: veths,
// routes, pod filter elements) and the pod filter's elements of every
// interface that no longer exists, then lets IPAM release their
// addresses.
func (p *plugin) gc(args *skel.CmdArgs) error {
	inv, err := p.begin(args)
	if err != nil {
		return err
	}
	if err := gcHostSide(inv.conf.Name, inv.conf.ValidAttachments); err != nil {
		return cniErrorf(types.ErrTryAgainLater, "GC: %v", err)
	}
	if err := podfilter.Prune(inv.mode.guard().At(inv.conf.StateDir)); err != nil {
		return cniErrorf(types.ErrTryAgainLater, "GC: %v", err)
	}
	if err := ipamVerb("GC", ipam.GC, inv.conf, args); err != nil {
		return ipamError("GC", inv.conf.IPAM.Type, err, types.ErrTryAgainLater)
	}
	return nil
}

// status reports whether ADD can be served: it can when the config is
// valid, the pod MTU can be resolved (ADD reads it from node.json unless the
// config sets it) and IPAM can serve ADD. Every failure is answered with a
// STATUS code (statusError), the cause in the message.
func (p *plugin) status(args *skel.CmdArgs) error {
	inv, err := p.begin(args)
	if err != nil {
		return statusError(err)
	}
	if _, err := resolveMTU(inv.conf, &netlink.Handle{}); err != nil {
		return statusError(err)
	}
	if err := ipamVerb("STATUS", ipam.Status, inv.conf, args); err != nil {
		return statusError(ipamError("STATUS", inv.conf.IPAM.Type, err, types.ErrPluginNotAvailable))
	}
	return nil
}

// statusError maps a STATUS failure to the codes the CNI spec defines for
// STATUS: 51 ("not available, and existing containers may have limited
// connectivity") when the cause, e.g. a delegated IPAM plugin, says so
// already; 50 ("not available") for anything else, such as the 5 or 11 an
// IPAM plugin answers for an unusable data directory or node state. The
// cause's message and details are kept.
func statusError(err error) error {
	var te *types.Error
	if !errors.As(err, &te) {
		return types.NewError(types.ErrPluginNotAvailable, err.Error(), "")
	}
	if te.Code == types.ErrPluginNotAvailable || te.Code == types.ErrLimitedConnectivity {
		return te
	}
	return types.NewError(types.ErrPluginNotAvailable, te.Msg, te.Details)
}

// undoStack is the undo stack of an ADD: each successful step pushes its
// undo; on failure run undoes them in reverse order.
type undoStack struct {
	undo []func() error
	log  *slog.Logger
}

// push records how to undo a step that succeeded.
func (r *undoStack) push(undo func() error) { r.undo = append(r.undo, undo) }

// run undoes every recorded step, newest first, and logs undo failures.
func (r *undoStack) run() {
	for i := len(r.undo) - 1; i >= 0; i-- {
		if err := r.undo[i](); err != nil && r.log != nil {
			r.log.Error("rollback step failed", "err", err)
		}
	}
	r.undo = nil
}

// gcHostSide frees the host side of every attachment of network whose veth
// is on the node but which is not in valid.
func gcHostSide(network string, valid []types.GCAttachment) error {
	owned, err := attachment.HostLinks(network)
	if err != nil {
		return err
	}
	keep := make(map[[2]string]bool, len(valid))
	for _, a := range valid {
		keep[[2]string{a.ContainerID, a.IfName}] = true
	}
	var errs []error
	for o, links := range owned {
		if keep[[2]string{o.ContainerID, o.IfName}] {
			continue
		}
		if _, err := attachment.FreeHost(o, links); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
