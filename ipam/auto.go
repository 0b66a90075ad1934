package ipam

import (
	"context"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/podnet/podnet/internal/cnicore"
)

// Auto runs podnet-ipam in-process (saving the start of a second Go process
// per pod) and execs any other IPAM plugin. Results and errors are the same
// as the podnet-ipam binary's.
type Auto struct{}

var _ cnicore.IPAM = Auto{}

// RequestFrom builds a Request from a plugin invocation.
func RequestFrom(a *skel.CmdArgs) Request {
	return Request{Stdin: a.StdinData, ContainerID: a.ContainerID, IfName: a.IfName, Args: a.Args}
}

// Add implements cnicore.IPAM.
func (Auto) Add(ctx context.Context, t string, a *skel.CmdArgs) (types.Result, error) {
	if t != PluginType {
		return cnicore.ExecIPAM{}.Add(ctx, t, a)
	}
	res, err := Add(RequestFrom(a))
	if err != nil {
		return nil, err
	}
	return res, nil
}

// Del implements cnicore.IPAM.
func (Auto) Del(ctx context.Context, t string, a *skel.CmdArgs) error {
	if t != PluginType {
		return cnicore.ExecIPAM{}.Del(ctx, t, a)
	}
	return Del(RequestFrom(a))
}

// Check implements cnicore.IPAM.
func (Auto) Check(ctx context.Context, t string, a *skel.CmdArgs) error {
	if t != PluginType {
		return cnicore.ExecIPAM{}.Check(ctx, t, a)
	}
	return Check(RequestFrom(a))
}

// GC implements cnicore.IPAM.
func (Auto) GC(ctx context.Context, t string, a *skel.CmdArgs) error {
	if t != PluginType {
		return cnicore.ExecIPAM{}.GC(ctx, t, a)
	}
	return GC(RequestFrom(a))
}

// Status implements cnicore.IPAM.
func (Auto) Status(ctx context.Context, t string, a *skel.CmdArgs) error {
	if t != PluginType {
		return cnicore.ExecIPAM{}.Status(ctx, t, a)
	}
	return Status(RequestFrom(a))
}
