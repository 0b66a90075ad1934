// Cleanup: what podnet-routed leaves behind when it is uninstalled.

package dataplane

import (
	"errors"
	"fmt"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/routed/desired"
)

// Cleanup removes every route podnet-routed owns (pods' host routes stay:
// they are the plugin's) and the VXLAN device. tunl0 is left (it is the
// kernel's shared fallback device).
func Cleanup() error {
	var errs []error
	if _, _, err := ApplyRoutes(nil, nil, true); err != nil {
		errs = append(errs, err)
	}
	if l, err := netlinksafe.LinkByName(desired.VXLANDevice); err == nil {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", desired.VXLANDevice, err))
		}
	}
	return errors.Join(errs...)
}
