package daemon

import (
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// TestNFTChangeMatters: which nftables notifications wake the repair, and
// for which table: deletions and new chains, rules, sets of podnet's
// tables do, and new elements of podnet-policy; new elements elsewhere
// (every ADD), the routed mode's per-port L2 chains (ADD, Prune), other
// tables and other families do not.
func TestNFTChangeMatters(t *testing.T) {
	msg := func(typ int, family byte, attrs ...netlink.Attribute) netlink.Message {
		b, err := netlink.MarshalAttributes(attrs)
		if err != nil {
			t.Fatal(err)
		}
		return netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ)},
			Data: append([]byte{family, 0, 0, 0}, b...)}
	}
	table := func(name string) netlink.Attribute { return netlink.Attribute{Type: 1, Data: []byte(name + "\x00")} }
	chain := func(name string) netlink.Attribute {
		return netlink.Attribute{Type: unix.NFTA_CHAIN_NAME, Data: []byte(name + "\x00")}
	}
	for _, c := range []struct {
		name string
		m    netlink.Message
		want int
	}{
		{"inet podnet-pods deleted", msg(unix.NFT_MSG_DELTABLE, unix.NFPROTO_INET, table("podnet-pods")), nftPodFilter},
		{"bridge podnet-pods element deleted", msg(unix.NFT_MSG_DELSETELEM, unix.NFPROTO_BRIDGE, table("podnet-pods")), nftPodFilter},
		{"netdev l2 rule added", msg(unix.NFT_MSG_NEWRULE, unix.NFPROTO_NETDEV, table("podnet-pods-12"), netlink.Attribute{Type: unix.NFTA_RULE_CHAIN, Data: []byte("l2\x00")}), nftPodFilter},
		{"netdev port chain added (ADD)", msg(unix.NFT_MSG_NEWCHAIN, unix.NFPROTO_NETDEV, table("podnet-pods-12"), chain("port-12")), 0},
		{"netdev port chain deleted (Prune)", msg(unix.NFT_MSG_DELCHAIN, unix.NFPROTO_NETDEV, table("podnet-pods-12"), chain("port-12")), 0},
		{"netdev L2 table deleted", msg(unix.NFT_MSG_DELTABLE, unix.NFPROTO_NETDEV, table("podnet-pods-15")), nftPodFilter},
		{"an older podnet's netdev table deleted", msg(unix.NFT_MSG_DELTABLE, unix.NFPROTO_NETDEV, table("podnet-pods")), nftPodFilter},
		{"netdev table past the L2 tables", msg(unix.NFT_MSG_DELTABLE, unix.NFPROTO_NETDEV, table("podnet-pods-16")), 0},
		{"inet table named like an L2 table", msg(unix.NFT_MSG_DELTABLE, unix.NFPROTO_INET, table("podnet-pods-3")), 0},
		{"inet podnet-pods element added (ADD)", msg(unix.NFT_MSG_NEWSETELEM, unix.NFPROTO_INET, table("podnet-pods")), 0},
		{"inet podnet rule deleted", msg(unix.NFT_MSG_DELRULE, unix.NFPROTO_INET, table("podnet")), nftTunnel},
		{"inet podnet-policy deleted", msg(unix.NFT_MSG_DELTABLE, unix.NFPROTO_INET, table("podnet-policy")), nftOther},
		{"inet podnet-policy element added", msg(unix.NFT_MSG_NEWSETELEM, unix.NFPROTO_INET, table("podnet-policy")), nftOther},
		{"bridge podnet-policy element added", msg(unix.NFT_MSG_NEWSETELEM, unix.NFPROTO_BRIDGE, table("podnet-policy")), nftOther},
		{"inet podnet element added", msg(unix.NFT_MSG_NEWSETELEM, unix.NFPROTO_INET, table("podnet")), 0},
		{"ip podnet-policy (another family) element added", msg(unix.NFT_MSG_NEWSETELEM, unix.NFPROTO_IPV4, table("podnet-policy")), 0},
		{"ip podnet (another family) deleted", msg(unix.NFT_MSG_DELTABLE, unix.NFPROTO_IPV4, table("podnet")), 0},
		{"inet filter (not podnet's) deleted", msg(unix.NFT_MSG_DELTABLE, unix.NFPROTO_INET, table("filter")), 0},
		{"a generation", msg(unix.NFT_MSG_NEWGEN, unix.NFPROTO_UNSPEC), 0},
	} {
		if got := nftChangeMatters(c.m); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}
