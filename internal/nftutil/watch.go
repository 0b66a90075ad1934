package nftutil

// Change notifications: a daemon that owns tables listens to the kernel's
// nftables notifications (netlink group NFNLGRP_NFTABLES) of its netns to
// repair at once what someone else changed.

import (
	"context"
	"errors"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Watch subscribes to the nftables notifications of the calling thread's
// netns and, until ctx ends or the socket fails, calls f with the
// notifications of each transaction committed by anyone but this
// process's open Conns (OwnPort): its own writes are what it wanted. When
// the socket overflowed (notifications lost: anything may have changed),
// or a transaction had more notifications than it keeps, f gets nil. The kernel sends a transaction's notifications, one per
// object it changed, then one NFT_MSG_NEWGEN, each with the port ID of
// the socket that committed it (the NEWGEN's NFTA_GEN_PROC_PID names a
// thread in the init pid namespace: useless in a container).
func Watch(ctx context.Context, f func(txn []netlink.Message)) error {
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
	t := txnReader{own: OwnPort}
	for {
		msgs, err := conn.Receive()
		if err != nil {
			if errors.Is(err, unix.ENOBUFS) {
				t.pending, t.large = nil, false
				f(nil)
				continue
			}
			return err
		}
		for _, m := range msgs {
			if txn, ok := t.feed(m); ok {
				f(txn)
			}
		}
	}
}

// maxTxnMessages bounds what one transaction's notifications may hold in
// memory (a whole write of a table of 10,000 elements is that many):
// past it, the transaction is reported as an overflow (f(nil)).
const maxTxnMessages = 4096

// txnReader gathers the notifications of one transaction.
type txnReader struct {
	own     func(portid uint32) bool // one of this process's sockets
	pending []netlink.Message
	large   bool // more than maxTxnMessages: only "something changed" is kept
}

// feed reads one notification; at the end of a transaction with changes
// that is not this process's own it returns that transaction's (ok), nil
// for one too large to keep.
func (t *txnReader) feed(m netlink.Message) (txn []netlink.Message, ok bool) {
	if int(m.Header.Type)>>8 != unix.NFNL_SUBSYS_NFTABLES || int(m.Header.Type)&0xff != unix.NFT_MSG_NEWGEN {
		if len(t.pending) < maxTxnMessages {
			t.pending = append(t.pending, m)
		} else {
			t.large = true
		}
		return nil, false
	}
	txn, large := t.pending, t.large
	t.pending, t.large = nil, false
	if len(txn) == 0 || t.own(m.Header.PID) {
		return nil, false
	}
	if large {
		return nil, true
	}
	return txn, true
}
