package daemon

// Repair at once: podnet-routed listens to the kernel's nftables change
// notifications (netlink group NFNLGRP_NFTABLES) in its netns, and when a
// table podnet owns is touched by a change that may have weakened it, it
// checks that table without waiting for the resync: the tunnel filter and
// masquerade table (inet podnet), the plugins' pod filter (podnet-pods,
// every family) and, through OnNFTChange, whatever else hooks in (the
// NetworkPolicy engine's inet and bridge podnet-policy).
//
// Which changes: any deletion (table, chain, rule, set, element, object;
// `nft flush ruleset` deletes tables), and any new table, chain, rule or
// set (an inserted or edited rule, a chain's policy changed). New set
// elements only in podnet-policy, where only podnet-routed writes (an
// element added there can open a pod to a peer, and the engine reads its
// table back only every tenth resync when nothing was notified); not in
// the other tables, nor the routed mode's per-port L2 chains: the plugins
// add those at every ADD. Transactions podnet-routed committed on its lasting
// sockets (internal/nftutil.Conn: the policy tables) are left out: it
// wrote what it wanted. Bursts are debounced.

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
	"github.com/podnet/podnet/internal/nftutil"
)

// nftDebounce gathers a burst of notifications (a whole-table write is
// dozens) into one check.
const nftDebounce = 100 * time.Millisecond

// OnNFTChange calls f (from the monitor's goroutine, debounced) whenever
// someone may have changed table inet podnet-policy (deleted anything in
// it, the table itself included, or added a chain, rule or set: its
// owner's own writes too). Set it before Run.
func (d *Daemon) OnNFTChange(f func()) *Daemon {
	d.onNFTChange = append(d.onNFTChange, f)
	return d
}

// ownNFTTable tells whether family/table is one of podnet's tables.
func ownNFTTable(family byte, table string) bool {
	switch {
	case contract.IsPodFilterL2Table(table):
		return family == unix.NFPROTO_NETDEV
	}
	switch table {
	case contract.PodFilterTable:
		return family == unix.NFPROTO_INET || family == unix.NFPROTO_BRIDGE || family == unix.NFPROTO_NETDEV
	case contract.NFTable:
		return family == unix.NFPROTO_INET
	case "podnet-policy": // inet, and bridge for podnet-bridge's ports
		return family == unix.NFPROTO_INET || family == unix.NFPROTO_BRIDGE
	}
	return false
}

// Which of podnet's tables a notification concerns.
const (
	nftTunnel    = 1 << iota // inet podnet
	nftPodFilter             // podnet-pods, every family
	nftOther                 // inet and bridge podnet-policy
	nftAll       = nftTunnel | nftPodFilter | nftOther
)

// nftChangeMatters reads one notification: which of podnet's tables it
// may have weakened (0: none).
func nftChangeMatters(m netlink.Message) int {
	if int(m.Header.Type)>>8 != unix.NFNL_SUBSYS_NFTABLES || len(m.Data) < 4 {
		return 0
	}
	typ := int(m.Header.Type) & 0xff
	switch typ {
	case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE, unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN,
		unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE, unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET,
		unix.NFT_MSG_DELSETELEM, unix.NFT_MSG_DELOBJ, unix.NFT_MSG_NEWOBJ, unix.NFT_MSG_NEWSETELEM:
	default: // generations
		return 0
	}
	family := m.Data[0]
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return 0
	}
	table, chain := "", ""
	for ad.Next() {
		switch {
		case ad.Type() == 1: // NFTA_{TABLE_NAME,CHAIN_TABLE,RULE_TABLE,SET_TABLE,SET_ELEM_LIST_TABLE,OBJ_TABLE}
			table = ad.String()
		case (typ == unix.NFT_MSG_NEWCHAIN || typ == unix.NFT_MSG_DELCHAIN) && ad.Type() == unix.NFTA_CHAIN_NAME,
			(typ == unix.NFT_MSG_NEWRULE || typ == unix.NFT_MSG_DELRULE) && ad.Type() == unix.NFTA_RULE_CHAIN:
			chain = ad.String()
		}
	}
	if !ownNFTTable(family, table) {
		return 0
	}
	if typ == unix.NFT_MSG_NEWSETELEM && table != "podnet-policy" {
		return 0 // the plugins' at every ADD (the pod filter)
	}
	if contract.IsPodFilterL2Table(table) {
		table = contract.PodFilterTable // one of the routed mode's L2 tables
	}
	switch table {
	case contract.NFTable:
		return nftTunnel
	case contract.PodFilterTable:
		// the routed mode's per-port L2 chains: ADD adds them, Prune
		// deletes them
		if family == unix.NFPROTO_NETDEV && strings.HasPrefix(chain, "port-") && typ != unix.NFT_MSG_DELRULE {
			return 0
		}
		return nftPodFilter
	}
	return nftOther
}

// watchNFT runs until ctx ends: a change that matters (or lost
// notifications) leads, debounced, to nftChanged for the tables it
// concerns.
func (d *Daemon) watchNFT(ctx context.Context) {
	kick := make(chan struct{}, 1)
	var pending atomic.Int32
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-kick:
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(nftDebounce):
			}
			select { // what came during the wait is covered
			case <-kick:
			default:
			}
			d.nftChanged(int(pending.Swap(0)))
		}
	}()
	signal := func(which int) {
		for {
			old := pending.Load()
			if pending.CompareAndSwap(old, old|int32(which)) {
				break
			}
		}
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	for ctx.Err() == nil {
		err := d.listenNFT(ctx, signal)
		if ctx.Err() != nil {
			return
		}
		d.log.Warn("nftables change notifications lost; listening again (the resync repairs meanwhile)", "err", err)
		signal(nftAll)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
		// and once more for what changed while nobody listened: the
		// check comes nftDebounce after this, when listening again
		signal(nftAll)
	}
}

// listenNFT reads the notifications of others' transactions until an
// error.
func (d *Daemon) listenNFT(ctx context.Context, signal func(int)) error {
	return nftutil.Watch(ctx, func(txn []netlink.Message) {
		if txn == nil { // overflowed: anything may have changed
			signal(nftAll)
			return
		}
		which := 0
		for _, m := range txn {
			which |= nftChangeMatters(m)
		}
		if which != 0 {
			signal(which)
		}
	})
}

// nftChanged checks (and repairs) the tables which names.
func (d *Daemon) nftChanged(which int) {
	if which&nftTunnel != 0 {
		if repaired, err := d.table.Verify(); err != nil {
			d.log.Warn("cannot check the nft table", "table", "inet "+contract.NFTable, "err", err)
		} else if repaired {
			d.countRepair(RepairNFTTable, 1, "nft table inet "+contract.NFTable)
		}
	}
	if which&nftPodFilter != 0 {
		d.repairPodFilter()
	}
	if which&nftOther != 0 {
		for _, f := range d.onNFTChange {
			f()
		}
	}
}
