package daemon

// Repair at once: podnet-routed listens to the kernel's nftables change
// notifications (netlink group NFNLGRP_NFTABLES) in its netns, and when a
// table podnet owns is touched by a change that may have weakened it, it
// checks that table without waiting for the resync: the tunnel filter and
// masquerade table (inet podnet), the plugins' pod filter (podnet-pods,
// every family) and, through OnNFTChange, whatever else hooks in (the
// NetworkPolicy engine's inet podnet-policy).
//
// Which changes: any deletion (table, chain, rule, set, element, object;
// `nft flush ruleset` deletes tables), and any new table, chain, rule or
// set (an inserted or edited rule, a chain's policy changed). Not new set
// elements and not the routed mode's per-port L2 chains: the plugins add
// those at every ADD. podnet-routed's own writes are heard too; the
// checks they cause find nothing to repair and count nothing (a repair
// counts only what it found missing or changed). Bursts are debounced.

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/contract"
)

// nftDebounce gathers a burst of notifications (a whole-table write is
// dozens) into one check.
const nftDebounce = 100 * time.Millisecond

// OnNFTChange calls f (from the monitor's goroutine, debounced) whenever
// someone may have changed one of podnet's nftables tables. Set it
// before Run.
func (d *Daemon) OnNFTChange(f func()) *Daemon {
	d.onNFTChange = append(d.onNFTChange, f)
	return d
}

// ownNFTTable tells whether family/table is one of podnet's tables.
func ownNFTTable(family byte, table string) bool {
	switch table {
	case contract.PodFilterTable:
		return family == unix.NFPROTO_INET || family == unix.NFPROTO_BRIDGE || family == unix.NFPROTO_NETDEV
	case contract.NFTable, "podnet-policy":
		return family == unix.NFPROTO_INET
	}
	return false
}

// nftChangeMatters reads one notification: whether it may have weakened
// one of podnet's tables.
func nftChangeMatters(m netlink.Message) bool {
	if int(m.Header.Type)>>8 != unix.NFNL_SUBSYS_NFTABLES || len(m.Data) < 4 {
		return false
	}
	typ := int(m.Header.Type) & 0xff
	switch typ {
	case unix.NFT_MSG_NEWSETELEM, unix.NFT_MSG_NEWGEN:
		return false
	case unix.NFT_MSG_NEWTABLE, unix.NFT_MSG_DELTABLE, unix.NFT_MSG_NEWCHAIN, unix.NFT_MSG_DELCHAIN,
		unix.NFT_MSG_NEWRULE, unix.NFT_MSG_DELRULE, unix.NFT_MSG_NEWSET, unix.NFT_MSG_DELSET,
		unix.NFT_MSG_DELSETELEM, unix.NFT_MSG_DELOBJ, unix.NFT_MSG_NEWOBJ:
	default:
		return false
	}
	family := m.Data[0]
	ad, err := netlink.NewAttributeDecoder(m.Data[4:])
	if err != nil {
		return false
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
		return false
	}
	// the routed mode's per-port L2 chains: ADD adds them, Prune deletes them
	if family == unix.NFPROTO_NETDEV && strings.HasPrefix(chain, "port-") && typ != unix.NFT_MSG_DELRULE {
		return false
	}
	return true
}

// watchNFT runs until ctx ends: a change that matters (or lost
// notifications) leads, debounced, to nftChanged.
func (d *Daemon) watchNFT(ctx context.Context) {
	kick := make(chan struct{}, 1)
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
			d.nftChanged()
		}
	}()
	signal := func() {
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
		signal()
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// listenNFT subscribes and reads notifications until an error.
func (d *Daemon) listenNFT(ctx context.Context, signal func()) error {
	conn, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
		return err
	}
	_ = conn.SetReadBuffer(4 << 20)
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Now()) })
	defer stop()
	for {
		msgs, err := conn.Receive()
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) { // overflowed: something changed
				signal()
				continue
			}
			return err
		}
		for _, m := range msgs {
			if nftChangeMatters(m) {
				signal()
				break
			}
		}
	}
}

// nftChanged checks (and repairs) podnet's tables after a change.
func (d *Daemon) nftChanged() {
	if repaired, err := d.table.Verify(); err != nil {
		d.log.Warn("cannot check the nft table", "table", "inet "+contract.NFTable, "err", err)
	} else if repaired {
		d.countRepair(RepairNFTTable, 1, "nft table inet "+contract.NFTable)
	}
	d.repairPodFilter()
	for _, f := range d.onNFTChange {
		f()
	}
}
