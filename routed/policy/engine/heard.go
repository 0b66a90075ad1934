// The host veths as the kernel's link notifications describe them, for
// the ADD-time wait: a lookup by name is a netlink request that takes the
// RTNL lock, and on a node starting pods it queues there behind every
// other pod's veth, address and route setup (up to 18 ms at the 99th
// percentile with 8 ADDs at a time on 2 CPUs). By the time a plugin
// asks, the notifications of its host veth (created, alias set, up,
// enslaved) are already in podnet-routed's socket.

package engine

import (
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
)

// heardLinks are the host veths the notifications told of, by name and
// by index (to drop a renamed link's old name). The zero value is empty.
type heardLinks struct {
	mu      sync.Mutex
	byName  map[string]portLink
	byIndex map[int]string
}

// HostVethUpdate records a link notification of the node's netns: a host
// veth in service (its alias podnet's, not detached) is what the wait
// naming it finds; one deleted, detached or renamed is forgotten. Other
// links are left alone. podnet-routed's link watch calls it.
func (e *Engine) HostVethUpdate(u netlink.LinkUpdate) {
	if u.Link == nil {
		return
	}
	a := u.Link.Attrs()
	h := &e.heard
	h.mu.Lock()
	defer h.mu.Unlock()
	if old, ok := h.byIndex[a.Index]; ok && (old != a.Name || u.Header.Type == unix.RTM_DELLINK) {
		delete(h.byName, old)
		delete(h.byIndex, a.Index)
	}
	if u.Header.Type == unix.RTM_DELLINK || !contract.IsHostVeth(a.Name) {
		return
	}
	pl, ok := portOf(u.Link)
	if !ok {
		delete(h.byName, a.Name)
		delete(h.byIndex, a.Index)
		return
	}
	if h.byName == nil {
		h.byName, h.byIndex = map[string]portLink{}, map[int]string{}
	}
	h.byName[a.Name], h.byIndex[a.Index] = pl, a.Name
}

// HostVethsLost forgets every link heard of: notifications may have been
// lost (a new subscription, an overflow), and the waits ask the kernel
// until new ones come.
func (e *Engine) HostVethsLost() {
	h := &e.heard
	h.mu.Lock()
	h.byName, h.byIndex = nil, nil
	h.mu.Unlock()
}

// hostVeth is the port the wait names: as heard, else as the kernel
// says when asked.
func (e *Engine) hostVeth(name string) (portLink, bool) {
	h := &e.heard
	h.mu.Lock()
	pl, ok := h.byName[name]
	h.mu.Unlock()
	if ok {
		return pl, true
	}
	return e.lookupLink(name)
}
