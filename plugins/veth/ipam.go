package veth

import (
	"context"
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// IPAM runs the verbs of a network's IPAM plugin. ExecIPAM execs the
// plugin binary found in CNI_PATH, as the CNI spec describes.
// Each verb gets the plugin's own CmdArgs: the IPAM plugin sees the same
// config and CNI environment as the plugin that delegates to it.
type IPAM interface {
	Add(ctx context.Context, pluginType string, args *skel.CmdArgs) (types.Result, error)
	Del(ctx context.Context, pluginType string, args *skel.CmdArgs) error
	Check(ctx context.Context, pluginType string, args *skel.CmdArgs) error
	GC(ctx context.Context, pluginType string, args *skel.CmdArgs) error
	Status(ctx context.Context, pluginType string, args *skel.CmdArgs) error
}

// ExecIPAM delegates to the IPAM binary named by ipam.type (the CNI_*
// environment is inherited by the child).
type ExecIPAM struct{}

func (ExecIPAM) Add(ctx context.Context, t string, a *skel.CmdArgs) (types.Result, error) {
	return delegateAdd(ctx, t, a.StdinData)
}
func (ExecIPAM) Del(ctx context.Context, t string, a *skel.CmdArgs) error {
	_, err := delegate(ctx, t, "DEL", a.StdinData)
	return err
}
func (ExecIPAM) Check(ctx context.Context, t string, a *skel.CmdArgs) error {
	_, err := delegate(ctx, t, "CHECK", a.StdinData)
	return err
}
func (ExecIPAM) GC(ctx context.Context, t string, a *skel.CmdArgs) error {
	_, err := delegate(ctx, t, "GC", a.StdinData)
	return err
}
func (ExecIPAM) Status(ctx context.Context, t string, a *skel.CmdArgs) error {
	_, err := delegate(ctx, t, "STATUS", a.StdinData)
	return err
}

// IPAMError turns an IPAM plugin failure into a CNI error that names the
// plugin and verb. The IPAM plugin's own code is kept when it is a specific
// one; otherwise fallback is used (11 for ADD/DEL, 50 for STATUS).
func IPAMError(verb, pluginType string, err error, fallback uint) *types.Error {
	var te *types.Error
	if errors.As(err, &te) {
		code := te.Code
		if code == types.ErrUnknown || code == types.ErrInternal {
			code = fallback
		}
		msg := te.Msg
		if te.Details != "" {
			msg += ": " + te.Details
		}
		return types.NewError(code, fmt.Sprintf("IPAM plugin %q %s failed: %s", pluginType, verb, msg), "")
	}
	return types.NewError(fallback, fmt.Sprintf("IPAM plugin %q %s failed: %v", pluginType, verb, err), "")
}
