package ipam

import (
	"context"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/podnet/podnet/plugins/veth"
)

// Auto runs podnet-ipam in-process (saving the start of a second Go process
// per pod) and execs any other IPAM plugin. Results and errors are the same
// as the podnet-ipam binary's.
type Auto struct{}

var _ veth.IPAM = Auto{}

// RequestFrom builds a Request from a plugin invocation.
func RequestFrom(a *skel.CmdArgs) Request {
	return Request{Stdin: a.StdinData, ContainerID: a.ContainerID, IfName: a.IfName, Args: a.Args}
}

// Add implements veth.IPAM.
func (Auto) Add(ctx context.Context, t string, a *skel.CmdArgs) (types.Result, error) {
	if t != PluginType {
		return veth.ExecIPAM{}.Add(ctx, t, a)
	}
	res, err := Add(RequestFrom(a))
	if err != nil {
		return nil, err
	}
	return res, nil
}

// Del implements veth.IPAM.
func (Auto) Del(ctx context.Context, t string, a *skel.CmdArgs) error {
	if t != PluginType {
		return veth.ExecIPAM{}.Del(ctx, t, a)
	}
	return Del(RequestFrom(a))
}

// Check implements veth.IPAM.
func (Auto) Check(ctx context.Context, t string, a *skel.CmdArgs) error {
	if t != PluginType {
		return veth.ExecIPAM{}.Check(ctx, t, a)
	}
	return Check(RequestFrom(a))
}

// GC implements veth.IPAM.
func (Auto) GC(ctx context.Context, t string, a *skel.CmdArgs) error {
	if t != PluginType {
		return veth.ExecIPAM{}.GC(ctx, t, a)
	}
	return GC(RequestFrom(a))
}

// Status implements veth.IPAM.
func (Auto) Status(ctx context.Context, t string, a *skel.CmdArgs) error {
	if t != PluginType {
		return veth.ExecIPAM{}.Status(ctx, t, a)
	}
	return Status(RequestFrom(a))
}
