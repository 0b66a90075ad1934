package nftutil

import (
	"context"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/internal/testns"
)

// TestWatchLeavesOwnTransactionsOut: in a throwaway netns, Watch hands
// over the transaction another socket commits (with its new table) and
// not the one a Conn commits, whose port ID OwnPort knows while it is
// open and forgets at Close.
func TestWatchLeavesOwnTransactionsOut(t *testing.T) {
	n := testns.New(t)
	err := n.Do(func(ns.NetNS) error {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		got := make(chan []netlink.Message, 10)
		go func() {
			_ = n.Do(func(ns.NetNS) error { return Watch(ctx, func(txn []netlink.Message) { got <- txn }) })
		}()
		time.Sleep(200 * time.Millisecond) // subscribed
		var own Conn
		c, err := own.Open()
		if err != nil {
			return err
		}
		c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "own"})
		if err := c.Flush(); err != nil {
			return err
		}
		other, err := nftables.New()
		if err != nil {
			return err
		}
		other.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "other"})
		if err := other.Flush(); err != nil {
			return err
		}
		select {
		case txn := <-got:
			if len(txn) != 1 || int(txn[0].Header.Type)&0xff != unix.NFT_MSG_NEWTABLE || OwnPort(txn[0].Header.PID) {
				t.Errorf("handed over %d notifications (first %+v), want the other socket's new table alone", len(txn), txn)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the other socket's transaction was not handed over")
		}
		select {
		case txn := <-got:
			t.Errorf("a second transaction handed over (the Conn's own?): %+v", txn)
		case <-time.After(300 * time.Millisecond):
		}
		port := own.port
		if !OwnPort(port) {
			t.Errorf("the open Conn's port %d is not OwnPort", port)
		}
		own.Close()
		if OwnPort(port) {
			t.Errorf("port %d still own after Close", port)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
