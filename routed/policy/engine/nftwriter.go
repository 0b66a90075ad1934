package engine

import (
	"net/netip"

	"github.com/podnet/podnet/routed/policy"
	"github.com/podnet/podnet/routed/policy/nft"
)

// NFTWriter is the Writer of table inet podnet-policy in the calling
// thread's netns.
type NFTWriter struct {
	W *nft.Writer
	// Unknown, when set, hears the unknown_dropped counter (packets of
	// local pod addresses the engine did not know yet).
	Unknown func(uint64)
	// Bridge, when set, hears the bridge table's counters: isolated
	// pods' link-local, multicast and broadcast packets, and bridged
	// packets dropped because br_netfilter is off.
	Bridge func(link, unfiltered uint64)
	// CT, when set, is the lasting conntrack socket of the scans (nil: a
	// socket per scan).
	CT *nft.Conntrack
}

func (n NFTWriter) Apply(want policy.Ruleset) error { _, err := n.W.Apply(want); return err }

func (n NFTWriter) ApplyDelta(d policy.Delta) error { _, err := n.W.ApplyDelta(d); return err }

func (n NFTWriter) Resync(want policy.Ruleset) (bool, error) { return n.W.Resync(want) }

func (n NFTWriter) Delete() error { return n.W.Delete() }

func (n NFTWriter) DropCounters() (map[DropKey]uint64, error) {
	pods, unknown, err := n.W.DropCounters()
	if err != nil {
		return nil, err
	}
	bUnknown, link, unfiltered, err := n.W.BridgeCounters()
	if err != nil {
		return nil, err
	}
	if n.Unknown != nil {
		n.Unknown(unknown + bUnknown)
	}
	if n.Bridge != nil {
		n.Bridge(link, unfiltered)
	}
	out := make(map[DropKey]uint64, len(pods))
	for k, v := range pods {
		out[DropKey{PodID: k.PodID, PolicyID: k.PolicyID, Rule: k.Rule, Direction: k.Direction}] = v
	}
	return out, nil
}

func (n NFTWriter) RevokeOf(addrs []netip.Addr, allowed func(src, dst netip.Addr, proto uint8, dport uint16) bool) (int, error) {
	if n.CT != nil {
		return n.CT.RevokeOf(addrs, allowed)
	}
	return nft.RevokeOf(addrs, allowed)
}

func (n NFTWriter) Revoke(allowed func(src, dst netip.Addr, proto uint8, dport uint16) bool) (int, error) {
	if n.CT != nil {
		return n.CT.Revoke(allowed)
	}
	return nft.Revoke(allowed)
}
