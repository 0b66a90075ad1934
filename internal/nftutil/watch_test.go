package nftutil

import (
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TestTxnReaderLeavesOwnOut: a transaction's notifications are handed
// over at its NFT_MSG_NEWGEN, and not at all when one of this process's
// own sockets committed it (the header's port ID says which socket); a
// transaction too large to keep is reported as one (nil), an own one
// still not at all.
func TestTxnReaderLeavesOwnOut(t *testing.T) {
	msg := func(typ int, port uint32) netlink.Message {
		return netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ), PID: port},
			Data: []byte{unix.NFPROTO_INET, 0, 0, 0}}
	}
	const own, nft = 4242, 99
	r := txnReader{own: func(p uint32) bool { return p == own }}
	feed := func(ms ...netlink.Message) (got []netlink.Message, handed int) {
		for i, m := range ms {
			txn, ok := r.feed(m)
			if ok && i != len(ms)-1 {
				t.Fatalf("handed over before the transaction's end (message %d)", i)
			}
			if ok {
				got, handed = txn, handed+1
			}
		}
		return got, handed
	}
	if _, n := feed(msg(unix.NFT_MSG_DELTABLE, own), msg(unix.NFT_MSG_DELRULE, own), msg(unix.NFT_MSG_NEWGEN, own)); n != 0 {
		t.Errorf("own transaction handed over")
	}
	if got, n := feed(msg(unix.NFT_MSG_DELTABLE, nft), msg(unix.NFT_MSG_DELRULE, nft), msg(unix.NFT_MSG_NEWGEN, nft)); n != 1 || len(got) != 2 {
		t.Errorf("nft's transaction: handed %d times with %d messages, want once with 2", n, len(got))
	}
	// an own transaction's changes do not leak into the next one's
	if _, n := feed(msg(unix.NFT_MSG_DELTABLE, own), msg(unix.NFT_MSG_NEWGEN, own), msg(unix.NFT_MSG_NEWGEN, nft)); n != 0 {
		t.Errorf("an empty transaction after an own one was handed over")
	}
	large := make([]netlink.Message, 0, maxTxnMessages+2)
	for range maxTxnMessages + 1 {
		large = append(large, msg(unix.NFT_MSG_NEWSETELEM, nft))
	}
	if got, n := feed(append(large, msg(unix.NFT_MSG_NEWGEN, nft))...); n != 1 || got != nil {
		t.Errorf("a transaction too large to keep: handed %d times with %d messages, want once as nil", n, len(got))
	}
	for i := range large {
		large[i].Header.PID = own
	}
	if _, n := feed(append(large, msg(unix.NFT_MSG_NEWGEN, own))...); n != 0 {
		t.Errorf("a large own transaction handed over")
	}
	if got, n := feed(msg(unix.NFT_MSG_DELSET, nft), msg(unix.NFT_MSG_NEWGEN, nft)); n != 1 || len(got) != 1 {
		t.Errorf("after a large transaction: handed %d times with %d messages, want once with 1", n, len(got))
	}
}
