// The table's counters: the drops by pod chain and ClusterNetworkPolicy
// rule, and the bridge table's.

package nft

import (
	"maps"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/podnet/podnet/internal/nftutil"
)

// readCounters reads the table's named counters (none without a table).
func readCounters(c *nftables.Conn) (map[string]expr.Counter, error) {
	return nftutil.ReadCounters(c, table())
}

// DropCounters are the packets each pod chain dropped (what no policy of
// the pod allowed), by pod and direction, for the pod chains of the last
// Ruleset written; UnknownDropped is the packets of unknown local pod
// addresses dropped.
func (w *Writer) DropCounters() (pods map[CounterKey]uint64, unknownDropped uint64, err error) {
	w.mu.Lock()
	pods = map[CounterKey]uint64{}
	if !w.ok {
		w.mu.Unlock()
		return pods, 0, nil
	}
	keys := maps.Clone(w.st.counters)
	w.mu.Unlock()
	// read on the resync socket: writes go on meanwhile
	w.rmu.Lock()
	defer w.rmu.Unlock()
	c, err := w.rnft()
	if err != nil {
		return nil, 0, err
	}
	all, err := readCounters(c)
	if err != nil {
		w.rconn.Close()
		return nil, 0, err
	}
	for name, k := range keys {
		pods[k] = all[name].Packets
	}
	return pods, all[CounterUnknown].Packets, nil
}

// BridgeCounters reads the bridge table's counters (bridge.go): packets
// of pod ports the engine did not know yet, of isolated pods' link-local,
// multicast and broadcast traffic, and of bridged traffic dropped because
// br_netfilter is off. A missing table counts 0.
func (w *Writer) BridgeCounters() (unknown, link, unfiltered uint64, err error) {
	w.rmu.Lock()
	defer w.rmu.Unlock()
	c, err := w.rnft()
	if err != nil {
		return 0, 0, 0, err
	}
	all, err := nftutil.ReadCounters(c, bridgeTable())
	if err != nil {
		w.rconn.Close()
		return 0, 0, 0, err
	}
	return all[CounterUnknown].Packets, all[CounterLinkDropped].Packets, all[CounterUnfiltered].Packets, nil
}
