package daemon

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// linkRecvBuffer is subscribeLinks's read buffer: the largest datagram the
// kernel sends a netlink listener is a page or two, far below it.
const linkRecvBuffer = 64 << 10

// subscribeLinks is netlink.LinkSubscribeWithOptions with ErrorCallback
// onErr, in the calling thread's netns, reading every notification into
// one buffer of its own. The library's reads allocate a 64 KiB buffer
// each: every link notification (a pod's ADD makes three on the node,
// its DEL two) was 64 KiB of garbage, and during pod churn the daemon's
// collector ran for little else. Each message is copied out (a few
// hundred bytes) before it is decoded, as the decoded link may keep
// slices of it.
//
// As with the library: updates go to ch until done is closed or a read
// fails (onErr is told, unless done was closed; an overflow, ENOBUFS,
// is such a failure: notifications were lost), then ch is closed.
func subscribeLinks(ch chan<- netlink.LinkUpdate, done <-chan struct{}, onErr func(error)) error {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_LINK}); err != nil {
		unix.Close(fd)
		return fmt.Errorf("bind netlink socket to the link group: %w", err)
	}
	f := os.NewFile(uintptr(fd), "netlink-link-subscription") // non-blocking: the runtime's poller
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return fmt.Errorf("netlink socket: %w", err)
	}
	var closed atomic.Bool
	go func() {
		<-done
		closed.Store(true)
		f.Close()
	}()
	go func() {
		defer close(ch)
		buf := make([]byte, linkRecvBuffer)
		fail := func(err error) {
			if !closed.Load() && onErr != nil {
				onErr(err)
			}
		}
		for {
			var n int
			var from unix.Sockaddr
			var rerr error
			err := rc.Read(func(fd uintptr) bool {
				n, from, rerr = unix.Recvfrom(int(fd), buf, 0)
				return !errors.Is(rerr, unix.EAGAIN)
			})
			if err == nil {
				err = rerr
			}
			if err != nil {
				fail(fmt.Errorf("receive link notifications: %w", err))
				return
			}
			if sa, ok := from.(*unix.SockaddrNetlink); !ok || sa.Pid != 0 {
				continue // not the kernel's
			}
			updates, errs := decodeLinkDatagram(buf[:n])
			for _, err := range errs {
				fail(err)
			}
			for _, u := range updates {
				select {
				case ch <- u:
				case <-done:
					return
				}
			}
		}
	}()
	return nil
}

// decodeLinkDatagram decodes the link notifications of one datagram read
// from the link group: every RTM_NEWLINK and RTM_DELLINK that decodes, and
// an error for each part that does not (a datagram that does not parse as
// netlink messages at all yields none). Other message types are skipped.
// Each message is decoded from a copy of its own, as the decoded link may
// keep slices of it and b is read into again.
func decodeLinkDatagram(b []byte) ([]netlink.LinkUpdate, []error) {
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return nil, []error{fmt.Errorf("parse link notification: %w", err)}
	}
	var out []netlink.LinkUpdate
	var errs []error
	for _, m := range msgs {
		if m.Header.Type != unix.RTM_NEWLINK && m.Header.Type != unix.RTM_DELLINK {
			continue
		}
		if len(m.Data) < unix.SizeofIfInfomsg {
			errs = append(errs, fmt.Errorf("short link notification (%d bytes)", len(m.Data)))
			continue
		}
		data := bytes.Clone(m.Data)
		header := unix.NlMsghdr(m.Header)
		link, err := netlink.LinkDeserialize(&header, data)
		if err != nil {
			errs = append(errs, fmt.Errorf("decode link notification: %w", err))
			continue
		}
		out = append(out, netlink.LinkUpdate{IfInfomsg: *nl.DeserializeIfInfomsg(data), Header: header, Link: link})
	}
	return out, errs
}
