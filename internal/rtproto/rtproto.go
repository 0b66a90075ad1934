// Package rtproto holds the route protocol number that marks every route
// podnet installs, so that podnet only ever modifies or deletes its own routes.
package rtproto

import "github.com/vishvananda/netlink"

// Podnet is the rtm_protocol value of every podnet route ("proto 77" in
// `ip route`). Values 0-4 belong to the kernel, boot and static routes; the
// numbers used by well-known routing daemons (bird 12, zebra 11, Calico 80,
// bgp 186, ...) are avoided.
const Podnet netlink.RouteProtocol = 77
