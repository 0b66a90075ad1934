package nftutil

import (
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TestOwnPortNamesTheCommittingSocket: in a throwaway netns, the
// notifications of a transaction committed on a Conn carry that Conn's
// port ID (OwnPort true while it is open, false after Close), and those
// of a transaction committed on another socket do not.
func TestOwnPortNamesTheCommittingSocket(t *testing.T) {
	inScratchNetns(t, func() error {
		mon, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return err
		}
		defer mon.Close()
		if err := mon.JoinGroup(unix.NFNLGRP_NFTABLES); err != nil {
			return err
		}
		// the port ID of the next NEWGEN heard
		nextGen := func() uint32 {
			t.Helper()
			_ = mon.SetReadDeadline(time.Now().Add(5 * time.Second))
			for {
				msgs, err := mon.Receive()
				if err != nil {
					t.Fatalf("no NEWGEN heard: %v", err)
				}
				for _, m := range msgs {
					if int(m.Header.Type)&0xff == unix.NFT_MSG_NEWGEN {
						return m.Header.PID
					}
				}
			}
		}
		var own Conn
		c, err := own.Open()
		if err != nil {
			return err
		}
		c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "own"})
		if err := c.Flush(); err != nil {
			return err
		}
		if p := nextGen(); !OwnPort(p) || p != own.port {
			t.Errorf("own transaction's port %d: OwnPort %v (the Conn's port is %d)", p, OwnPort(p), own.port)
		}
		other, err := nftables.New()
		if err != nil {
			return err
		}
		other.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "other"})
		if err := other.Flush(); err != nil {
			return err
		}
		if p := nextGen(); OwnPort(p) {
			t.Errorf("another socket's transaction (port %d) taken for the Conn's own", p)
		}
		port := own.port
		own.Close()
		if OwnPort(port) {
			t.Errorf("port %d still own after Close", port)
		}
		return nil
	})
}
