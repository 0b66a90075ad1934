package main

import (
	"fmt"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/containernetworking/plugins/pkg/ns"
)

// tunnelStats is the tunl0 counters of one node.
type tunnelStats struct{ rxPackets, txPackets, rxBytes, txBytes uint64 }

func linkStats(n ns.NetNS, dev string) (tunnelStats, error) {
	var st tunnelStats
	err := n.Do(func(ns.NetNS) error {
		l, err := netlinksafe.LinkByName(dev)
		if err != nil {
			return err
		}
		s := l.Attrs().Statistics
		if s == nil {
			return fmt.Errorf("%s has no statistics", dev)
		}
		st = tunnelStats{s.RxPackets, s.TxPackets, s.RxBytes, s.TxBytes}
		return nil
	})
	return st, err
}
