//go:build bench

package policybench

import (
	"encoding/binary"
	"fmt"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// tableSwitch wakes one table of each family and puts another to sleep
// (NFT_TABLE_F_DORMANT: its base chains leave their hooks), in one
// nf_tables transaction of a node's netns, from this process: a swap
// costs a netlink round trip, not an nft process (25-50 ms), so the
// arms can alternate every few connections. google/nftables always
// writes a table's flags as 0, so the messages are built here.
type tableSwitch struct {
	conn *netlink.Conn
	fams []uint8 // NFPROTO_*
}

// newTableSwitch dials nf_tables in netns for the families fams ("inet",
// "bridge").
func newTableSwitch(netns ns.NetNS, fams []string) (*tableSwitch, error) {
	s := &tableSwitch{}
	for _, f := range fams {
		switch f {
		case "inet":
			s.fams = append(s.fams, unix.NFPROTO_INET)
		case "bridge":
			s.fams = append(s.fams, unix.NFPROTO_BRIDGE)
		default:
			return nil, fmt.Errorf("table family %q", f)
		}
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{NetNS: int(netns.Fd())})
	if err != nil {
		return nil, fmt.Errorf("dial nf_tables in %s: %w", netns.Path(), err)
	}
	s.conn = c
	return s, nil
}

func (s *tableSwitch) Close() error { return s.conn.Close() }

// batchMsg is a batch begin or end message of the nf_tables subsystem.
func batchMsg(typ uint16) netlink.Message {
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(typ), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES},
	}
}

// tableMsg sets the flags of the existing table name of family fam.
func tableMsg(fam uint8, name string, flags uint32) (netlink.Message, error) {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	ae.String(unix.NFTA_TABLE_NAME, name)
	ae.Uint32(unix.NFTA_TABLE_FLAGS, flags)
	attrs, err := ae.Encode()
	if err != nil {
		return netlink.Message{}, err
	}
	return netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWTABLE),
			Flags: netlink.Request | netlink.Acknowledge,
		},
		Data: append([]byte{fam, unix.NFNETLINK_V0, 0, 0}, attrs...),
	}, nil
}

// set makes the tables named on of every family active and those named
// off dormant, atomically.
func (s *tableSwitch) set(on, off string) error {
	msgs := []netlink.Message{batchMsg(unix.NFNL_MSG_BATCH_BEGIN)}
	for _, fam := range s.fams {
		for _, t := range []struct {
			name  string
			flags uint32
		}{{off, unix.NFT_TABLE_F_DORMANT}, {on, 0}} {
			m, err := tableMsg(fam, t.name, t.flags)
			if err != nil {
				return err
			}
			msgs = append(msgs, m)
		}
	}
	msgs = append(msgs, batchMsg(unix.NFNL_MSG_BATCH_END))
	if _, err := s.conn.SendMessages(msgs); err != nil {
		return fmt.Errorf("send table switch: %w", err)
	}
	for acks := 0; acks < len(msgs)-2; {
		got, err := s.conn.Receive()
		if err != nil {
			return fmt.Errorf("table switch %s on, %s off: %w", on, off, err)
		}
		acks += len(got)
	}
	return nil
}
