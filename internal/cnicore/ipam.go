package cnicore

import (
	"context"
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
)

// IPAM runs the verbs of a network's IPAM plugin. ExecIPAM execs the
// plugin binary found in CNI_PATH, as the CNI spec describes.
type IPAM interface {
	Add(ctx context.Context, pluginType string, stdin []byte) (types.Result, error)
	Del(ctx context.Context, pluginType string, stdin []byte) error
	Check(ctx context.Context, pluginType string, stdin []byte) error
	GC(ctx context.Context, pluginType string, stdin []byte) error
	Status(ctx context.Context, pluginType string, stdin []byte) error
}

// ExecIPAM delegates to the IPAM binary named by ipam.type.
type ExecIPAM struct{}

func (ExecIPAM) Add(ctx context.Context, t string, stdin []byte) (types.Result, error) {
	return invoke.DelegateAdd(ctx, t, stdin, nil)
}
func (ExecIPAM) Del(ctx context.Context, t string, stdin []byte) error {
	return invoke.DelegateDel(ctx, t, stdin, nil)
}
func (ExecIPAM) Check(ctx context.Context, t string, stdin []byte) error {
	return invoke.DelegateCheck(ctx, t, stdin, nil)
}
func (ExecIPAM) GC(ctx context.Context, t string, stdin []byte) error {
	return invoke.DelegateGC(ctx, t, stdin, nil)
}
func (ExecIPAM) Status(ctx context.Context, t string, stdin []byte) error {
	return invoke.DelegateStatus(ctx, t, stdin, nil)
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
